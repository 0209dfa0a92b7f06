package chunkserver

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/capability"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// countingPeers counts the peer frames the handler hands on.
type countingPeers struct{ n atomic.Int64 }

func (p *countingPeers) ServeFrame(rw transport.ReplyWriter, h api.Header, _ []byte) {
	p.n.Add(1)
	if h.Op == api.OpSnapshot {
		h.Status = api.StatusBadRequest
		rw.Reply(h, nil, nil)
	}
}

func (*countingPeers) AllocPayload(api.Header, int) (*[]byte, int) { return nil, 0 }

func tlsParty(t *testing.T, ca *identity.CA, role identity.Role, name string) *identity.Config {
	t.Helper()
	dir := t.TempDir()
	if _, _, err := ca.IssueFiles(dir, "", role, name, identity.IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := identity.Load(dir, identity.Base(role, name))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestHandlerAuthorizesByRole: on an authenticated data plane the real
// handler serves IO to clients, never raft or snapshot frames to them, and
// no IO to a chunkserver identity (peers replicate through raft only).
func TestHandlerAuthorizesByRole(t *testing.T) {
	ca, err := identity.InitCA(t.TempDir(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	peers := &countingPeers{}
	e := newHandlerEnvWith(t, transport.Security{Mode: transport.ModeAuthenticated,
		TLS: tlsParty(t, ca, identity.RoleChunkserver, "1"), Allow: dataRoles}, peers)
	dial := func(who *identity.Config) *transport.Conn {
		c, err := transport.Dial(context.Background(), e.addr, transport.ConnConfig{
			Security: transport.Security{Mode: transport.ModeAuthenticated, TLS: who}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	k, err := capability.NewKey(1, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	mds, _ := capability.NewSigner([]capability.PrivateKey{k})
	e.hd.caps = &capability.Keys{}
	e.hd.caps.Set(mds.Public())
	cli := dial(tlsParty(t, ca, identity.RoleClient, "app"))
	peer := dial(tlsParty(t, ca, identity.RoleChunkserver, "2"))
	token := mds.Sign(capability.Capability{Volume: hVolume, Epoch: hEpoch, Mode: capability.ModeWrite, Expiry: time.Now().Add(time.Minute)})
	for _, c := range []*transport.Conn{cli, peer} {
		if r, _ := e.do(c, api.Header{Op: api.OpAttach, Volume: hVolume}, token); r.Status != api.StatusOK && c == cli {
			t.Fatalf("attach: %v", r.Status)
		}
	}

	data := make([]byte, 4096)
	if r, _ := e.do(cli, ioHdr(api.OpWrite, 0, 4096), data); r.Status != api.StatusOK {
		t.Fatalf("client write: %v", r.Status)
	}
	if r, _ := e.do(peer, ioHdr(api.OpWrite, 0, 4096), data); r.Status != api.StatusDenied {
		t.Fatalf("chunkserver identity's write: %v, want DENIED", r.Status)
	}
	if r, _ := e.do(cli, api.Header{Op: api.OpSnapshot, Volume: 1, Length: 1}, nil); r.Status != api.StatusDenied {
		t.Fatalf("client's snapshot frame: %v, want DENIED", r.Status)
	}
	done := make(chan error, 1)
	cli.SendAsync(api.Header{Op: api.OpRaft, Length: 2}, [][]byte{make([]byte, 16)}, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r, _ := e.do(cli, api.Header{Op: api.OpPing}, nil); r.Status != api.StatusOK {
		t.Fatalf("ping: %v", r.Status)
	}
	if n := peers.n.Load(); n != 0 {
		t.Fatalf("%d peer frames of a client reached the peer transport", n)
	}
	if r, _ := e.do(peer, api.Header{Op: api.OpSnapshot, Volume: 1, Length: 1}, nil); r.Status != api.StatusBadRequest {
		t.Fatalf("chunkserver's snapshot frame: %v, want the peer transport's answer", r.Status)
	}
}

// TestCapabilityRequiredForIO is issue 14's fence attack against the real
// handler on an authenticated data plane: a read carrying epoch 2^64-1, which
// today commits a fence that refuses the volume's writer for good, is refused
// without a capability, with a forged one, and with a genuine one whose
// signed epoch is lower; nothing is fenced and the writer goes on. IO needs a
// capability of the volume, in the right mode, attached to the connection.
func TestCapabilityRequiredForIO(t *testing.T) {
	ca, err := identity.InitCA(t.TempDir(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	e := newHandlerEnvWith(t, transport.Security{Mode: transport.ModeAuthenticated,
		TLS: tlsParty(t, ca, identity.RoleChunkserver, "1"), Allow: dataRoles}, noPeers{})
	newSigner := func() *capability.Signer {
		k, err := capability.NewKey(1, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s, _ := capability.NewSigner([]capability.PrivateKey{k})
		return s
	}
	mds, forger := newSigner(), newSigner()
	e.hd.caps = &capability.Keys{}
	app := tlsParty(t, ca, identity.RoleClient, "app")
	dial := func() *transport.Conn {
		c, err := transport.Dial(context.Background(), e.addr, transport.ConnConfig{
			Security: transport.Security{Mode: transport.ModeAuthenticated, TLS: app}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	attach := func(c *transport.Conn, vol uint64, token []byte) api.Status {
		r, _ := e.do(c, api.Header{Op: api.OpAttach, Volume: vol}, token)
		return r.Status
	}
	exp := time.Now().Add(time.Minute)
	writer := mds.Sign(capability.Capability{Volume: hVolume, Session: 1, Epoch: hEpoch, Mode: capability.ModeWrite, Expiry: exp})
	reader := mds.Sign(capability.Capability{Volume: hVolume, Session: 2, Mode: capability.ModeRead, Expiry: exp})
	forged := forger.Sign(capability.Capability{Volume: hVolume, Session: 3, Epoch: ^uint64(0), Mode: capability.ModeWrite, Expiry: exp})

	w := dial()
	if st := attach(w, hVolume, writer); st != api.StatusBusy {
		t.Fatalf("attach before the MDS's keys are known: %v, want BUSY", st)
	}
	e.hd.caps.Set(mds.Public())
	if st := attach(w, hVolume, writer); st != api.StatusOK {
		t.Fatalf("writer's attach: %v", st)
	}
	data := make([]byte, 4096)
	if r, _ := e.do(w, ioHdr(api.OpWrite, 0, 4096), data); r.Status != api.StatusOK {
		t.Fatalf("writer's write: %v", r.Status)
	}

	m := dial()
	evil := ioHdr(api.OpRead, 0, 4096)
	evil.Epoch = ^uint64(0)
	if r, _ := e.do(m, evil, nil); r.Status != api.StatusDenied {
		t.Fatalf("read at epoch 2^64-1 without a capability: %v, want DENIED", r.Status)
	}
	if st := attach(m, hVolume, forged); st != api.StatusDenied {
		t.Fatalf("forged capability: %v, want DENIED", st)
	}
	if st := attach(m, hVolume+1, reader); st != api.StatusDenied {
		t.Fatalf("capability attached for another volume: %v, want DENIED", st)
	}
	if r, _ := e.do(m, evil, nil); r.Status != api.StatusDenied {
		t.Fatalf("read at epoch 2^64-1 after a forged capability: %v, want DENIED", r.Status)
	}
	if st := attach(m, hVolume, reader); st != api.StatusOK {
		t.Fatalf("reader's attach: %v", st)
	}
	if r, _ := e.do(m, evil, nil); r.Status != api.StatusDenied {
		t.Fatalf("read at an epoch above the signed one: %v, want DENIED", r.Status)
	}
	ro := ioHdr(api.OpRead, 0, 4096)
	ro.Epoch = 0
	if r, _ := e.do(m, ro, nil); r.Status != api.StatusOK {
		t.Fatalf("reader's read: %v", r.Status)
	}
	if r, _ := e.do(m, ioHdr(api.OpWrite, 0, 4096), data); r.Status != api.StatusDenied {
		t.Fatalf("write under a read capability: %v, want DENIED", r.Status)
	}
	// Nothing was fenced: the writer goes on.
	g := api.GroupID(hPool, csOf(hVolume, 0))
	if ep := e.host.replicas[g].sm.epochOf(hVolume); ep > hEpoch {
		t.Fatalf("volume fenced at epoch %d", ep)
	}
	if r, _ := e.do(w, ioHdr(api.OpWrite, 0, 4096), data); r.Status != api.StatusOK {
		t.Fatalf("writer after the attack: %v", r.Status)
	}
}
