package raftstore

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// restart stops host id and starts a new one on the same log, with each state
// machine as a crash would leave it (what Persist made durable).
func (c *cluster) restart(id uint64) {
	c.hosts[id].Stop()
	old := c.sms[id]
	c.sms[id] = map[uint64]*testSM{}
	c.startHost(id)
	for _, gid := range slices.Sorted(maps.Keys(old)) {
		c.createGroup(id, gid, old[gid].restarted(), false)
	}
}

func TestSnapshotCatchUp(t *testing.T) {
	c := newCluster(t, 21, 3, map[uint64][]uint64{1: {1, 2, 3}}, func(cfg *Config) {
		cfg.SnapshotEntries = 20
		cfg.CatchUpEntries = 5
	})
	defer c.stop()
	l := c.waitLeader(1)
	if err := c.proposeWait(l, 1, "a=1"); err != nil {
		t.Fatal(err)
	}
	c.run(5)
	f := c.groups[1][0]
	if f == l {
		f = c.groups[1][1]
	}
	behind, _ := c.hosts[f].Status(1)
	c.net.partition([]uint64{f})
	for i := range 100 {
		if err := c.proposeWait(l, 1, fmt.Sprintf("k%d=%d", i, i)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	c.run(5)
	first, _ := c.logs[l].Storage(1).FirstIndex()
	if first <= behind.Applied+1 {
		t.Fatalf("leader log starts at %d; the follower at %d needs no snapshot", first, behind.Applied)
	}
	lst, _ := c.hosts[l].Status(1)
	if lst.Snapshot == 0 || c.hosts[l].Stats().SnapshotsCreated == 0 {
		t.Fatalf("leader made no snapshot: %+v", lst)
	}
	c.net.heal()
	c.waitConverged(1000)
	if c.hosts[f].Stats().SnapshotsReceived == 0 || c.hosts[l].Stats().SnapshotsSent == 0 {
		t.Fatalf("follower caught up without a snapshot (received %d)", c.hosts[f].Stats().SnapshotsReceived)
	}
	fst, _ := c.hosts[f].Status(1)
	if fst.Snapshot < first-1 {
		t.Fatalf("follower snapshot index %d, want >= %d", fst.Snapshot, first-1)
	}
	// The follower keeps up through the log again afterwards.
	if err := c.proposeWait(l, 1, "after=1"); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(200)
	if v, _ := c.sms[f][1].get("after"); v != "1" {
		t.Fatalf("follower missed a write after the snapshot")
	}
}

func TestRestartReplays(t *testing.T) {
	c := newCluster(t, 31, 3, map[uint64][]uint64{1: {1, 2, 3}, 2: {1, 2, 3}}, func(cfg *Config) {
		cfg.SnapshotEntries = 25
		cfg.CatchUpEntries = 5
	})
	defer c.stop()
	for _, gid := range []uint64{1, 2} {
		l := c.waitLeader(gid)
		for i := range 60 {
			if err := c.proposeWait(l, gid, fmt.Sprintf("k%d=g%d-%d", i%17, gid, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.waitConverged(200)
	want := map[uint64]map[string]string{1: c.sms[1][1].snapshotKV(), 2: c.sms[1][2].snapshotKV()}
	applied := map[uint64]uint64{}
	for _, gid := range []uint64{1, 2} {
		st, _ := c.hosts[1].Status(gid)
		applied[gid] = st.Applied
		if c.sms[1][gid].durIndex == 0 {
			t.Fatalf("group %d: nothing persisted; the test needs a snapshot", gid)
		}
	}
	// Restart every host: each replays its log from the last persisted index.
	for _, id := range c.ids {
		c.restart(id)
	}
	for _, id := range c.ids {
		c.hosts[id].ProcessReady()
		for _, gid := range []uint64{1, 2} {
			st, _ := c.hosts[id].Status(gid)
			if st.Applied < applied[gid] {
				t.Fatalf("node %d group %d: applied %d after restart, want %d", id, gid, st.Applied, applied[gid])
			}
			if got := c.sms[id][gid].snapshotKV(); !maps.Equal(got, want[gid]) {
				t.Fatalf("node %d group %d: state after replay differs: %v vs %v", id, gid, got, want[gid])
			}
		}
	}
	// And the groups work on: elect, write, converge.
	for _, gid := range []uint64{1, 2} {
		l := c.waitLeader(gid)
		if err := c.proposeWait(l, gid, "post=restart"); err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged(300)
}

// TestCrashBeforeSnapshotInstall: the follower persisted a received snapshot in its
// log but died before installing it. On restart the host installs the staged data
// (the log's snapshot is newer than what the state machine recovered) and converges.
func TestCrashBeforeSnapshotInstall(t *testing.T) {
	c := newCluster(t, 23, 3, map[uint64][]uint64{1: {1, 2, 3}}, func(cfg *Config) {
		cfg.SnapshotEntries = 20
		cfg.CatchUpEntries = 5
	})
	defer c.stop()
	l := c.waitLeader(1)
	f := c.groups[1][0]
	if f == l {
		f = c.groups[1][1]
	}
	c.net.partition([]uint64{f})
	for i := range 60 {
		if err := c.proposeWait(l, 1, fmt.Sprintf("k%d=%d", i, i)); err != nil {
			t.Fatal(err)
		}
	}
	c.sms[f][1].failInstall = true
	c.net.heal()
	for i := 0; ; i++ {
		if st, _ := c.hosts[f].Status(1); !st.Healthy {
			break
		}
		if i > 500 {
			t.Fatal("follower never got the snapshot")
		}
		c.step()
	}
	if snap, _ := c.logs[f].Storage(1).Snapshot(); snap.GetMetadata().GetIndex() == 0 {
		t.Fatal("the snapshot was not persisted before the install")
	}
	c.sms[f][1].failInstall = false
	c.restart(f)
	c.waitConverged(500)
	if v, _ := c.sms[f][1].get("k59"); v != "59" {
		t.Fatalf("restarted follower misses data: k59=%q", v)
	}
}

// TestSnapshotRelease: Host.Snapshot (the chunkserver's answer to a group pinning
// old WAL segments) compacts the whole applied log, even of an idle group.
func TestSnapshotRelease(t *testing.T) {
	c := newCluster(t, 25, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	l := c.waitLeader(1)
	for i := range 30 {
		if err := c.proposeWait(l, 1, fmt.Sprintf("k%d=%d", i, i)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged(100)
	for _, id := range c.ids {
		if first, _ := c.logs[id].Storage(1).FirstIndex(); first != 1 {
			t.Fatalf("node %d compacted to %d before any snapshot was due", id, first)
		}
	}
	for _, id := range c.ids {
		c.hosts[id].Snapshot(1)
	}
	c.run(3)
	for _, id := range c.ids {
		st, _ := c.hosts[id].Status(1)
		if first, _ := c.logs[id].Storage(1).FirstIndex(); first != st.Snapshot+1 || st.Snapshot < 30 {
			t.Fatalf("node %d: first index %d, snapshot %d: the applied log was not released", id, first, st.Snapshot)
		}
	}
	// Idle since: the leader adds an empty entry so that a newer snapshot exists.
	before, _ := c.hosts[l].Status(1)
	c.hosts[l].Snapshot(1)
	c.run(5)
	after, _ := c.hosts[l].Status(1)
	if after.Snapshot <= before.Snapshot {
		t.Fatalf("idle leader: snapshot %d -> %d", before.Snapshot, after.Snapshot)
	}
	if v, _ := c.sms[l][1].get("k29"); v != "29" {
		t.Fatal("state lost")
	}
}
