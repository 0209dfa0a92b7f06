package access_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// A redirector portal in front of two registered access nodes, judged by
// libiscsi: discovery through it lists every target at both nodes' portals
// (multipath); a login through it is sent to one node per target — the same
// node at every login, the targets spread over both — and served there,
// where `basalt iscsi ls` shows the session while it lasts; when that node
// stops, the next login goes to the other.
func TestISCSIRedirector(t *testing.T) {
	testutil.RequireTool(t, "iscsi-inq")
	testutil.RequireTool(t, "iscsi-ls")
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	const nvols = 16 // all on one of two nodes by chance: 1 in 32,768
	for i := range nvols {
		c.CreateVolume(fmt.Sprintf("vol%d", i), 16<<20)
	}
	id := c.Identity(identity.RoleAccess, "access-redirect")
	start := func(name string, cfg access.ISCSIConfig) *access.Node {
		cfg.Listen, cfg.Cluster = "127.0.0.1:0", "c"
		node, err := access.Start(access.Config{
			MDS: strings.Split(c.MDSAddr, ","), MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
			ClientName: name, ISCSI: cfg,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { node.Close() })
		return node
	}
	nodes := []*access.Node{start("an-0", access.ISCSIConfig{Register: true}), start("an-1", access.ISCSIConfig{Register: true})}
	portals := []string{nodes[0].ISCSIPortal().String(), nodes[1].ISCSIPortal().String()}
	redir := start("redirector", access.ISCSIConfig{Redirect: true}).ISCSIPortal().String()

	run := func(name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), "LIBISCSI_DEBUG=2") // libiscsi logs the redirection it follows
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		return string(bytes.TrimSpace(out)), err
	}
	// login logs in to vol's target through the redirector with
	// libiscsi, and returns the portal it was redirected to.
	redirected := regexp.MustCompile(`redirect to ([0-9.:]+)`)
	login := func(vol string) (string, error) {
		out, err := run("iscsi-inq", "-i", "iqn.2026-11.io.basalt.test:redirect",
			"iscsi://"+redir+"/"+iscsi.TargetName("c", vol)+"/0")
		if err != nil {
			return "", fmt.Errorf("iscsi-inq through the redirector: %v: %s", err, tail([]byte(out), 40))
		}
		m := redirected.FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "Peripheral") {
			return "", fmt.Errorf("iscsi-inq was not redirected, or got no INQUIRY data: %s", tail([]byte(out), 40))
		}
		return m[1], nil
	}

	// The nodes register within a heartbeat; until both are online the
	// redirector may list one.
	c.Eventually(60*time.Second, "discovery through the redirector listing both portals", func(context.Context) error {
		out, err := run("iscsi-ls", "-i", "iqn.2026-11.io.basalt.test:redirect", "iscsi://"+redir)
		if err != nil {
			return fmt.Errorf("iscsi-ls: %v: %s", err, tail([]byte(out), 40))
		}
		for i := range nvols {
			for _, p := range portals {
				if want := "Target:" + iscsi.TargetName("c", fmt.Sprintf("vol%d", i)) + " Portal:" + p; !strings.Contains(out, want) {
					return fmt.Errorf("iscsi-ls does not list %q:\n%s", want, tail([]byte(out), 40))
				}
			}
		}
		return nil
	})

	first := map[string]string{}
	used := map[string]int{}
	for i := range nvols {
		vol := fmt.Sprintf("vol%d", i)
		p, err := login(vol)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(portals, p) {
			t.Fatalf("%s: redirected to %s, not to an access node (%v)", vol, p, portals)
		}
		first[vol] = p
		used[p]++
	}
	t.Logf("targets per access node: %v", used)
	if len(used) != 2 {
		t.Errorf("all %d targets were sent to one access node of two: %v", nvols, used)
	}
	// One node per target: the next login to a target goes where the first did.
	for _, vol := range []string{"vol0", "vol1", "vol2"} {
		if p, err := login(vol); err != nil || p != first[vol] {
			t.Errorf("%s: second login went to %s (%v), the first to %s", vol, p, err, first[vol])
		}
	}

	// A session held open (libiscsi's iscsi-perf reading through the
	// redirector) shows in `basalt iscsi ls` at the node it was sent to,
	// and is gone from it once it ends.
	perf := exec.Command("iscsi-perf", "-i", "iqn.2026-11.io.basalt.test:perf", "iscsi://"+redir+"/"+iscsi.TargetName("c", "vol0")+"/0")
	var perfOut bytes.Buffer
	perf.Stdout, perf.Stderr = &perfOut, &perfOut
	if err := perf.Start(); err != nil {
		t.Fatal(err)
	}
	perfDone := make(chan struct{})
	go func() { _ = perf.Wait(); close(perfDone) }()
	t.Cleanup(func() { _ = perf.Process.Kill(); <-perfDone })
	admin := c.Issue(identity.RoleAdmin, "admin")
	ls := func() (string, error) {
		return run(c.Binary, "iscsi", "ls", "--mds", c.MDSAddr, "--tls-dir", c.TLSDir, "--tls-cert", admin)
	}
	// sessionAt reports whether ls shows the perf session at the node
	// whose portal is portal.
	sessionAt := func(out, portal string) bool {
		var id string
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[1] == portal {
				id = f[0]
			}
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); id != "" && len(f) >= 3 && f[0] == id && f[1] == iscsi.TargetName("c", "vol0") &&
				f[2] == "iqn.2026-11.io.basalt.test:perf" {
				return true
			}
		}
		return false
	}
	c.Eventually(60*time.Second, "basalt iscsi ls showing the session at "+first["vol0"], func(context.Context) error {
		select {
		case <-perfDone:
			return fmt.Errorf("iscsi-perf ended: %s", tail(perfOut.Bytes(), 20))
		default:
		}
		out, err := ls()
		if err != nil || !sessionAt(out, first["vol0"]) {
			return fmt.Errorf("basalt iscsi ls: %v:\n%s", err, out)
		}
		t.Logf("basalt iscsi ls:\n%s", out)
		return nil
	})
	_ = perf.Process.Kill()
	<-perfDone
	c.Eventually(60*time.Second, "the ended session gone from basalt iscsi ls", func(context.Context) error {
		out, err := ls()
		if err != nil || sessionAt(out, first["vol0"]) {
			return fmt.Errorf("basalt iscsi ls: %v:\n%s", err, out)
		}
		return nil
	})

	// The node vol0 was sent to stops (its heartbeat still fresh in the
	// MDS): the redirector finds its portal dead and sends the next login
	// to the other, which serves it.
	gone := slices.Index(portals, first["vol0"])
	nodes[gone].Close()
	p, err := login("vol0")
	if err != nil {
		t.Fatalf("a login after the access node %s stopped: %v", portals[gone], err)
	}
	if p != portals[1-gone] {
		t.Errorf("after %s stopped, vol0's login went to %s, want %s", portals[gone], p, portals[1-gone])
	}
}
