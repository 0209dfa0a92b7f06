package raftstore

import (
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/basalt-storage/basalt/internal/wal"
)

// TestOnRealWAL runs a group on the real shared WAL (one per host): writes with
// snapshots and compaction, then every host stops, its WAL is closed and reopened
// from disk, and the group comes back with the same state and goes on. The
// host tells the WAL what it applied, so the entry cache keeps no more applied
// entries than CacheBytes.
func TestOnRealWAL(t *testing.T) {
	dir := t.TempDir()
	const cacheBytes = 64
	open := func(id uint64) *wal.WAL {
		w, err := wal.Open(wal.Config{Dir: filepath.Join(dir, fmt.Sprint(id)), SegmentSize: 64 << 10,
			CacheBytes: cacheBytes, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	wals := map[uint64]*wal.WAL{}
	c := newClusterWith(t, 71, 3, map[uint64][]uint64{1: {1, 2, 3}, 2: {1, 2, 3}}, func(cfg *Config) {
		cfg.SnapshotEntries = 30
		cfg.CatchUpEntries = 5
	}, func(id uint64) LogStore { wals[id] = open(id); return wals[id] })
	defer func() {
		c.stop()
		for _, w := range wals {
			w.Close()
		}
	}()
	for _, gid := range []uint64{1, 2} {
		l := c.waitLeader(gid)
		for i := range 80 {
			if err := c.proposeWait(l, gid, fmt.Sprintf("k%d=%d-%d", i%13, gid, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.waitConverged(300)
	for _, id := range c.ids {
		// Two groups, each at most cacheBytes plus the one entry always kept.
		if n := wals[id].Stats().CachedBytes; n > 2*(cacheBytes+32) {
			t.Fatalf("node %d: %d bytes of applied entries cached, want at most %d", id, n, 2*(cacheBytes+32))
		}
	}
	want := map[uint64]map[string]string{1: c.sms[1][1].snapshotKV(), 2: c.sms[1][2].snapshotKV()}
	for _, id := range c.ids {
		if first, _ := wals[id].Storage(1).FirstIndex(); first <= 1 {
			t.Fatalf("node %d: the WAL was never compacted (first index %d)", id, first)
		}
	}
	for _, id := range c.ids {
		c.hosts[id].Stop()
		if err := wals[id].Close(); err != nil {
			t.Fatal(err)
		}
		wals[id] = open(id)
		c.logs[id] = wals[id]
		old := c.sms[id]
		c.sms[id] = map[uint64]*testSM{}
		c.startHost(id)
		for _, gid := range slices.Sorted(maps.Keys(old)) {
			c.createGroup(id, gid, old[gid].restarted(), false)
		}
		c.hosts[id].ProcessReady()
		for gid, kv := range want {
			if got := c.sms[id][gid].snapshotKV(); !maps.Equal(got, kv) {
				t.Fatalf("node %d group %d after reopening the WAL: %v, want %v", id, gid, got, kv)
			}
		}
	}
	for _, gid := range []uint64{1, 2} {
		l := c.waitLeader(gid)
		if err := c.proposeWait(l, gid, "after=reopen"); err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged(300)
}
