package raftstore

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

func confChange(typ raftpb.ConfChangeType, node uint64) *raftpb.ConfChangeV2 {
	return &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: typ.Enum(), NodeId: new(node)}}}
}

func (c *cluster) confChangeWait(id, gid uint64, cc *raftpb.ConfChangeV2) error {
	var res error
	calls := 0
	c.hosts[id].ProposeConfChange(gid, cc, func(err error) { res = err; calls++ })
	for i := 0; calls == 0; i++ {
		if i > 2000 {
			c.fatalf("conf change never answered")
		}
		c.step()
	}
	return res
}

// TestMembershipMove moves a replica the way the scheduler does: add a learner (it
// catches up through a snapshot, the log having been compacted), promote it, remove
// an old member.
func TestMembershipMove(t *testing.T) {
	groups := map[uint64][]uint64{1: {1, 2, 3}}
	c := newCluster(t, 41, 4, groups, func(cfg *Config) {
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
	c.createGroup(4, 1, newTestSM(), true)
	if err := c.confChangeWait(l, 1, confChange(raftpb.ConfChangeAddLearnerNode, 4)); err != nil {
		t.Fatalf("add learner: %v", err)
	}
	for i := 0; ; i++ {
		st, _ := c.hosts[l].Status(1)
		if st.Progress[4] >= st.Commit {
			if !slices.Contains(st.Learners, 4) {
				t.Fatalf("4 is not a learner: %+v", st)
			}
			break
		}
		if i > 1000 {
			t.Fatalf("learner never caught up: %+v", st)
		}
		c.step()
	}
	if c.hosts[4].Stats().SnapshotsReceived == 0 {
		t.Fatalf("the learner caught up without a snapshot although the log was compacted")
	}
	if err := c.confChangeWait(l, 1, confChange(raftpb.ConfChangeAddNode, 4)); err != nil {
		t.Fatalf("promote: %v", err)
	}
	// Remove the old leader itself: it steps down, another member takes over.
	err := c.confChangeWait(l, 1, confChange(raftpb.ConfChangeRemoveNode, l))
	if err != nil {
		t.Fatalf("remove %d: %v", l, err)
	}
	c.groups[1] = slices.DeleteFunc(slices.Clone(c.groups[1]), func(id uint64) bool { return id == l })
	c.groups[1] = append(c.groups[1], 4)
	if err := c.hosts[l].RemoveGroup(1); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.hosts[l].Status(1); ok {
		t.Fatal("removed group still has a status")
	}
	var perr error
	c.hosts[l].Propose(1, propData("x=y"), func(err error) { perr = err })
	if !errors.Is(perr, ErrNoGroup) {
		t.Fatalf("propose on removed group: %v", perr)
	}
	nl := c.waitLeader(1)
	st, _ := c.hosts[nl].Status(1)
	slices.Sort(st.Voters)
	want := slices.Sorted(slices.Values(c.groups[1]))
	if !slices.Equal(st.Voters, want) || len(st.Learners) != 0 {
		t.Fatalf("voters %v learners %v, want voters %v", st.Voters, st.Learners, want)
	}
	if err := c.proposeWait(nl, 1, "moved=yes"); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(500)
	if v, _ := c.sms[4][1].get("k59"); v != "59" {
		t.Fatalf("new member misses old data: k59=%q", v)
	}
}

// TestProposalsUnderLeaderChange pipelines proposals while leadership moves (a
// transfer, then an isolation of the leader): each is answered exactly once, with
// its result or NOT_LEADER, and every acknowledged one is on every replica.
func TestProposalsUnderLeaderChange(t *testing.T) {
	c := newCluster(t, 51, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	c.net.maxDelay = 2
	type prop struct {
		calls int
		err   error
		key   string
	}
	var props []*prop
	propose := func(id uint64, n int) {
		for range n {
			p := &prop{key: fmt.Sprintf("k%d", len(props))}
			props = append(props, p)
			c.hosts[id].Propose(1, propData(p.key+"=v"), func(err error) { p.calls++; p.err = err })
		}
	}
	l := c.waitLeader(1)
	propose(l, 20)
	c.step()
	propose(l, 20)
	to := c.groups[1][0]
	if to == l {
		to = c.groups[1][1]
	}
	c.hosts[l].TransferLeader(1, to) // proposals during the transfer are dropped
	propose(l, 20)
	c.run(3)
	propose(l, 20)
	nl := c.waitLeader(1)
	propose(nl, 20)
	c.step()
	c.net.partition([]uint64{nl}) // in-flight entries on the isolated leader are lost
	propose(nl, 20)
	c.run(150)
	c.net.heal()
	l3 := c.waitLeader(1)
	propose(l3, 5)
	c.waitConverged(500)
	c.stop()
	ok, notLeader := 0, 0
	for _, p := range props {
		if p.calls != 1 {
			t.Fatalf("%s answered %d times", p.key, p.calls)
		}
		switch {
		case p.err == nil:
			ok++
			for _, id := range c.ids {
				if _, found := c.sms[id][1].get(p.key); !found {
					t.Fatalf("acknowledged %s missing on node %d", p.key, id)
				}
			}
		case errors.Is(p.err, ErrNotLeader):
			notLeader++
		default:
			t.Fatalf("%s: unexpected result %v", p.key, p.err)
		}
	}
	if ok == 0 || notLeader == 0 {
		t.Fatalf("ok %d, NOT_LEADER %d: the scenario did not exercise both outcomes", ok, notLeader)
	}
	t.Logf("%d ok, %d NOT_LEADER", ok, notLeader)
}

// TestPersistFailureStopsGroup: a failed Persist (the chunks' fsync) stops the
// group like a failed Apply, and Persist is not tried again. A retried fsync
// may succeed although the kernel dropped the dirty pages; the snapshot that
// followed would then compact away the only copy of acknowledged writes.
func TestPersistFailureStopsGroup(t *testing.T) {
	c := newCluster(t, 62, 3, map[uint64][]uint64{1: {1, 2, 3}}, func(cfg *Config) {
		cfg.SnapshotEntries = 10
	})
	defer c.stop()
	l := c.waitLeader(1)
	sm := c.sms[l][1]
	sm.mu.Lock()
	sm.failPersist = true
	sm.mu.Unlock()
	for i := range 30 {
		err := c.proposeWait(l, 1, fmt.Sprintf("k%d=1", i))
		if errors.Is(err, ErrIO) {
			break // the snapshot failed: writes still pending get the disk error
		}
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	c.run(20)
	sm.mu.Lock()
	persists := sm.persists
	sm.mu.Unlock()
	if persists == 0 {
		t.Fatal("no snapshot was attempted")
	}
	st, _ := c.hosts[l].Status(1)
	if st.Healthy || !errors.Is(st.Err, ErrIO) || !errors.Is(st.Err, errDisk) {
		t.Fatalf("group after a failed Persist: healthy %v, err %v; want stopped with ErrIO", st.Healthy, st.Err)
	}
	// The chunkserver asks groups that pin old WAL segments to snapshot: a
	// stopped group does not try Persist again.
	c.hosts[l].Snapshot(1)
	c.run(20)
	sm.mu.Lock()
	again := sm.persists
	sm.mu.Unlock()
	if again != persists {
		t.Fatalf("Persist retried after it failed (%d calls, then %d)", persists, again)
	}
	c.groups[1] = slices.DeleteFunc(slices.Clone(c.groups[1]), func(id uint64) bool { return id == l })
	nl := c.waitLeader(1)
	if err := c.proposeWait(nl, 1, "after=1"); err != nil {
		t.Fatalf("group 1 on the other members: %v", err)
	}
}

// TestApplyFailureStopsGroup: a disk error while applying stops that group only.
func TestApplyFailureStopsGroup(t *testing.T) {
	c := newCluster(t, 61, 3, map[uint64][]uint64{1: {1, 2, 3}, 2: {1, 2, 3}}, nil)
	defer c.stop()
	l := c.waitLeader(1)
	c.waitLeader(2)
	if err := c.proposeWait(l, 1, "a=1"); err != nil {
		t.Fatal(err)
	}
	st, _ := c.hosts[l].Status(1)
	c.sms[l][1].failAt = st.Applied + 1
	var errs []error
	for i := range 3 {
		c.hosts[l].Propose(1, propData(fmt.Sprintf("b%d=1", i)), func(err error) { errs = append(errs, err) })
	}
	c.run(20)
	if len(errs) != 3 {
		t.Fatalf("%d of 3 proposals answered", len(errs))
	}
	for _, err := range errs {
		if !errors.Is(err, ErrIO) || !errors.Is(err, errDisk) {
			t.Fatalf("pending proposal on a failed group: %v, want ErrIO and its cause", err)
		}
	}
	st, _ = c.hosts[l].Status(1)
	if st.Healthy || !errors.Is(st.Err, ErrIO) || !errors.Is(st.Err, errDisk) {
		t.Fatalf("failed group status %+v", st)
	}
	var late error
	c.hosts[l].Propose(1, propData("c=1"), func(err error) { late = err })
	if !errors.Is(late, ErrIO) {
		t.Fatalf("propose after failure: %v", late)
	}
	// The other group on the same host goes on; group 1 re-elects among the others.
	l2 := c.waitLeader(2)
	if err := c.proposeWait(l2, 2, "z=1"); err != nil {
		t.Fatalf("healthy group: %v", err)
	}
	c.groups[1] = slices.DeleteFunc(slices.Clone(c.groups[1]), func(id uint64) bool { return id == l })
	nl := c.waitLeader(1)
	if err := c.proposeWait(nl, 1, "d=1"); err != nil {
		t.Fatalf("group 1 on the other members: %v", err)
	}
}
