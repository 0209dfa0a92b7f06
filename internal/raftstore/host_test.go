package raftstore

import (
	"errors"
	"fmt"
	"testing"

	"github.com/basalt-storage/basalt/internal/raftstore/memlog"
	"github.com/basalt-storage/basalt/pkg/api"
)

func TestProposeApplyReplicate(t *testing.T) {
	c := newCluster(t, 1, 3, map[uint64][]uint64{7: {1, 2, 3}}, nil)
	defer c.stop()
	c.net.maxDelay = 1
	l := c.waitLeader(7)
	for i := range 20 {
		if err := c.proposeWait(l, 7, fmt.Sprintf("k%d=v%d", i, i)); err != nil {
			t.Fatalf("propose %d: %v", i, err)
		}
	}
	// A replicated rejection is a normal result, delivered to the proposer.
	if err := c.proposeWait(l, 7, "fence:x"); !errors.Is(err, api.ErrFenced) {
		t.Fatalf("fence entry: got %v, want FENCED", err)
	}
	c.waitConverged(200)
	for _, id := range c.ids {
		if v, _ := c.sms[id][7].get("k19"); v != "v19" {
			t.Fatalf("node %d: k19=%q", id, v)
		}
	}
	// A follower refuses with a hint to the leader.
	f := c.ids[0]
	if f == l {
		f = c.ids[1]
	}
	var got error
	c.hosts[f].Propose(7, propData("a=b"), func(err error) { got = err })
	c.step()
	var nl *NotLeaderError
	if !errors.As(got, &nl) || nl.Leader != l {
		t.Fatalf("follower propose: got %v, want NOT_LEADER hint %d", got, l)
	}
	st, _ := c.hosts[l].Status(7)
	if !st.IsLeader || !st.Healthy || len(st.Voters) != 3 || st.Progress[f] != st.Commit {
		t.Fatalf("leader status %+v", st)
	}
	s := c.hosts[l].Stats()
	if s.ProposeCommit.Count < 20 || s.Apply.Count < 20 || s.LogSave.Count == 0 || s.ReadyRounds == 0 {
		t.Fatalf("stats not recorded: %+v", s)
	}
}

// TestSingleVoter: a one-replica group (a local pool's) elects itself at once and
// serves writes and reads.
func TestSingleVoter(t *testing.T) {
	c := newCluster(t, 81, 1, map[uint64][]uint64{5: {1}}, nil)
	defer c.stop()
	c.hosts[1].ProcessReady()
	if st, _ := c.hosts[1].Status(5); !st.IsLeader {
		t.Fatalf("single voter not leader right away: %+v", st)
	}
	if err := c.proposeWait(1, 5, "a=1"); err != nil {
		t.Fatal(err)
	}
	var rerr error
	calls := 0
	c.hosts[1].ReadBarrier(5, func(err error) { rerr = err; calls++ })
	c.hosts[1].ProcessReady()
	if calls != 1 || rerr != nil {
		t.Fatalf("read: %d calls, %v", calls, rerr)
	}
}

// TestGroupCommit: the groups handled in one round share one LogStore.Save.
func TestGroupCommit(t *testing.T) {
	groups := map[uint64][]uint64{}
	for g := uint64(1); g <= 8; g++ {
		groups[g] = []uint64{1}
	}
	c := newCluster(t, 91, 1, groups, nil)
	defer c.stop()
	h := c.hosts[1]
	h.ProcessReady()
	log := c.logs[1].(*memlog.Log)
	before, roundsBefore := log.Saves(), h.Stats().ReadyRounds
	answered := 0
	for g := uint64(1); g <= 8; g++ {
		h.Propose(g, propData("k=v"), func(err error) {
			if err != nil {
				t.Errorf("group %d: %v", g, err)
			}
			answered++
		})
	}
	h.ProcessReady()
	saves, rounds := log.Saves()-before, h.Stats().ReadyRounds-roundsBefore
	if answered != 8 {
		t.Fatalf("%d of 8 proposals answered", answered)
	}
	if saves > 2 || saves != int(rounds) {
		t.Fatalf("8 groups' proposals took %d saves in %d rounds, want one save per round, at most 2", saves, rounds)
	}
}

// TestProposalBufferReused: a proposer may reuse its buffer once done ran
// (the chunkserver's come from a pool): neither the host nor raft keeps a
// reference to it, since raft copies a proposal into its log. A raft release
// that stopped copying would make the followers, and the log, see the
// scribbles below.
func TestProposalBufferReused(t *testing.T) {
	c := newCluster(t, 5, 3, map[uint64][]uint64{7: {1, 2, 3}}, nil)
	defer c.stop()
	l := c.waitLeader(7)
	buf := make([]byte, 64)
	const n = 30
	for i := range n {
		data := append(buf[:0], propData(fmt.Sprintf("k%d=v%d", i, i))...)
		var done bool
		var perr error
		c.hosts[l].Propose(7, data, func(err error) { done, perr = true, err })
		for step := 0; !done && step < 1000; step++ {
			c.step()
		}
		if !done || perr != nil {
			t.Fatalf("proposal %d: done %v, %v", i, done, perr)
		}
		for j := range buf {
			buf[j] = 0xee
		}
	}
	c.waitConverged(500)
	for _, id := range c.ids {
		for i := range n {
			if v, _ := c.sms[id][7].get(fmt.Sprintf("k%d", i)); v != fmt.Sprintf("v%d", i) {
				t.Fatalf("node %d: k%d=%q after the proposer reused its buffer", id, i, v)
			}
		}
	}
}
