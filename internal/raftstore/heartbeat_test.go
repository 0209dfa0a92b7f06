package raftstore

import (
	"encoding/binary"
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestResumedPeerHeartbeatBacklog replays docs/reliability.md's "Leader
// paused" case deterministically: the leader is paused, the others elect a
// new one, which writes and heartbeats the paused node (in StateProbe) for
// 12 s of ticks; the messages wait in the network. On resume the old leader
// answers every queued heartbeat at once. The new leader's round that takes
// those answers must not read and send the backlog once per answer (before
// the fix: one MsgApp of MaxSizePerMsg per MsgHeartbeatResp, 240 MiB in one
// round, on the worker that holds every group of its batch).
func TestResumedPeerHeartbeatBacklog(t *testing.T) {
	const (
		entrySize = 64 << 10
		entries   = 128 // 8 MiB behind: several MsgApps, more than MaxInflightBytes
	)
	c := newCluster(t, 16, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	old := c.waitLeader(1)
	c.net.paused[old] = true
	var lead uint64
	for i := 0; lead == 0; i++ {
		if i > 2000 {
			c.fatalf("no new leader while %d is paused", old)
		}
		c.step()
		for _, id := range c.ids {
			if st, ok := c.hosts[id].Status(1); ok && id != old && st.IsLeader {
				lead = id
			}
		}
	}
	data := make([]byte, entrySize)
	for i := range entries {
		if err := c.proposeWait(lead, 1, fmt.Sprintf("k%d=%s", i, data)); err != nil {
			t.Fatal(err)
		}
	}
	c.run(100) // 50 more ticks: heartbeats queue up for the paused node
	queued := 0
	for _, p := range c.net.q {
		if p.to == old && p.m.Msg.GetType() == raftpb.MsgHeartbeat {
			queued++
		}
	}
	if queued < 40 {
		t.Fatalf("only %d heartbeats queued for the paused node", queued)
	}

	// Resume: the old leader takes its backlog in one round and answers.
	delete(c.net.paused, old)
	c.net.now++
	c.net.deliver()
	c.hosts[old].ProcessReady()
	answers := 0
	for _, p := range c.net.q {
		if p.to == lead && p.m.Msg.GetType() == raftpb.MsgHeartbeatResp {
			answers++
		}
	}
	// The new leader takes the answers in one round: count what it sends back.
	c.net.now++
	c.net.deliver()
	mark := len(c.net.q) // what the leader sends from here on
	c.hosts[lead].ProcessReady()
	var sent, msgs int
	for _, p := range c.net.q[mark:] {
		if p.to == old && p.m.Msg.GetType() == raftpb.MsgApp {
			msgs++
			for _, e := range p.m.Msg.GetEntries() {
				sent += len(e.GetData())
			}
		}
	}
	t.Logf("%d heartbeats queued, %d answered; the leader's round sent %d MsgApp with %d KiB of entries", queued, answers, msgs, sent>>10)
	cfg := c.hosts[lead].cfg
	// One probe (≤ MaxSizePerMsg), then, once a probe succeeded, the
	// replication window: up to MaxInflightBytes plus the message that
	// crosses it.
	if limit := DefaultMaxInflightBytes + 2*int(cfg.MaxSizePerMsg); sent > limit {
		t.Errorf("one round sent %d KiB of entries to the resumed node, want at most %d KiB", sent>>10, limit>>10)
	}
	// And the group recovers: the resumed node catches up.
	c.waitConverged(5000)
}

// TestHeartbeatRunsKeepHighestContext: of a run of heartbeat answers from one
// peer, only the last is stepped, with the highest read-index context.
func TestHeartbeatRunsKeepHighestContext(t *testing.T) {
	ctx := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	hb := func(typ raftpb.MessageType, from, term uint64, c []byte) *raftpb.Message {
		return &raftpb.Message{Type: typ.Enum(), From: u64(from), Term: u64(term), Context: c}
	}
	msgs := []*raftpb.Message{
		hb(raftpb.MsgHeartbeatResp, 2, 5, ctx(7)),
		hb(raftpb.MsgHeartbeatResp, 3, 5, nil),
		{Type: raftpb.MsgAppResp.Enum(), From: u64(2), Term: u64(5)},
		hb(raftpb.MsgHeartbeatResp, 2, 5, ctx(9)),
		hb(raftpb.MsgHeartbeatResp, 2, 6, ctx(1)),
		hb(raftpb.MsgHeartbeatResp, 2, 5, nil),
		hb(raftpb.MsgHeartbeatResp, 4, 5, []byte("odd")),
		hb(raftpb.MsgHeartbeatResp, 4, 5, []byte("odd")),
	}
	r := newHeartbeatRuns(msgs)
	var stepped []int
	for i, m := range msgs {
		if !r.skip(i, m) {
			stepped = append(stepped, i)
		}
	}
	if fmt.Sprint(stepped) != "[1 2 4 5 6 7]" {
		t.Fatalf("stepped %v, want [1 2 4 5 6 7]", stepped)
	}
	if got := binary.LittleEndian.Uint64(msgs[5].GetContext()); got != 9 {
		t.Fatalf("the run's last answer carries context %d, want 9", got)
	}
	if newHeartbeatRuns(msgs[:3]) != nil {
		t.Fatal("no run of two: want nil (nothing to do)")
	}
}

// busyRound delivers what the network holds for node id and gives it n ticks,
// then runs it once: one round that finds both, as after its worker was busy
// (a catch-up read of the WAL) for n tick intervals.
func (c *cluster) busyRound(id uint64, n int) {
	c.net.deliver()
	for range n {
		c.hosts[id].Tick()
	}
	c.hosts[id].ProcessReady()
}

// TestTicksAfterMessages: a worker busy for a second (a catch-up read of the
// WAL) finds, in one round, a second of ticks and the messages its peers sent
// meanwhile. A leader must step its followers' answers before the ticks:
// taking the ticks first, it reached its quorum check (the previous check had
// cleared every follower's activity) before seeing the answers waiting beside
// them, and stepped down for lack of a quorum it had — the paused-leader
// residue of docs/reliability.md (healthy chunkservers' leaders stepping down
// after a peer resumed). A follower must take its ticks first: stepping the
// leader's heartbeat and then an election timeout of ticks, it would give up
// a leader it had just heard from and campaign.
func TestTicksAfterMessages(t *testing.T) {
	c := newCluster(t, 5, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	lead := c.waitLeader(1)
	c.run(50)
	ticks := c.hosts[lead].cfg.ElectionTicks
	// One election timeout with the answers to the leader held in the
	// network: the leader goes on ticking and heartbeating, passes one quorum
	// check on its followers' earlier answers, which clears their activity.
	c.net.paused[lead] = true
	for range ticks * c.tickEvery {
		c.net.now++
		if c.net.now%c.tickEvery == 0 {
			for _, id := range c.ids {
				c.hosts[id].Tick()
			}
		}
		c.net.deliver()
		for _, id := range c.ids {
			c.hosts[id].ProcessReady()
		}
	}
	if st, _ := c.hosts[lead].Status(1); !st.IsLeader {
		t.Fatalf("node %d lost the leadership while its followers' answers were only delayed one election timeout", lead)
	}
	// The busy round: the held answers and one more election timeout of
	// ticks reach the leader together.
	delete(c.net.paused, lead)
	c.busyRound(lead, ticks)
	if st, _ := c.hosts[lead].Status(1); !st.IsLeader {
		t.Fatalf("node %d stepped down for lack of quorum with its followers' answers in the same round", lead)
	}

	// A follower's busy round: two election timeouts of ticks (past any
	// randomized timeout) and its leader's latest heartbeat.
	c.run(50)
	var follower uint64
	for _, id := range c.ids {
		if id != lead {
			follower = id
			break
		}
	}
	c.net.paused[follower] = true
	c.hosts[lead].Tick() // a heartbeat for the follower, held in the network
	c.hosts[lead].ProcessReady()
	c.net.now++
	delete(c.net.paused, follower)
	c.busyRound(follower, 2*ticks)
	if st, _ := c.hosts[follower].Status(1); st.Leader != lead {
		t.Fatalf("node %d left its leader %d (now %d) with the leader's heartbeat in the same round as its ticks", follower, lead, st.Leader)
	}
}
