package raftnet

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
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
		if n := c.CountLog(p, "raft panicked"); n != 0 {
			t.Fatalf("%s: a group panicked (%d):\n%s", p.Name, n, tail(p.Log(), 100))
		}
	}
	checkSurvived(t, c, v, want)
	c.WaitHealthy(60 * time.Second)
	for _, p := range c.CS {
		if code, exited := p.ExitCode(); exited {
			t.Fatalf("%s exited with %d:\n%s", p.Name, code, tail(p.Log(), 100))
		}
	}
}

// checkSurvived fails the test unless every chunkserver still runs, the
// acknowledged data want (at offset 0) reads back unchanged and the volume
// still takes a write.
func checkSurvived(t *testing.T, c *testcluster.Cluster, v *client.Volume, want []byte) {
	t.Helper()
	for _, p := range c.CS {
		if code, exited := p.ExitCode(); exited {
			t.Fatalf("%s exited with %d:\n%s", p.Name, code, tail(p.Log(), 100))
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

// snapStream is a datastore snapshot stream (internal/datastore/snapshot.go,
// version 1) for group of chunk size chunkSize holding one chunk (volume,
// index) with one data record [off, off+n).
func snapStream(group uint64, chunkSize, volume, index, off uint64, n uint32) []byte {
	be := binary.BigEndian
	var b []byte
	b = be.AppendUint32(b, 0x42534e50) // "BSNP"
	b = be.AppendUint32(b, 1)
	b = be.AppendUint64(b, chunkSize)
	b = be.AppendUint64(b, group)
	b = append(b, 'C')
	b = be.AppendUint64(b, volume)
	b = be.AppendUint64(b, index)
	b = be.AppendUint64(b, chunkSize)
	b = append(b, 'D')
	b = be.AppendUint64(b, off)
	b = be.AppendUint32(b, n)
	b = append(b, bytes.Repeat([]byte{0xee}, int(n))...)
	b = append(b, 'E')
	b = be.AppendUint64(b, 1)
	return be.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// TestForgedSnapshotRecordsRefused: an attacker holding a stolen member
// certificate streams snapshots to a real chunkserver whose records do not
// fit the copyset: a chunk of another copyset, a data record past the end
// of the chunk, a stream made for another group. Each stream is refused
// (IO_ERROR at its end), nothing is staged or installed, no process exits,
// and the acknowledged data reads back.
func TestForgedSnapshotRecordsRefused(t *testing.T) {
	const chunk = 1 << 20
	c := testcluster.Start(t, testcluster.Options{Copysets: 4, ChunkSize: chunk})
	vol := c.CreateVolume("v", 16<<20)
	v := c.Open("v", false)
	want := make([]byte, 8<<20)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	if _, err := v.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}

	st := c.Status()
	p := c.CS[0]
	to := c.IDOf(p)
	var g, other uint64
	var from uint64
	var copysets uint32
	for _, cs := range st.Copysets {
		copysets++
		members := cs.GetMembers()
		if i := slices.Index(members, to); i >= 0 && g == 0 {
			g = api.GroupID(cs.GetPoolId(), cs.GetId())
			from = members[(i+1)%len(members)]
		} else if other == 0 {
			other = api.GroupID(cs.GetPoolId(), cs.GetId())
		}
	}
	if g == 0 || other == 0 {
		t.Fatalf("no copyset of %s and another in %v", p.Name, st.Copysets)
	}
	_, self := api.SplitGroupID(g)
	var inside, outside uint64 // chunk indexes of the volume in g and not in it
	for i := uint64(0); i < 64; i++ {
		if api.CopysetOf(vol.Id, i, copysets) == self {
			inside = i
		} else {
			outside = i
		}
	}

	stolen := c.Identity(identity.RoleChunkserver, strconv.FormatUint(from, 10))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := transport.Dial(ctx, p.Addr, transport.ConnConfig{Security: transport.Security{
		Mode: transport.ModeAuthenticated, ClientTLS: stolen.ClientTLS(identity.RoleChunkserver)}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	do := func(h api.Header, payload []byte) api.Status {
		h.Op, h.Hint = api.OpSnapshot, from
		call := &transport.Call{Header: h, Payload: payload}
		if err := conn.Do(ctx, call); err != nil {
			t.Fatal(err)
		}
		return call.Reply.Status
	}
	for k, tc := range []struct {
		name   string
		stream []byte
		log    string
	}{
		{"a chunk of another copyset", snapStream(g, chunk, vol.Id, outside, 0, 4096), "belongs to another copyset"},
		{"a data record past the chunk's end", snapStream(g, chunk, vol.Id, inside, chunk-100, 4096), "bad data record"},
		{"a stream of another group", snapStream(other, chunk, vol.Id, inside, 0, 4096), "a snapshot of copyset"},
	} {
		idx, term := uint64(1)<<40, uint64(1)<<40
		m := forged(raftpb.MsgSnap, from, to, term, func(m *raftpb.Message) {
			m.Snapshot = &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: &idx, Term: &term}}
		})
		begin, err := appendRecord(nil, raftstore.Message{Group: g, Msg: m})
		if err != nil {
			t.Fatal(err)
		}
		id := uint64(1000 + k)
		if st := do(api.Header{Volume: id, Length: snapBegin}, begin); st != api.StatusOK {
			t.Fatalf("%s: begin: %v", tc.name, st)
		}
		// The data frame may be refused already (the receiver stopped
		// reading); the end frame says how the stream ended.
		_ = do(api.Header{Volume: id, Offset: 1, Length: snapData}, tc.stream)
		if st := do(api.Header{Volume: id, Offset: 2, Length: snapEnd}, nil); st == api.StatusOK {
			t.Fatalf("%s: the stream was accepted", tc.name)
		}
		c.Eventually(60*time.Second, tc.name+" logged", func(context.Context) error {
			if c.CountLog(p, tc.log) == 0 {
				return errNotYet(tc.log)
			}
			return nil
		})
	}

	// Nothing staged, no process exited, the data is intact.
	_ = filepath.WalkDir(p.DataDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && (strings.HasPrefix(d.Name(), "staged") || d.Name() == "staging") {
			t.Errorf("%s left behind", path)
		}
		return nil
	})
	checkSurvived(t, c, v, want)
}
