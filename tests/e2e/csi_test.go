package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// startCSI runs `basalt csi --mode all` against the playground's MDS, on a
// Unix socket, with its node plugin attaching through nbdfuse and a loop
// device (this host's kernel has no nbd module); it returns the socket path.
// extra are more flags.
func startCSI(t *testing.T, p *pg, nodeID string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	logPath := filepath.Join(dir, "csi.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testcluster.Binary(t), "csi", "--endpoint", "unix://"+sock, "--mds", p.st.MDS, "--tls-dir", p.st.TLSDir,
		"--mode", "all", "--node-id", nodeID, "--zone", "zone-a", "--state-dir", filepath.Join(dir, "state"), "--attach", "nbdfuse")
	cmd.Args = append(cmd.Args, extra...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("---- basalt csi log (tail) ----\n%s", tailFile(logPath, 100))
		}
	})
	t.Cleanup(func() { releaseUnder(t, dir) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("basalt csi exited:\n%s", tailFile(logPath, 100))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("basalt csi did not listen within 60 s:\n%s", tailFile(logPath, 100))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sock
}

// releaseUnder undoes, best effort, whatever a failed test left attached
// under roots: the file systems mounted there (lazily), the loop devices over
// files there, then the nbdfuse mounts. A passing test leaves nothing (each
// test checks that), so this only keeps a failure from leaking into the next.
func releaseUnder(t *testing.T, roots ...string) {
	t.Helper()
	under := func(p string) bool {
		for _, r := range roots {
			if p == r || strings.HasPrefix(p, r+"/") {
				return true
			}
		}
		return false
	}
	mounts := func(fuse bool) []string {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		var out []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			i := slices.Index(f, "-")
			if len(f) < 5 || i < 0 || i+1 >= len(f) || !under(f[4]) {
				continue
			}
			if strings.HasPrefix(f[i+1], "fuse") == fuse {
				out = append(out, f[4])
			}
		}
		sort.Slice(out, func(a, b int) bool { return len(out[a]) > len(out[b]) })
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, m := range mounts(false) {
		t.Logf("left mounted: %s; unmounting", m)
		_ = exec.CommandContext(ctx, "umount", "-l", m).Run()
	}
	out, _ := exec.CommandContext(ctx, "losetup", "-a").Output()
	for _, line := range strings.Split(string(out), "\n") {
		dev, rest, ok := strings.Cut(line, ":")
		if ok && strings.Contains(rest, "(") && under(rest[strings.Index(rest, "(")+1:strings.LastIndex(rest, ")")]) {
			t.Logf("left attached: %s; detaching", line)
			_ = exec.CommandContext(ctx, "losetup", "-d", dev).Run()
		}
	}
	for _, m := range mounts(true) {
		t.Logf("left mounted: %s; unmounting", m)
		_ = exec.CommandContext(ctx, "umount", "-l", m).Run()
	}
}

func requireKernelAttach(t *testing.T) {
	t.Helper()
	testutil.RequireTools(t, "nbdfuse", "losetup", "mkfs.ext4", "resize2fs", "blkid", "mount", "umount", "fusermount3")
	if os.Geteuid() != 0 {
		t.Skip("skipped: the CSI node plugin mounts file systems and attaches loop devices: needs root")
	}
	for _, dev := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(dev); err != nil {
			t.Skipf("skipped: %s is missing (no FUSE or loop devices here)", dev)
		}
	}
}

// dialCSI connects to the CSI plugin on sock for the rest of the test.
func dialCSI(t *testing.T, sock string) (csi.ControllerClient, csi.NodeClient) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return csi.NewControllerClient(conn), csi.NewNodeClient(conn)
}

// csiVolume is what setupCSIVolume makes.
type csiVolume struct {
	Sock      string // the CSI plugin's socket
	Other     string // a node besides the plugin's own, registered with the MDS ("": none)
	Name      string
	Size      int64
	PublishTo string // the node it is published to ("": not published)
}

// setupCSIVolume is the common start of the tests that move, fence or grow a
// volume: it connects to the plugin, registers the other node, creates the
// volume (ReadWriteOnce, mounted ext4: the returned rwo) and publishes it.
func setupCSIVolume(t *testing.T, ctx context.Context, p *pg, v csiVolume) (ctl csi.ControllerClient, node csi.NodeClient, rwo *csi.VolumeCapability) {
	t.Helper()
	if v.Other != "" {
		mc, err := mdsclient.Dial([]string{p.st.MDS}, adminTLS(t, p.st.TLSDir))
		if err != nil {
			t.Fatal(err)
		}
		defer mc.Close()
		if _, err := mc.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: v.Other}}); err != nil {
			t.Fatal(err)
		}
	}
	ctl, node = dialCSI(t, v.Sock)
	rwo = &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	if _, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: v.Name, CapacityRange: &csi.CapacityRange{RequiredBytes: v.Size},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}}); err != nil {
		t.Fatal(err)
	}
	if v.PublishTo != "" {
		if _, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.Name, NodeId: v.PublishTo, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
	}
	return ctl, node, rwo
}

// csi-sanity, controller and node, against `basalt csi` backed by a
// playground: every volume it stages is a real /dev/loopN over nbdfuse over
// the NBD front end, with a real ext4 on it.
func TestCSISanity(t *testing.T) {
	requireKernelAttach(t)
	p := startPlayground(t, "1GiB")
	// An attach limit of 4: csi-sanity's attach-limit case publishes 4
	// volumes to the node and wants the fifth refused.
	sock := startCSI(t, p, "sanity-node", "--max-volumes", "4")
	dir := t.TempDir()
	t.Cleanup(func() { releaseUnder(t, dir) })
	cfg := sanity.NewTestConfig()
	cfg.Address = sock
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 64 << 20
	cfg.TestVolumeExpandSize = 128 << 20
	cfg.IdempotentCount = 3
	cfg.TestNodeVolumeAttachLimit = true
	// The mutable parameter ControllerModifyVolume takes (a
	// VolumeAttributesClass's): so csi-sanity's ModifyVolume cases run.
	cfg.TestVolumeMutableParameters = map[string]string{"protocol": "nbdfuse"}
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	sanity.Test(t, cfg)
	if t.Failed() {
		return
	}
	// The limit's answer is the spec's: RESOURCE_EXHAUSTED, nothing
	// recorded; an unpublish frees a place.
	attachLimit(t, sock, "sanity-node", 4)
	modifyProtocol(t, sock, "sanity-node")
	// Nothing left behind: no loop device over an nbdfuse file of the
	// plugin's, no mount under the plugin's or the test's directories.
	out, _ := exec.CommandContext(context.Background(), "losetup", "-a").CombinedOutput()
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(out)+string(mounts), "\n") {
		if strings.Contains(line, filepath.Dir(sock)) || strings.Contains(line, dir) {
			t.Errorf("left behind: %s", line)
		}
	}
}

// modifyProtocol: ControllerModifyVolume's protocol (kept in the MDS) reaches
// the node in the next publish's context, where NodeStageVolume takes it over
// the StorageClass's; a bad value is refused and changes nothing.
func modifyProtocol(t *testing.T, sock, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctl, _ := dialCSI(t, sock)
	rwo := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	const vol = "pvc-modified"
	if _, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"protocol": "nbd"}}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: node})
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol}); err != nil {
			t.Errorf("delete %s: %v", vol, err)
		}
	}()
	publish := func() map[string]string {
		t.Helper()
		r, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: node, VolumeCapability: rwo})
		if err != nil {
			t.Fatal(err)
		}
		return r.PublishContext
	}
	if pc := publish(); pc["protocol"] != "" {
		t.Fatalf("publish context before any modify: %v, want no protocol (the StorageClass's holds)", pc)
	}
	for range 2 { // idempotent
		if _, err := ctl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol,
			MutableParameters: map[string]string{"protocol": "iscsi"}}); err != nil {
			t.Fatal(err)
		}
	}
	if pc := publish(); pc["protocol"] != "iscsi" {
		t.Fatalf("publish context after ControllerModifyVolume protocol=iscsi: %v", pc)
	}
	_, err := ctl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol,
		MutableParameters: map[string]string{"protocol": "carrier-pigeon"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("ControllerModifyVolume protocol=carrier-pigeon: %v, want InvalidArgument", err)
	}
	if pc := publish(); pc["protocol"] != "iscsi" {
		t.Fatalf("publish context after a refused modify: %v, want protocol iscsi still", pc)
	}
}

// attachLimit publishes limit volumes to node, then one more: refused with
// ResourceExhausted and not recorded; after one unpublish it goes. It
// deletes what it made.
func attachLimit(t *testing.T, sock, node string, limit int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctl, _ := dialCSI(t, sock)
	rwo := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	var vols []string
	for i := range limit + 1 {
		name := fmt.Sprintf("pvc-limit-%d", i)
		if _, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{rwo}}); err != nil {
			t.Fatal(err)
		}
		vols = append(vols, name)
	}
	defer func() {
		for _, v := range vols {
			_, _ = ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v, NodeId: node})
			if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v}); err != nil {
				t.Errorf("delete %s: %v", v, err)
			}
		}
	}()
	publish := func(v string) error {
		_, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v, NodeId: node, VolumeCapability: rwo})
		return err
	}
	for _, v := range vols[:limit] {
		if err := publish(v); err != nil {
			t.Fatalf("publish %s: %v", v, err)
		}
	}
	if err := publish(vols[limit]); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("publish beyond the node's limit of %d: %v; want ResourceExhausted", limit, err)
	}
	g, err := ctl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: vols[limit]})
	if err != nil || len(g.GetStatus().GetPublishedNodeIds()) != 0 {
		t.Fatalf("the refused volume: published to %v (%v); want none", g.GetStatus().GetPublishedNodeIds(), err)
	}
	if _, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vols[0], NodeId: node}); err != nil {
		t.Fatal(err)
	}
	if err := publish(vols[limit]); err != nil {
		t.Fatalf("publish after an unpublish freed a place: %v", err)
	}
}

// A ReadWriteOnce volume published to node B while node A still holds it
// (A's node died, as Kubernetes sees it): the publish fences A's writer at
// once — A's next write is refused with FENCED although its lease is still
// valid — and B reads what A wrote before.
func TestCSIPublishFencesOldWriter(t *testing.T) {
	requireKernelAttach(t)
	p := startPlayground(t, "1GiB")
	sock := startCSI(t, p, "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const vol = "pvc-fence"
	ctl, _, rwo := setupCSIVolume(t, ctx, p, csiVolume{Sock: sock, Other: "node-b", Name: vol, Size: 64 << 20, PublishTo: "node-a"})
	// Node A's writer (what its kernel's IO becomes through the front end).
	a, err := client.Open(ctx, client.Config{MDS: []string{p.st.MDS}, MDSTLS: adminTLS(t, p.st.TLSDir), DataTLS: adminDataTLS(t, p.st.TLSDir), Volume: vol, ClientName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	want := make([]byte, 1<<20)
	_, _ = rand.Read(want)
	for _, off := range []int64{0, 20 << 20, 40 << 20} {
		if _, err := a.WriteAt(want, off); err != nil {
			t.Fatalf("node A writes at %d: %v", off, err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-b", VolumeCapability: rwo}); err != nil {
		t.Fatalf("publish to node B while A holds the volume: %v", err)
	}
	t.Logf("publish to node B (fencing node A) took %v", time.Since(start))
	if _, err := a.WriteAt(want[:4096], 60<<20); !errors.Is(err, api.ErrFenced) {
		t.Fatalf("node A's write after the publish to B: %v, want FENCED", err)
	}
	g, err := ctl.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: vol})
	if err != nil {
		t.Fatal(err)
	}
	if ids := g.Status.GetPublishedNodeIds(); len(ids) != 1 || ids[0] != "node-b" {
		t.Fatalf("published to %v, want [node-b]", ids)
	}
	b, err := client.Open(ctx, client.Config{MDS: []string{p.st.MDS}, MDSTLS: adminTLS(t, p.st.TLSDir), DataTLS: adminDataTLS(t, p.st.TLSDir), Volume: vol, ClientName: "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make([]byte, len(want))
	for _, off := range []int64{0, 20 << 20, 40 << 20} {
		if _, err := b.ReadAt(got, off); err != nil {
			t.Fatalf("node B reads at %d: %v", off, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("node B reads other data at %d than node A wrote", off)
		}
	}
	if _, err := b.WriteAt(want[:4096], 60<<20); err != nil {
		t.Fatalf("node B writes: %v", err)
	}
	// Unpublished from every node, and with no session left, it can be deleted.
	_ = a.Close()
	_ = b.Close()
	if _, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol}); err != nil {
		t.Fatal(err)
	}
}

// Expansion over nbdfuse + loop, which cannot grow while attached: the
// pod goes, ControllerExpandVolume grows the volume, the next stage attaches
// the bigger device and NodeExpandVolume grows ext4 to it; the file written
// before is intact and the file system sees the new size.
func TestCSIExpand(t *testing.T) {
	requireKernelAttach(t)
	p := startPlayground(t, "1GiB")
	sock := startCSI(t, p, "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const vol = "pvc-grow"
	ctl, node, rwo := setupCSIVolume(t, ctx, p, csiVolume{Sock: sock, Name: vol, Size: 64 << 20})
	dir := t.TempDir()
	t.Cleanup(func() { releaseUnder(t, dir) })
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}
	stage := func() {
		t.Helper()
		if _, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-a", VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
	}
	unstage := func() {
		t.Helper()
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
		if _, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: "node-a"}); err != nil {
			t.Fatal(err)
		}
	}
	fsBytes := func() int64 {
		t.Helper()
		var fs syscall.Statfs_t
		if err := syscall.Statfs(target, &fs); err != nil {
			t.Fatal(err)
		}
		return int64(fs.Blocks) * fs.Bsize
	}
	stage()
	want := make([]byte, 5<<20)
	_, _ = rand.Read(want)
	if err := os.WriteFile(filepath.Join(target, "data"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	before := fsBytes()
	unstage()
	r, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 256 << 20}, VolumeCapability: rwo})
	if err != nil || r.CapacityBytes != 256<<20 || !r.NodeExpansionRequired {
		t.Fatalf("ControllerExpandVolume: %v %v", r, err)
	}
	stage()
	defer unstage()
	if _, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol, VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 256 << 20}, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	after := fsBytes()
	t.Logf("ext4: %d MiB before, %d MiB after the expansion", before>>20, after>>20)
	if before > 64<<20 || after < 200<<20 {
		t.Fatalf("ext4 has %d bytes before and %d after growing the volume from 64 to 256 MiB", before, after)
	}
	got, err := os.ReadFile(filepath.Join(target, "data"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the file written before the expansion: %v (equal: %v)", err, bytes.Equal(got, want))
	}
}
