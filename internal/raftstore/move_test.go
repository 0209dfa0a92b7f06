package raftstore

import (
	"fmt"
	"slices"
	"testing"
)

// mover carries out NextMoveStep on a cluster's group the way a chunkserver
// does: on the leader, one change at a time, at every step.
type mover struct {
	c       *cluster
	gid     uint64
	want    []uint64
	pending bool
	steps   []string // every step taken, in order
}

func (m *mover) step() MoveStep {
	l := m.c.leader(m.gid)
	if l == 0 || m.pending {
		return MoveStep{Why: "no leader or a change pending"}
	}
	st, _ := m.c.hosts[l].Status(m.gid)
	s := NextMoveStep(st, l, m.want, 64)
	switch s.Kind {
	case MoveWait:
		return s
	case MoveTransferLeader:
		m.c.hosts[l].TransferLeader(m.gid, s.Node)
	default:
		m.pending = true
		m.c.hosts[l].ProposeConfChange(m.gid, s.ConfChange(), func(error) { m.pending = false })
	}
	if len(m.steps) == 0 || m.steps[len(m.steps)-1] != s.String() {
		m.steps = append(m.steps, s.String())
	}
	return s
}

// TestJointMoveKeepsQuorum moves a replica of a three-voter group (members
// {leader, from, other} → {leader, other, 4}) with NextMoveStep, the way the
// chunkservers do, while the new member's snapshot is held back (a slow
// rebuild); then a second member (other) dies mid-move. Every configuration
// any replica applies has three voters in each half, the move completes
// through a joint configuration, and the group still commits writes.
func TestJointMoveKeepsQuorum(t *testing.T) {
	for _, seed := range []int64{71, 72, 73} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { testJointMove(t, seed) })
	}
}

func testJointMove(t *testing.T, seed int64) {
	c := newCluster(t, seed, 4, map[uint64][]uint64{1: {1, 2, 3}}, func(cfg *Config) {
		cfg.SnapshotEntries = 20
		cfg.CatchUpEntries = 5
	})
	defer c.stop()
	l := c.waitLeader(1)
	for i := range 60 {
		if err := c.proposeWait(l, 1, fmt.Sprintf("k%d=%d", i, i)); err != nil {
			t.Fatal(err)
		}
	}
	var others []uint64
	for _, id := range c.groups[1] {
		if id != l {
			others = append(others, id)
		}
	}
	from, other := others[0], others[1]
	want := slices.Sorted(slices.Values([]uint64{l, other, 4}))
	m := &mover{c: c, gid: 1, want: want}

	sawJoint := false
	check := func() {
		t.Helper()
		for _, id := range c.ids {
			h := c.hosts[id]
			if h == nil {
				continue
			}
			st, ok := h.Status(1)
			if !ok || len(st.Voters) == 0 {
				continue // the new member before its snapshot, or a removed one
			}
			if len(st.Voters) != 3 || (len(st.VotersOutgoing) != 0 && len(st.VotersOutgoing) != 3) {
				c.fatalf("node %d applied voters %v, outgoing %v, learners %v: fewer than 3 voters in a half (steps %q)",
					id, st.Voters, st.VotersOutgoing, st.Learners, m.steps)
			}
			sawJoint = sawJoint || len(st.VotersOutgoing) > 0
		}
	}
	run := func(steps int) {
		for range steps {
			m.step()
			c.step()
			check()
		}
	}

	// The new member joins; its snapshot (the log was compacted) is held back.
	c.net.holdSnap = map[uint64]bool{4: true}
	c.groups[1] = append(c.groups[1], 4)
	c.createGroup(4, 1, newTestSM(), true)
	for i := 0; ; i++ {
		if st, _ := c.hosts[l].Status(1); slices.Contains(st.Learners, 4) {
			break
		}
		if i > 1000 {
			c.fatalf("4 never became a learner (steps %q)", m.steps)
		}
		run(1)
	}
	// The rebuild takes a while: writes go on, the move must wait.
	for i := range 20 {
		c.hosts[l].Propose(1, propData(fmt.Sprintf("during%d=1", i)), func(error) {})
		run(5)
	}
	// A second member dies mid-move; the rebuild finishes.
	c.hosts[other].Stop()
	c.hosts[other] = nil
	delete(c.net.hosts, other)
	c.net.holdSnap = nil
	for i := 0; ; i++ {
		s := m.step()
		if ld := c.leader(1); ld != 0 && s.Kind == MoveWait && s.Why == "" {
			st, _ := c.hosts[ld].Status(1)
			if slices.Equal(slices.Sorted(slices.Values(st.Voters)), want) && len(st.VotersOutgoing) == 0 && len(st.Learners) == 0 {
				break
			}
		}
		if i > 3000 {
			st, _ := c.hosts[l].Status(1)
			c.fatalf("move never completed: leader %d status %+v (steps %q)", c.leader(1), st, m.steps)
		}
		c.step()
		check()
	}
	if !sawJoint {
		c.fatalf("the move never went through a joint configuration (steps %q)", m.steps)
	}
	if c.hosts[4].Stats().SnapshotsReceived == 0 {
		c.fatalf("the new member caught up without a snapshot although the log was compacted")
	}
	c.groups[1] = want
	nl := c.waitLeader(1)
	if err := c.proposeWait(nl, 1, "after=1"); err != nil {
		c.fatalf("write after the move, %d of 3 members alive: %v", 2, err)
	}
	c.waitConverged(1000)
	if v, _ := c.sms[4][1].get("k59"); v != "59" {
		c.fatalf("new member misses old data: k59=%q", v)
	}
	t.Logf("from %d to 4, %d died mid-move; steps: %q", from, other, m.steps)
}

// TestNextMoveStep: the decisions of NextMoveStep on a leader's status.
func TestNextMoveStep(t *testing.T) {
	caught := func(ids ...uint64) (map[uint64]uint64, map[uint64]bool) {
		p, r := map[uint64]uint64{}, map[uint64]bool{}
		for _, id := range ids {
			p[id], r[id] = 1000, true
		}
		return p, r
	}
	p, r := caught(1, 2, 3, 4)
	behind := map[uint64]uint64{1: 1000, 2: 1000, 3: 1000, 4: 900}
	snapping := map[uint64]bool{1: true, 2: true, 3: true}
	for _, tc := range []struct {
		name string
		st   GroupStatus
		want string
	}{
		{"done", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 3}, LastIndex: 1000, Progress: p, Replicating: r}, "done"},
		{"follower", GroupStatus{Voters: []uint64{1, 2, 3}}, "wait: not the leader"},
		{"add", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 3}, LastIndex: 1000, Progress: p, Replicating: r}, "add learner 4"},
		{"lagging", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 3}, Learners: []uint64{4}, LastIndex: 1000, Progress: behind, Replicating: r},
			"wait: learner 4 catching up (match 900, last index 1000)"},
		{"snapshot", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 3}, Learners: []uint64{4}, LastIndex: 1000, Progress: p, Replicating: snapping},
			"wait: learner 4 catching up (match 1000, last index 1000)"},
		{"replace", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 3}, Learners: []uint64{4}, LastIndex: 1000, Progress: p, Replicating: r},
			"joint change: promote [4], remove [3]"},
		{"joint", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 4}, VotersOutgoing: []uint64{1, 2, 3}, AutoLeave: true},
			"wait: raft leaving the joint configuration"},
		{"explicit joint", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 4}, VotersOutgoing: []uint64{1, 2, 3}}, "leave joint configuration"},
		{"stray learner", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 4}, Learners: []uint64{3}, LastIndex: 1000, Progress: p, Replicating: r},
			"remove learner 3"},
		{"leader leaves", GroupStatus{IsLeader: true, Voters: []uint64{1, 2, 4}, Learners: []uint64{}, LastIndex: 1000, Progress: p, Replicating: r},
			"transfer leadership to 2"},
	} {
		want := []uint64{1, 2, 4}
		self := uint64(1)
		switch tc.name {
		case "done":
			want = []uint64{1, 2, 3}
		case "leader leaves":
			want = []uint64{2, 3, 4}
			tc.st.Learners = []uint64{3}
			tc.want = "transfer leadership to 2"
		}
		if got := NextMoveStep(tc.st, self, want, 64).String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
