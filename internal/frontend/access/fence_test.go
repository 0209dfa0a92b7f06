package access_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/nvmfhost"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// anaInaccessible is the NVMe status ANA Inaccessible (SCT 3h, SC 02h).
const anaInaccessible = 0x302

// TestFencedHostStaysFenced: a volume published (attached in the MDS) to
// node A, whose host NQN is registered, is written by A's host over
// NVMe/TCP; then it is published to node B and B's host writes, taking the
// writer role (A is fenced). A's host reconnects — a new controller, on
// another access node (each node's plugin serves its own kernel) or on the
// one B uses — and writes: refused with ANA Inaccessible and DNR, and it
// fences nobody: B's writes go on and B's data is all there.
func TestFencedHostStaysFenced(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	id := c.Identity(identity.RoleAdmin, "access-fence")
	mdsAddrs := strings.Split(c.MDSAddr, ",")
	mc, err := mdsclient.Dial(mdsAddrs, id.ClientTLS(identity.RoleMDS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const nqnA = "nqn.2014-08.org.nvmexpress:uuid:0000000a-fe0c-4e00-8000-00000000000a"
	const nqnB = "nqn.2014-08.org.nvmexpress:uuid:0000000b-fe0c-4e00-8000-00000000000b"
	for node, nqn := range map[string]string{"node-a": nqnA, "node-b": nqnB} {
		if _, err := mc.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: node, HostNqn: nqn}}); err != nil {
			t.Fatal(err)
		}
	}
	var addrs []string
	for i := range 2 {
		node, err := access.Start(access.Config{
			MDS: mdsAddrs, MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
			ClientName: fmt.Sprintf("access-fence-%d", i),
			NVMf:       access.NVMfConfig{Listen: "127.0.0.1:0"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { node.Close() })
		addrs = append(addrs, node.Addrs()[0].String())
	}
	attach := func(t *testing.T, vol, node string) {
		t.Helper()
		if _, err := mc.AttachVolume(ctx, &api.AttachVolumeRequest{Name: vol, Node: node, Exclusive: true}); err != nil {
			t.Fatal(err)
		}
	}
	connect := func(t *testing.T, addr, vol, nqn string) *nvmfhost.Host {
		t.Helper()
		h, err := nvmfhost.Connect(ctx, addr, nvmf.VolumeNQNPrefix+vol, nvmfhost.Options{HostNQN: nqn})
		if err != nil {
			t.Fatalf("connect to %s as %s: %v", addr, nqn, err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	block := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		var se nvmfhost.StatusError
		if !errors.As(err, &se) || se.Status != anaInaccessible {
			t.Fatalf("%s: %v; want ANA Inaccessible (%#x)", what, err, anaInaccessible)
		}
	}

	for _, tc := range []struct {
		name    string
		againAt int // the access node A's host reconnects to; B's is 1
	}{{"other access node", 0}, {"B's access node", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			vol := "fence-" + strings.NewReplacer(" ", "-", "'", "").Replace(tc.name)
			c.CreateVolume(vol, 16<<20)
			attach(t, vol, "node-a")
			a := connect(t, addrs[0], vol, nqnA)
			if err := a.WriteAt(0, block('a'), 0); err != nil {
				t.Fatalf("A's write while the volume is published to A: %v", err)
			}
			// Published to B: B's host writes and takes the writer role.
			attach(t, vol, "node-b")
			b := connect(t, addrs[1], vol, nqnB)
			if err := b.WriteAt(0, block('b'), 0); err != nil {
				t.Fatalf("B's first write: %v", err)
			}
			refused(t, "A's late write on its old controller", a.WriteAt(0, block('a'), 4096))
			a.Close()

			// A's kernel reconnects: a new controller, A's host NQN.
			again := connect(t, addrs[tc.againAt], vol, nqnA)
			for i := range 3 {
				refused(t, fmt.Sprintf("A's write %d after reconnecting", i+1), again.WriteAt(0, block('a'), 8192))
			}
			got := make([]byte, 4096)
			if err := again.ReadAt(0, got, 0); err != nil || !bytes.Equal(got, block('b')) {
				t.Fatalf("A's read after reconnecting: %v, first byte %q; want B's data", err, got[0])
			}
			// B was not fenced: its writes go on, and its data is all there.
			if err := b.WriteAt(0, block('c'), 12288); err != nil {
				t.Fatalf("B's write after A reconnected: %v", err)
			}
			want := append(append(block('b'), make([]byte, 8192)...), block('c')...)
			got = make([]byte, len(want))
			if err := b.ReadAt(0, got, 0); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("B reads back: %v; data differs from what B wrote", err)
			}
		})
	}
}

// HostMayWrite's rule: no attachment, anyone; else only a host a writable
// attachment names, or anyone when a writable attachment names none of that
// kind (made before MDSs recorded host NQNs, or initiator names).
func TestHostMayWrite(t *testing.T) {
	const a, b = "nqn.2014-08.io.test:a", "nqn.2014-08.io.test:b"
	const ia, ib = "iqn.2026-12.io.test:a", "iqn.2026-12.io.test:b"
	for _, tc := range []struct {
		atts []*api.Attachment
		host string
		want bool
	}{
		{nil, a, true},
		{[]*api.Attachment{{Node: "na", HostNqn: a}}, a, true},
		{[]*api.Attachment{{Node: "nb", HostNqn: b}}, a, false},
		{[]*api.Attachment{{Node: "na", HostNqn: a, ReadOnly: true}, {Node: "nb", HostNqn: b}}, a, false},
		{[]*api.Attachment{{Node: "na", HostNqn: a, ReadOnly: true}}, a, false},
		{[]*api.Attachment{{Node: "nb", HostNqn: b}, {Node: "na", HostNqn: a}}, a, true},
		{[]*api.Attachment{{Node: "old"}}, a, true},
		{[]*api.Attachment{{Node: "old", ReadOnly: true}}, a, false},
	} {
		if got := access.HostMayWrite(&api.Volume{Attachments: tc.atts}, access.NVMeHost, tc.host); got != tc.want {
			t.Errorf("HostMayWrite(%v, NVMe, %s) = %v, want %v", tc.atts, tc.host, got, tc.want)
		}
	}
	for _, tc := range []struct {
		atts []*api.Attachment
		host string
		want bool
	}{
		{nil, ia, true},
		{[]*api.Attachment{{Node: "na", HostNqn: a, InitiatorIqn: ia}}, ia, true},
		{[]*api.Attachment{{Node: "na", InitiatorIqn: ia}}, "IQN.2026-12.IO.TEST:A", true}, // iSCSI names ignore case
		{[]*api.Attachment{{Node: "nb", HostNqn: b, InitiatorIqn: ib}}, ia, false},
		{[]*api.Attachment{{Node: "nb", HostNqn: b, InitiatorIqn: ib}}, a, false}, // an NQN is no initiator name
		{[]*api.Attachment{{Node: "na", InitiatorIqn: ia, ReadOnly: true}, {Node: "nb", InitiatorIqn: ib}}, ia, false},
		{[]*api.Attachment{{Node: "nb", InitiatorIqn: ib}, {Node: "na", InitiatorIqn: ia}}, ia, true},
		{[]*api.Attachment{{Node: "nb", HostNqn: b}}, ia, true}, // B's initiator name unknown
		{[]*api.Attachment{{Node: "old", ReadOnly: true}}, ia, false},
	} {
		if got := access.HostMayWrite(&api.Volume{Attachments: tc.atts}, access.ISCSIInitiator, tc.host); got != tc.want {
			t.Errorf("HostMayWrite(%v, iSCSI, %s) = %v, want %v", tc.atts, tc.host, got, tc.want)
		}
	}
	for _, tc := range []struct {
		atts []*api.Attachment
		node string
		want bool
	}{
		{nil, "na", true},
		{[]*api.Attachment{{Node: "na"}}, "na", true},
		{[]*api.Attachment{{Node: "nb", HostNqn: b, InitiatorIqn: ib}}, "na", false}, // every attachment names its node
		{[]*api.Attachment{{Node: "na", ReadOnly: true}, {Node: "nb"}}, "na", false},
		{[]*api.Attachment{{Node: "nb"}, {Node: "na"}}, "na", true},
		{[]*api.Attachment{{Node: "na", ReadOnly: true}}, "na", false},
	} {
		if got := access.HostMayWrite(&api.Volume{Attachments: tc.atts}, access.CSINode, tc.node); got != tc.want {
			t.Errorf("HostMayWrite(%v, CSI node, %s) = %v, want %v", tc.atts, tc.node, got, tc.want)
		}
	}
}
