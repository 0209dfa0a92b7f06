// Package deploy holds the Kubernetes manifests, the Helm chart and the
// Dockerfile of the CSI driver; its test decodes them strictly with the
// Kubernetes API types and checks that they agree with the driver.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/yaml"

	"github.com/basalt-storage/basalt/internal/csi"
	"github.com/basalt-storage/basalt/internal/testcluster"
)

// newObject returns an empty typed object for apiVersion and kind.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}
	case "v1/Pod":
		return &corev1.Pod{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}
	case "storage.k8s.io/v1/CSIDriver":
		return &storagev1.CSIDriver{}
	case "storage.k8s.io/v1/StorageClass":
		return &storagev1.StorageClass{}
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}
	}
	return nil
}

// objects maps "Kind/name" to the decoded object.
type objects map[string]any

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// decode decodes every document of a multi-document YAML file strictly: an
// unknown field or kind fails the test.
func decode(t *testing.T, name string, data []byte, into objects) {
	t.Helper()
	for i, doc := range docSep.Split(string(data), -1) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s document %d: %v", name, i, err)
		}
		if meta.Kind == "" {
			if strings.TrimSpace(stripComments(doc)) != "" {
				t.Fatalf("%s document %d has no kind", name, i)
			}
			continue
		}
		obj := newObject(meta.APIVersion, meta.Kind)
		if obj == nil {
			t.Fatalf("%s document %d: unexpected %s %s", name, i, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s document %d (%s %s): %v", name, i, meta.Kind, meta.Metadata.Name, err)
		}
		key := meta.Kind + "/" + meta.Metadata.Name
		if _, dup := into[key]; dup {
			t.Fatalf("%s: %s defined twice", name, key)
		}
		into[key] = obj
	}
}

func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func loadDir(t *testing.T, dir string) objects {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	objs := objects{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		decode(t, f, b, objs)
	}
	return objs
}

// renderChart renders the chart's templates with its values.yaml, as
// `helm template --namespace basalt-system` would (helm itself is not
// installed here); the templates use only .Values, .Release, .Chart, if and
// quote.
func renderChart(t *testing.T, dir, namespace string) objects {
	t.Helper()
	return renderChartWith(t, dir, namespace, nil)
}

// renderChartWith is renderChart with values.yaml changed by set first (as
// `helm template --set` would).
func renderChartWith(t *testing.T, dir, namespace string, set func(values map[string]any)) objects {
	t.Helper()
	var values, chart map[string]any
	for name, into := range map[string]*map[string]any{"values.yaml": &values, "Chart.yaml": &chart} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if set != nil {
		set(values)
	}
	data := map[string]any{
		"Values":  values,
		"Release": map[string]any{"Name": "basalt-csi", "Namespace": namespace},
		"Chart":   map[string]any{"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
	}
	funcs := template.FuncMap{"quote": func(v any) string { return strconv.Quote(fmt.Sprint(v)) }}
	files, _ := filepath.Glob(filepath.Join(dir, "templates", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("the chart has no templates")
	}
	objs := objects{}
	for _, f := range files {
		tpl, err := template.New(filepath.Base(f)).Funcs(funcs).Option("missingkey=error").ParseFiles(f)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := tpl.Execute(&out, data); err != nil {
			t.Fatalf("render %s: %v", f, err)
		}
		decode(t, f, out.Bytes(), objs)
	}
	return objs
}

func get[T any](t *testing.T, objs objects, key string) T {
	t.Helper()
	o, ok := objs[key].(T)
	if !ok {
		t.Fatalf("%s is missing", key)
	}
	return o
}

// flagValue returns the value of --name=value in args, "" if absent.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func mountOf(c corev1.Container, volume string) (corev1.VolumeMount, bool) {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m, true
		}
	}
	return corev1.VolumeMount{}, false
}

func hostPath(t *testing.T, spec corev1.PodSpec, volume string) string {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == volume && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	t.Fatalf("no hostPath volume %q", volume)
	return ""
}

var pinnedImage = regexp.MustCompile(`^[a-z0-9.-]+(/[a-z0-9._-]+)+:v?[0-9]+\.[0-9]+\.[0-9]+$`)

// checkDriver checks that a set of objects deploys the driver consistently.
func checkDriver(t *testing.T, objs objects) {
	drv := get[*storagev1.CSIDriver](t, objs, "CSIDriver/"+csi.DriverName)
	if drv.Spec.AttachRequired == nil || !*drv.Spec.AttachRequired {
		t.Error("CSIDriver: attachRequired must be true (ControllerPublish records the attachment and fences)")
	}
	for key, o := range objs {
		if sc, ok := o.(*storagev1.StorageClass); ok {
			if sc.Provisioner != csi.DriverName {
				t.Errorf("%s: provisioner %q, want %q", key, sc.Provisioner, csi.DriverName)
			}
			if err := csi.ValidateParameters(sc.Parameters); err != nil {
				t.Errorf("%s: the driver refuses its parameters: %v", key, err)
			}
		}
		if pvc, ok := o.(*corev1.PersistentVolumeClaim); ok && pvc.Spec.StorageClassName != nil {
			if _, ok := objs["StorageClass/"+*pvc.Spec.StorageClassName]; !ok {
				t.Errorf("%s: StorageClass %q is not defined", key, *pvc.Spec.StorageClassName)
			}
		}
	}

	// Controller: the three sidecars and the plugin share one socket.
	dep := get[*appsv1.Deployment](t, objs, "Deployment/basalt-csi-controller")
	spec := dep.Spec.Template.Spec
	if _, ok := objs["ServiceAccount/"+spec.ServiceAccountName]; !ok {
		t.Errorf("controller: service account %q is not defined", spec.ServiceAccountName)
	}
	plugin := container(t, spec, "basalt-csi")
	checkPlugin(t, "controller", plugin, csi.ModeController)
	checkTLS(t, "controller", spec, plugin)
	sock := strings.TrimPrefix(flagValue(plugin.Args, "endpoint"), "unix://")
	for _, side := range []string{"csi-provisioner", "csi-attacher", "csi-resizer"} {
		c := container(t, spec, side)
		if !strings.HasPrefix(c.Image, "registry.k8s.io/sig-storage/"+side+":v") || !pinnedImage.MatchString(c.Image) {
			t.Errorf("controller %s: image %q is not a pinned registry.k8s.io/sig-storage/%s", side, c.Image, side)
		}
		if got := flagValue(c.Args, "csi-address"); got != sock {
			t.Errorf("controller %s: --csi-address=%q, the plugin serves %q", side, got, sock)
		}
		if got := flagValue(c.Args, "leader-election-namespace"); got != dep.Namespace {
			t.Errorf("controller %s: leader election in %q, the Deployment is in %q", side, got, dep.Namespace)
		}
		sm, ok1 := mountOf(c, "socket-dir")
		pm, ok2 := mountOf(plugin, "socket-dir")
		if !ok1 || !ok2 || sm.MountPath != pm.MountPath || filepath.Dir(sock) != pm.MountPath {
			t.Errorf("controller %s: the socket directory is not shared with the plugin", side)
		}
	}
	if v := flagValue(container(t, spec, "csi-provisioner").Args, "default-fstype"); v != "" && csi.ValidateParameters(map[string]string{csi.ParamFsType: v}) != nil {
		t.Errorf("csi-provisioner --default-fstype=%s: the driver does not make it", v)
	}

	// Node: the registrar tells the kubelet where the plugin's socket is on the host.
	ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet/basalt-csi-node")
	spec = ds.Spec.Template.Spec
	if _, ok := objs["ServiceAccount/"+spec.ServiceAccountName]; !ok {
		t.Errorf("node: service account %q is not defined", spec.ServiceAccountName)
	}
	plugin = container(t, spec, "basalt-csi")
	checkPlugin(t, "node", plugin, csi.ModeNode)
	checkTLS(t, "node", spec, plugin)
	if plugin.SecurityContext == nil || plugin.SecurityContext.Privileged == nil || !*plugin.SecurityContext.Privileged {
		t.Error("node plugin: must be privileged (it attaches devices and mounts)")
	}
	if flagValue(plugin.Args, "node-id") != "$(NODE_ID)" {
		t.Error("node plugin: --node-id is not $(NODE_ID)")
	}
	nodeEnv := false
	for _, e := range plugin.Env {
		if e.Name == "NODE_ID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeEnv = true
		}
	}
	if !nodeEnv {
		t.Error("node plugin: NODE_ID is not the node's name (fieldRef spec.nodeName)")
	}
	reg := container(t, spec, "node-driver-registrar")
	if !strings.HasPrefix(reg.Image, "registry.k8s.io/sig-storage/csi-node-driver-registrar:v") || !pinnedImage.MatchString(reg.Image) {
		t.Errorf("node-driver-registrar: image %q", reg.Image)
	}
	sock = strings.TrimPrefix(flagValue(plugin.Args, "endpoint"), "unix://")
	if got := flagValue(reg.Args, "csi-address"); got != sock {
		t.Errorf("node-driver-registrar: --csi-address=%q, the plugin serves %q", got, sock)
	}
	hostSock := flagValue(reg.Args, "kubelet-registration-path")
	pm, _ := mountOf(plugin, "plugin-dir")
	if want := "/var/lib/kubelet/plugins/" + csi.DriverName + "/csi.sock"; hostSock != want {
		t.Errorf("node-driver-registrar: --kubelet-registration-path=%q, want %q", hostSock, want)
	}
	if hp := hostPath(t, spec, "plugin-dir"); hp != filepath.Dir(hostSock) || pm.MountPath != filepath.Dir(sock) {
		t.Errorf("node: the plugin's socket %s (in %s) is not the host's %s (hostPath %s)", sock, pm.MountPath, hostSock, hp)
	}
	if rm, ok := mountOf(reg, "registration-dir"); !ok || rm.MountPath != "/registration" || hostPath(t, spec, "registration-dir") != "/var/lib/kubelet/plugins_registry" {
		t.Error("node-driver-registrar: the registration directory is not the kubelet's plugins_registry at /registration")
	}
	km, ok := mountOf(plugin, "kubelet-dir")
	if !ok || km.MountPropagation == nil || *km.MountPropagation != corev1.MountPropagationBidirectional || km.MountPath != hostPath(t, spec, "kubelet-dir") {
		t.Error("node plugin: the kubelet directory must be mounted at its host path with Bidirectional propagation")
	}

	// RBAC: every binding binds a defined role to defined service accounts.
	for key, o := range objs {
		var ref rbacv1.RoleRef
		var subjects []rbacv1.Subject
		switch b := o.(type) {
		case *rbacv1.ClusterRoleBinding:
			ref, subjects = b.RoleRef, b.Subjects
		case *rbacv1.RoleBinding:
			ref, subjects = b.RoleRef, b.Subjects
		default:
			continue
		}
		if _, ok := objs[ref.Kind+"/"+ref.Name]; !ok {
			t.Errorf("%s: %s %q is not defined", key, ref.Kind, ref.Name)
		}
		for _, s := range subjects {
			if _, ok := objs["ServiceAccount/"+s.Name]; !ok || s.Kind != "ServiceAccount" {
				t.Errorf("%s: subject %s %q is not a defined service account", key, s.Kind, s.Name)
			}
		}
	}
}

func checkPlugin(t *testing.T, what string, c corev1.Container, mode string) {
	t.Helper()
	if len(c.Args) == 0 || c.Args[0] != "csi" {
		t.Errorf("%s plugin: args %v do not run `basalt csi`", what, c.Args)
	}
	if got := flagValue(c.Args, "mode"); got != mode {
		t.Errorf("%s plugin: --mode=%q, want %q", what, got, mode)
	}
	if got := flagValue(c.Args, "driver-name"); got != csi.DriverName {
		t.Errorf("%s plugin: --driver-name=%q, want %q", what, got, csi.DriverName)
	}
	if !strings.HasPrefix(flagValue(c.Args, "endpoint"), "unix:///") {
		t.Errorf("%s plugin: --endpoint is not a unix:// socket", what)
	}
	if !pinnedImage.MatchString(c.Image) {
		t.Errorf("%s plugin: image %q is not pinned", what, c.Image)
	}
}

// tlsSecret returns the Secret the plugin's --tls-dir is mounted from; the
// test fails when --tls-dir is missing, --insecure is given, or the directory
// is not a read-only mount of a Secret volume.
func tlsSecret(t *testing.T, what string, spec corev1.PodSpec, c corev1.Container) string {
	t.Helper()
	dir := flagValue(c.Args, "tls-dir")
	if dir == "" {
		t.Errorf("%s plugin: no --tls-dir: the cluster is mutually authenticated (docs/security.md)", what)
		return ""
	}
	for _, a := range c.Args {
		if a == "--insecure" || strings.HasPrefix(a, "--insecure=") {
			t.Errorf("%s plugin: --insecure", what)
		}
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s plugin: the TLS directory %s is mounted writable", what, dir)
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName != "" {
				return v.Secret.SecretName
			}
		}
		t.Errorf("%s plugin: the volume %q mounted at --tls-dir=%s is not a Secret", what, m.Name, dir)
		return ""
	}
	t.Errorf("%s plugin: nothing is mounted at --tls-dir=%s", what, dir)
	return ""
}

func checkTLS(t *testing.T, what string, spec corev1.PodSpec, c corev1.Container) {
	t.Helper()
	tlsSecret(t, what, spec, c)
}

// docs/csi.md shows how to create each Secret the manifests mount.
func TestTLSSecretsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "csi.md"))
	if err != nil {
		t.Fatal(err)
	}
	objs := loadDir(t, "kubernetes")
	dep := get[*appsv1.Deployment](t, objs, "Deployment/basalt-csi-controller")
	ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet/basalt-csi-node")
	for what, spec := range map[string]corev1.PodSpec{"controller": dep.Spec.Template.Spec, "node": ds.Spec.Template.Spec} {
		name := tlsSecret(t, what, spec, container(t, spec, "basalt-csi"))
		if name != "" && !strings.Contains(string(doc), "kubectl create secret generic "+name) {
			t.Errorf("docs/csi.md does not show how to create the %s plugin's Secret %s", what, name)
		}
	}
}

func TestManifests(t *testing.T) {
	objs := loadDir(t, "kubernetes")
	examples := loadDir(t, filepath.Join("kubernetes", "examples"))
	for k, v := range examples {
		objs[k] = v
	}
	checkDriver(t, objs)
}

// The chart renders the same objects as deploy/kubernetes (but the
// Namespace, which `helm install --create-namespace` makes, and the second
// StorageClass example).
func TestHelmChart(t *testing.T) {
	plain := loadDir(t, "kubernetes")
	chart := renderChart(t, filepath.Join("helm", "basalt-csi"), "basalt-system")
	chart["Namespace/basalt-system"] = plain["Namespace/basalt-system"]
	checkDriver(t, chart)
	var keys []string
	for k := range chart {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p, ok := plain[k]
		if !ok {
			t.Errorf("the chart renders %s, which deploy/kubernetes does not have", k)
			continue
		}
		if !reflect.DeepEqual(p, chart[k]) {
			pb, _ := yaml.Marshal(p)
			cb, _ := yaml.Marshal(chart[k])
			t.Errorf("%s differs between deploy/kubernetes and the chart:\n--- plain\n%s\n--- chart\n%s", k, pb, cb)
		}
	}
	for k := range plain {
		if _, ok := chart[k]; !ok && k != "StorageClass/basalt-xfs" {
			t.Errorf("deploy/kubernetes has %s, which the chart does not render", k)
		}
	}
	var ch struct {
		AppVersion string `json:"appVersion"`
	}
	b, _ := os.ReadFile(filepath.Join("helm", "basalt-csi", "Chart.yaml"))
	if err := yaml.Unmarshal(b, &ch); err != nil {
		t.Fatal(err)
	}
	dep := get[*appsv1.Deployment](t, chart, "Deployment/basalt-csi-controller")
	if img := container(t, dep.Spec.Template.Spec, "basalt-csi").Image; !strings.HasSuffix(img, ":"+ch.AppVersion) {
		t.Errorf("the chart's appVersion %s is not its image's tag (%s)", ch.AppVersion, img)
	}
}

// The chart's node.nvmfDiscovery reaches the node plugin as the flag that
// makes NVMe/TCP stages multipath, and `basalt csi` has that flag; unset, the
// flag is not given (TestHelmChart: the chart renders deploy/kubernetes).
func TestHelmChartNVMfDiscovery(t *testing.T) {
	const disc = "basalt-access.basalt-system.svc:8009"
	chart := renderChartWith(t, filepath.Join("helm", "basalt-csi"), "basalt-system", func(v map[string]any) {
		v["node"].(map[string]any)["nvmfDiscovery"] = disc
	})
	ds := get[*appsv1.DaemonSet](t, chart, "DaemonSet/basalt-csi-node")
	if got := flagValue(container(t, ds.Spec.Template.Spec, "basalt-csi").Args, "nvmf-discovery"); got != disc {
		t.Fatalf("node plugin --nvmf-discovery=%q, want %q", got, disc)
	}
	help, err := exec.Command(testcluster.Binary(t), "csi", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("basalt csi --help: %v\n%s", err, help)
	}
	if !strings.Contains(string(help), "-nvmf-discovery ") {
		t.Fatal("`basalt csi` has no --nvmf-discovery flag")
	}
}

// Every flag the manifests give `basalt csi` is one it has.
func TestManifestFlagsExist(t *testing.T) {
	bin := testcluster.Binary(t)
	help, err := exec.Command(bin, "csi", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("basalt csi --help: %v\n%s", err, help)
	}
	objs := loadDir(t, "kubernetes")
	for _, key := range []string{"Deployment/basalt-csi-controller", "DaemonSet/basalt-csi-node"} {
		var spec corev1.PodSpec
		switch o := objs[key].(type) {
		case *appsv1.Deployment:
			spec = o.Spec.Template.Spec
		case *appsv1.DaemonSet:
			spec = o.Spec.Template.Spec
		}
		for _, a := range container(t, spec, "basalt-csi").Args[1:] {
			name, _, _ := strings.Cut(a, "=")
			if !strings.Contains(string(help), "  "+name+" ") && !strings.Contains(string(help), ", "+name+" ") {
				t.Errorf("%s: `basalt csi` has no flag %s", key, name)
			}
		}
	}
}
