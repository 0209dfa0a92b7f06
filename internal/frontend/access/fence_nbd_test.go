package access_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// TestFencedNodeStaysFencedNBD: the CSI node plugin's own NBD socket has
// one client, its node's kernel. A volume published (attached in the MDS)
// to node A is written through A's socket; B's socket refuses B's writes
// (EPERM, which QEMU's NBD driver reports as "Operation not permitted")
// and takes no writer role, while B's reads go on. Published to B, B
// writes; A's connection is refused once its answer is refreshed, and A
// connecting again is refused at its first write — the node a pod moved
// away from cannot take the volume back when its kernel reconnects.
func TestFencedNodeStaysFencedNBD(t *testing.T) {
	testutil.RequireTool(t, "qemu-io")
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	id := c.Identity(identity.RoleAdmin, "access-fence-nbd")
	mdsAddrs := strings.Split(c.MDSAddr, ",")
	mc, err := mdsclient.Dial(mdsAddrs, id.ClientTLS(identity.RoleMDS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, node := range []string{"node-a", "node-b"} {
		if _, err := mc.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: node}}); err != nil {
			t.Fatal(err)
		}
	}
	sockets := map[string]string{}
	for _, node := range []string{"node-a", "node-b"} {
		sock := filepath.Join(t.TempDir(), "nbd.sock")
		fe, err := access.Start(access.Config{
			MDS: mdsAddrs, MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
			ClientName: "csi@" + node,
			NBD:        access.NBDConfig{Socket: sock, Node: node},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fe.Close() })
		sockets[node] = sock
	}
	connect := func(node string) *qemuIO {
		t.Helper()
		return runQemuIO(t, ctx, fmt.Sprintf("driver=nbd,server.type=unix,server.path=%s,export=vol", sockets[node]), node)
	}
	refused := func(what, out string) {
		t.Helper()
		if !strings.Contains(out, "write failed: Operation not permitted") {
			t.Fatalf("%s: %s; want the write refused (EPERM: Operation not permitted)", what, out)
		}
	}

	c.CreateVolume("vol", 16<<20)
	publish(t, ctx, mc, "node-a")
	a := connect("node-a")
	wrote(t, "A's write while the volume is published to A", a.do("write -P 0x61 0 4k"))
	b := connect("node-b")
	for i := range 3 {
		refused(fmt.Sprintf("B's write %d while the volume is published to A", i+1), b.do("write -P 0x62 4k 4k"))
	}
	reads(t, "B's read", b.do("read -P 0x61 0 4k"))
	reads(t, "B's read of the block it was refused", b.do("read -P 0 4k 4k"))
	wrote(t, "A's write after B's were refused (A still the writer)", a.do("write -P 0x61 8k 4k"))

	// Published to B: B's next connection writes and takes the writer role.
	publish(t, ctx, mc, "node-b")
	b = connect("node-b")
	wrote(t, "B's write once the volume is published to B", b.do("write -P 0x62 4k 4k"))
	deadline := time.Now().Add(2 * time.Minute)
	for tries := 1; ; tries++ {
		// Fenced by B's epoch first (its backend cannot write), then
		// refused by its refreshed answer.
		out := a.do("write -P 0x61 12k 4k")
		if strings.Contains(out, "wrote") {
			t.Fatalf("A's late write on its old connection was written: %s", out)
		}
		if strings.Contains(out, "Operation not permitted") {
			t.Logf("A's old connection refused at its write %d: %s", tries, strings.TrimSpace(out))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's old connection not refused 2 minutes after the volume was published to B: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	again := connect("node-a")
	refused("A's first write after connecting again", again.do("write -P 0x61 12k 4k"))
	reads(t, "A's read after connecting again", again.do("read -P 0x62 4k 4k"))
	// B is still the writer: nothing A did took the role back.
	wrote(t, "B's write after A's were refused", b.do("write -P 0x62 16k 4k"))
	reads(t, "B's data", b.do("read -P 0x62 4k 4k"))
	reads(t, "A's refused block, still zeros", b.do("read -P 0 12k 4k"))
}
