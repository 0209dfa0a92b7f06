package raftstore

import (
	"errors"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// forge builds a raft message as an attacker would put it on the wire.
func forge(t raftpb.MessageType, from, to, term uint64, edit func(m *raftpb.Message)) *raftpb.Message {
	m := &raftpb.Message{Type: &t, From: &from, To: &to, Term: &term}
	if edit != nil {
		edit(m)
	}
	return m
}

func u64(v uint64) *uint64 { return &v }

func entry(index, term uint64, data string) *raftpb.Entry {
	typ := raftpb.EntryNormal
	return &raftpb.Entry{Index: &index, Term: &term, Type: &typ, Data: propData(data)}
}

// TestForgedRaftMessagesRefused sends the messages of issue 14's attacks
// into real hosts' Step, as the raftnet receiver would deliver them from the
// network: local-only types, term-0 messages, strangers, a heartbeat
// committing past the log, a forwarded proposal. Before the guard, the
// heartbeat panicked the follower (the process), MsgStorageApplyResp panicked
// the leader, and MsgProp wrote "evil" through the leader.
func TestForgedRaftMessagesRefused(t *testing.T) {
	c := newCluster(t, 14, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	lead := c.waitLeader(1)
	if err := c.proposeWait(lead, 1, "a=1"); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(2000)
	st, _ := c.hosts[lead].Status(1)
	term, commit := st.Term, st.Commit
	var fol uint64
	for _, id := range c.ids {
		if id != lead {
			fol = id
			break
		}
	}
	huge := uint64(1) << 62
	attacks := []struct {
		name string
		to   uint64
		m    *raftpb.Message
	}{
		{"term-0 heartbeat with a huge commit", fol, forge(raftpb.MsgHeartbeat, lead, fol, 0, func(m *raftpb.Message) { m.Commit = u64(huge) })},
		{"heartbeat of the current term committing past the log", fol, forge(raftpb.MsgHeartbeat, lead, fol, term, func(m *raftpb.Message) { m.Commit = u64(huge) })},
		{"storage apply response", lead, forge(raftpb.MsgStorageApplyResp, raft.LocalApplyThread, lead, 0, func(m *raftpb.Message) {
			m.Entries = []*raftpb.Entry{entry(huge, term, "x")}
		})},
		{"storage append response", lead, forge(raftpb.MsgStorageAppendResp, raft.LocalAppendThread, lead, 0, func(m *raftpb.Message) {
			m.Index, m.LogTerm = u64(huge), u64(term)
		})},
		{"forwarded proposal", lead, forge(raftpb.MsgProp, fol, lead, 0, func(m *raftpb.Message) {
			m.Entries = []*raftpb.Entry{{Data: propData("evil=1")}}
		})},
		{"stranger's append in a later term", fol, forge(raftpb.MsgApp, 9, fol, term+10, func(m *raftpb.Message) {
			m.Index, m.LogTerm, m.Commit = u64(commit), u64(term), u64(commit)
		})},
		{"stranger's vote request", fol, forge(raftpb.MsgVote, 9, fol, term+10, func(m *raftpb.Message) {
			m.Index, m.LogTerm = u64(huge), u64(term+10)
		})},
		{"acknowledgement past the leader's log", lead, forge(raftpb.MsgAppResp, fol, lead, term, func(m *raftpb.Message) { m.Index = u64(huge) })},
		{"entries out of sequence", fol, forge(raftpb.MsgApp, lead, fol, term, func(m *raftpb.Message) {
			m.Index, m.LogTerm = u64(commit), u64(term)
			m.Entries = []*raftpb.Entry{entry(commit+5, term, "gap=1")}
		})},
		{"another node's message", fol, forge(raftpb.MsgHeartbeat, lead, 77, term, nil)},
		{"hup", fol, forge(raftpb.MsgHup, lead, fol, term, nil)},
	}
	before := c.hosts[lead].Stats().MessagesDropped + c.hosts[fol].Stats().MessagesDropped
	for _, a := range attacks {
		c.hosts[a.to].Step([]Message{{Group: 1, Msg: a.m}})
		c.run(3)
		for _, id := range c.ids {
			st, _ := c.hosts[id].Status(1)
			if !st.Healthy {
				t.Fatalf("%s: node %d stopped the group: %v", a.name, id, st.Err)
			}
			if st.Term > term {
				t.Fatalf("%s: node %d moved to term %d (was %d)", a.name, id, st.Term, term)
			}
		}
	}
	after := c.hosts[lead].Stats().MessagesDropped + c.hosts[fol].Stats().MessagesDropped
	if got := after - before; got < uint64(len(attacks)) {
		t.Errorf("guard dropped %d messages, want at least %d", got, len(attacks))
	}
	// The group still replicates, and nothing forged was applied.
	if err := c.proposeWait(c.waitLeader(1), 1, "b=2"); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(2000)
	for _, id := range c.ids {
		if v, ok := c.sms[id][1].get("evil"); ok {
			t.Fatalf("node %d applied a forged proposal: evil=%s", id, v)
		}
		if v, _ := c.sms[id][1].get("b"); v != "2" {
			t.Fatalf("node %d: b=%q", id, v)
		}
	}
}

// TestRaftPanicStopsOneGroup makes raft itself panic on one host (the guard
// off, a term-0 heartbeat committing past the log) and the state machine
// panic on another: each stops only that group, with ErrRaftPanic in its
// status, and the hosts' other groups keep replicating.
func TestRaftPanicStopsOneGroup(t *testing.T) {
	c := newCluster(t, 15, 3, map[uint64][]uint64{1: {1, 2, 3}, 2: {1, 2, 3}}, nil)
	defer c.stop()
	for _, g := range []uint64{1, 2} {
		if err := c.proposeWait(c.waitLeader(g), g, "a=1"); err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged(2000)
	lead := c.waitLeader(1)
	fol := lead%3 + 1
	c.hosts[fol].noScreen = true
	c.hosts[fol].Step([]Message{{Group: 1, Msg: forge(raftpb.MsgHeartbeat, lead, fol, 0, func(m *raftpb.Message) { m.Commit = u64(1 << 62) })}})
	c.run(3)
	st, _ := c.hosts[fol].Status(1)
	if st.Healthy || !errors.Is(st.Err, ErrRaftPanic) {
		t.Fatalf("node %d group 1 after a raft panic: healthy %v, err %v", fol, st.Healthy, st.Err)
	}
	t.Logf("stopped: %v", st.Err)
	// A proposal on the stopped group gets the error, not a hang.
	var got error
	c.hosts[fol].Propose(1, propData("c=3"), func(err error) { got = err })
	if !errors.Is(got, ErrRaftPanic) {
		t.Fatalf("proposal on the stopped group: %v", got)
	}
	// The state machine of the leader of group 2 panics as it applies "panic:"
	// (a bug there, say); the followers apply the entry.
	lead2 := c.waitLeader(2)
	c.sms[lead2][2].mu.Lock()
	c.sms[lead2][2].panicky = true
	c.sms[lead2][2].mu.Unlock()
	var res error
	called := false
	c.hosts[lead2].Propose(2, propData("panic:now"), func(err error) { res, called = err, true })
	for i := 0; !called; i++ {
		if i > 2000 {
			t.Fatal("proposal never answered")
		}
		c.step()
	}
	if !errors.Is(res, ErrRaftPanic) {
		t.Fatalf("panicking proposal answered %v", res)
	}
	// Groups 1 and 2 go on with the nodes left (a majority each).
	for _, g := range []uint64{1, 2} {
		var err error
		for range 20 {
			var l uint64
			for range 2000 {
				if l = c.leader(g); l != 0 {
					break
				}
				c.step()
			}
			if l == 0 {
				t.Fatalf("group %d: no leader", g)
			}
			if err = c.proposeWait(l, g, "d=4"); err == nil {
				break
			}
			c.run(20)
		}
		if err != nil {
			t.Fatalf("group %d after the panics: %v", g, err)
		}
	}
}

// TestSnapshotOnlyFromTheLeader: a snapshot stream is received (staged) only
// from the leader the replica knows for the stream's term, or from a later
// term's; a member that is not the leader (a stolen member certificate), a
// deposed leader's older term and one sent to the leader itself are refused
// before anything is staged, and the group goes on.
func TestSnapshotOnlyFromTheLeader(t *testing.T) {
	c := newCluster(t, 15, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	lead := c.waitLeader(1)
	if err := c.proposeWait(lead, 1, "a=1"); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(2000)
	st, _ := c.hosts[lead].Status(1)
	term := st.Term
	var fols []uint64
	for _, id := range c.ids {
		if id != lead {
			fols = append(fols, id)
		}
	}
	fol, other := fols[0], fols[1]
	snap := func(from, to, term uint64) *raftpb.Message {
		return forge(raftpb.MsgSnap, from, to, term, func(m *raftpb.Message) {
			idx, tm := uint64(1)<<40, term
			m.Snapshot = &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: &idx, Term: &tm}}
		})
	}
	refused := []struct {
		name string
		to   uint64
		m    *raftpb.Message
	}{
		{"a follower posing as the leader", fol, snap(other, fol, term)},
		{"an older term's leader", fol, snap(lead, fol, term-1)},
		{"to the leader itself", lead, snap(fol, lead, term)},
		{"addressed to another node", fol, snap(lead, other, term)},
		{"term 0", fol, snap(lead, fol, 0)},
	}
	for _, a := range refused {
		err := c.hosts[a.to].ReceiveSnapshot(Message{Group: 1, Msg: a.m}, strings.NewReader(`{"evil":"1"}`))
		if !errors.Is(err, ErrSnapshotRefused) {
			t.Fatalf("%s: ReceiveSnapshot = %v, want ErrSnapshotRefused", a.name, err)
		}
		if sm := c.sms[a.to][1]; sm.stagedSnapshot() != nil {
			t.Fatalf("%s: the stream was staged: %v", a.name, sm.stagedSnapshot())
		}
	}
	c.run(5)
	for _, id := range c.ids {
		if st, _ := c.hosts[id].Status(1); !st.Healthy || st.Term != term {
			t.Fatalf("node %d after the refused streams: healthy %v term %d (was %d)", id, st.Healthy, st.Term, term)
		}
	}
	if err := c.proposeWait(lead, 1, "b=2"); err != nil {
		t.Fatalf("the group after the refused streams: %v", err)
	}
}
