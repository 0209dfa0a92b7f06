package access_test

import (
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/access"
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
	node, err := access.Start(access.Config{
		MDS: []string{c.MDSAddr},
		NBD: access.NBDConfig{Listen: "127.0.0.1:0", Socket: sock},
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
