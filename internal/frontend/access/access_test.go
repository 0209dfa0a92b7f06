package access_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// A node started against a real cluster serves a volume over NBD on TCP and a
// Unix socket, to nbdinfo; after Close it serves nothing.
func TestStartServesNBD(t *testing.T) {
	testutil.RequireTool(t, "nbdinfo")
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	c.CreateVolume("vol", 96<<20)
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	id := c.Identity(identity.RoleAccess, "access-test")
	node, err := access.Start(access.Config{
		MDS:     []string{c.MDSAddr},
		MDSTLS:  id.ClientTLS(identity.RoleMDS),
		DataTLS: id.ClientTLS(identity.RoleChunkserver),
		NBD:     access.NBDConfig{Listen: "127.0.0.1:0", Socket: sock},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if n := len(node.Addrs()); n != 2 {
		t.Fatalf("%d addresses, want TCP and Unix", n)
	}
	uris := []string{"nbd://" + node.Addrs()[0].String() + "/vol", "nbd+unix:///vol?socket=" + sock}
	for _, uri := range uris {
		out, err := exec.Command("nbdinfo", "--size", uri).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "100663296" {
			t.Fatalf("nbdinfo --size %s: %v: %s", uri, err, out)
		}
	}
	if err := node.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if out, err := exec.Command("nbdinfo", "--size", uris[1]).CombinedOutput(); err == nil {
		t.Fatalf("nbdinfo still works after Close: %s", out)
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := access.Start(access.Config{MDS: []string{"127.0.0.1:1"}}); !errors.Is(err, access.ErrNothingToServe) {
		t.Fatalf("start with no front end: %v, want ErrNothingToServe", err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = access.Start(access.Config{MDS: []string{"127.0.0.1:1"}, NBD: access.NBDConfig{Listen: busy.Addr().String()}})
	if err == nil || !strings.Contains(err.Error(), busy.Addr().String()) {
		t.Fatalf("start on a busy port: %v, want an error naming %s", err, busy.Addr())
	}
}

// A Unix socket path another front end serves on, or a file that is not a
// socket, is never taken over; a socket left by a process that died is.
func TestStartKeepsALiveSocket(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := access.Start(access.Config{MDS: []string{"127.0.0.1:1"}, NBD: access.NBDConfig{Socket: live}}); err == nil ||
		!strings.Contains(err.Error(), "already serves") {
		t.Fatalf("start on a socket another process serves: %v, want an error saying so", err)
	}
	if c, err := net.Dial("unix", live); err != nil {
		t.Fatalf("the other process's socket was taken away: %v", err)
	} else {
		c.Close()
	}

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := access.Start(access.Config{MDS: []string{"127.0.0.1:1"}, NBD: access.NBDConfig{Socket: file}}); err == nil {
		t.Fatal("start on a regular file succeeded")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep" {
		t.Fatalf("the regular file was replaced: %q, %v", b, err)
	}

	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	sl.(*net.UnixListener).SetUnlinkOnClose(false) // as if its process died
	sl.Close()
	node, err := access.Start(access.Config{MDS: []string{"127.0.0.1:1"}, NBD: access.NBDConfig{Socket: stale}})
	if err != nil {
		t.Fatalf("start on a stale socket: %v", err)
	}
	node.Close()
}
