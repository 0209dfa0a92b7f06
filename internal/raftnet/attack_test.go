package raftnet

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

func forged(t raftpb.MessageType, from, to, term uint64, edit func(*raftpb.Message)) *raftpb.Message {
	m := &raftpb.Message{Type: &t, From: &from, To: &to, Term: &term}
	if edit != nil {
		edit(m)
	}
	return m
}

// TestForgedRaftFramesDoNotCrashChunkservers is issue 14's raft attack
// against real chunkserver processes: an attacker on the storage network
// connects to each chunkserver's data port and sends OpRaft frames for every
// copyset — a term-0 heartbeat committing past the log (which panicked the
// process), a storage thread's apply response (which panicked a leader), a
// heartbeat of a far later term, a stranger's append in a later term. No
// process exits, every acknowledged write reads back, and new writes go on.
func TestForgedRaftFramesDoNotCrashChunkservers(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Copysets: 4, ChunkSize: 1 << 20})
	c.CreateVolume("v", 16<<20)
	v := c.Open("v", false)
	want := make([]byte, 8<<20)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	if _, err := v.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}

	// The attacker holds a stolen certificate of one member and speaks for
	// it, as raft's From (the receiver drops a message speaking for anyone
	// else; no certificate at all gets no connection): what it sends must
	// reach the guard and be dropped there, never crash a process.
	st := c.Status()
	huge := uint64(1) << 62
	for _, p := range c.CS {
		to := c.IDOf(p)
		var from uint64
		var msgs []raftstore.Message
		for _, cs := range st.Copysets {
			g := api.GroupID(cs.GetPoolId(), cs.GetId())
			members := cs.GetMembers()
			i := slices.Index(members, to)
			if i < 0 {
				continue
			}
			from = members[(i+1)%len(members)] // one attacker per connection: every copyset here has the same three members
			msgs = append(msgs,
				raftstore.Message{Group: g, Msg: forged(raftpb.MsgHeartbeat, from, to, 0, func(m *raftpb.Message) { m.Commit = &huge })},
				raftstore.Message{Group: g, Msg: forged(raftpb.MsgHeartbeat, from, to, 1<<40, func(m *raftpb.Message) { m.Commit = &huge })},
				raftstore.Message{Group: g, Msg: forged(raftpb.MsgStorageApplyResp, from, to, 0, func(m *raftpb.Message) {
					idx, term := huge, uint64(1)
					m.Entries = []*raftpb.Entry{{Index: &idx, Term: &term}}
				})},
				raftstore.Message{Group: g, Msg: forged(raftpb.MsgApp, 999, to, 1<<41, nil)},
			)
		}
		var payload []byte
		for _, m := range msgs {
			var err error
			if payload, err = appendRecord(payload, m); err != nil {
				t.Fatal(err)
			}
		}
		stolen := c.Identity(identity.RoleChunkserver, strconv.FormatUint(from, 10))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := transport.Dial(ctx, p.Addr, transport.ConnConfig{Security: transport.Security{
			Mode: transport.ModeAuthenticated, ClientTLS: stolen.ClientTLS(identity.RoleChunkserver)}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		sent := make(chan error, 1)
		conn.SendAsync(api.Header{Op: api.OpRaft, Length: BatchVersion, Hint: from},
			[][]byte{payload}, func(err error) { sent <- err })
		if err := <-sent; err != nil {
			t.Fatalf("%s: send: %v", p.Name, err)
		}
		_ = conn.Close()
	}

	// Every process stays up (a panic would have ended one by now: poll a while).
	c.Eventually(60*time.Second, "guard logged the forged messages", func(context.Context) error {
		for _, p := range c.CS {
			if c.CountLog(p, "raft message from the network dropped") == 0 {
				return errNotYet(p.Name)
			}
		}
		return nil
	})
	for _, p := range c.CS {
		if code, exited := p.ExitCode(); exited {
			t.Fatalf("%s exited with %d:\n%s", p.Name, code, tail(p.Log(), 100))
		}
		if n := c.CountLog(p, "raft panicked"); n != 0 {
			t.Fatalf("%s: a group panicked (%d):\n%s", p.Name, n, tail(p.Log(), 100))
		}
	}
	got := make([]byte, len(want))
	if _, err := v.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("acknowledged data changed after the attack")
	}
	if _, err := v.WriteAt(want[:1<<20], 8<<20); err != nil {
		t.Fatalf("write after the attack: %v", err)
	}
	c.WaitHealthy(60 * time.Second)
	for _, p := range c.CS {
		if code, exited := p.ExitCode(); exited {
			t.Fatalf("%s exited with %d:\n%s", p.Name, code, tail(p.Log(), 100))
		}
	}
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) + ": not yet" }

func tail(s string, n int) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
