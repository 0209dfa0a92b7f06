package chunkserver

import (
	"context"
	"sync/atomic"
	"testing"

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
	cli := dial(tlsParty(t, ca, identity.RoleClient, "app"))
	peer := dial(tlsParty(t, ca, identity.RoleChunkserver, "2"))

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
