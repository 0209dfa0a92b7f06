package raftnet

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

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

// serveSecure serves h with sec on a loopback listener.
func serveSecure(t *testing.T, sec transport.Security, h transport.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.NewServer(transport.ServerConfig{Logger: testLogger(t), Security: sec}, h)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestPeersSpeakOnlyForThemselves: on an authenticated data plane a raft
// frame counts only from a chunkserver certificate naming the frame's
// sender, and each message only with From equal to it — chunkserver 3 cannot
// forge chunkserver 1's acknowledgements (which made a leader commit a write
// no follower held), and a client certificate sends no raft at all. A
// sender that dials an address now answered by another chunkserver does not
// send to it.
func TestPeersSpeakOnlyForThemselves(t *testing.T) {
	ca, err := identity.InitCA(t.TempDir(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	cs1 := tlsParty(t, ca, identity.RoleChunkserver, "1")
	cs2 := tlsParty(t, ca, identity.RoleChunkserver, "2")
	cs3 := tlsParty(t, ca, identity.RoleChunkserver, "3")
	app := tlsParty(t, ca, identity.RoleClient, "app")
	host := &funcHost{}
	recv := New(Config{Self: 2, Logger: testLogger(t), SnapshotRate: -1}).Receiver(host)
	addr := serveSecure(t, transport.Security{Mode: transport.ModeAuthenticated, TLS: cs2,
		Allow: []identity.Role{identity.RoleChunkserver, identity.RoleClient}}, recv)

	send := func(who *identity.Config, hint uint64, msgs ...*raftpb.Message) {
		t.Helper()
		c, err := transport.Dial(context.Background(), addr, transport.ConnConfig{Logger: testLogger(t),
			Security: transport.Security{Mode: transport.ModeAuthenticated, TLS: who}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var payload []byte
		for _, m := range msgs {
			if payload, err = appendRecord(payload, raftstore.Message{Group: 7, Msg: m}); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan error, 1)
		c.SendAsync(api.Header{Op: api.OpRaft, Length: BatchVersion, Hint: hint}, [][]byte{payload}, func(err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// A ping after it: answered once the frame before it was served.
		if err := c.Do(context.Background(), &transport.Call{Header: api.Header{Op: api.OpPing}}); err != nil {
			t.Fatal(err)
		}
	}
	ack := func(from uint64) *raftpb.Message { return testMsg(raftpb.MsgAppResp, from, 2, 9, "") }
	send(cs3, 1, ack(1))         // claims to be 1
	send(cs3, 3, ack(1), ack(3)) // speaks for 1 beside itself
	send(app, 0, ack(1))         // not a chunkserver
	send(cs1, 1, ack(1))         // honest
	host.mu.Lock()
	got := host.stepped
	host.mu.Unlock()
	if len(got) != 2 || got[0].Msg.GetFrom() != 3 || got[1].Msg.GetFrom() != 1 {
		var from []uint64
		for _, m := range got {
			from = append(from, m.Msg.GetFrom())
		}
		t.Fatalf("stepped messages from %v, want [3 1] (3's own, then 1's)", from)
	}

	// Chunkserver 1 believes 2 is at the address chunkserver 3 serves.
	addr3 := serveSecure(t, transport.Security{Mode: transport.ModeAuthenticated, TLS: cs3,
		Allow: []identity.Role{identity.RoleChunkserver}}, recv)
	tr := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1,
		Security: transport.Security{Mode: transport.ModeAuthenticated, TLS: cs1}})
	defer tr.Close()
	tr.SetPeers(map[uint64]string{2: addr3})
	snap := testMsg(raftpb.MsgSnap, 1, 2, 0, "")
	snap.Snapshot = &raftpb.Snapshot{}
	err = tr.SendSnapshot(raftstore.Message{Group: 7, Msg: snap}, func(io.Writer) error { return nil })
	if !errors.Is(err, ErrWrongPeer) {
		t.Fatalf("snapshot to a chunkserver answered by another: %v, want ErrWrongPeer", err)
	}
}
