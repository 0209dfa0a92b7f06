package wal

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestStorageConformance drives a WAL group and a raft.MemoryStorage through
// the same seeded sequence of appends (with truncations), snapshots with
// compaction and received snapshots, and requires every raft.Storage answer
// to match — before and after restarts, with and without the entry cache.
func TestStorageConformance(t *testing.T) {
	for _, cache := range []int{-1, 1 << 10, DefaultCacheBytes} {
		for seed := int64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("cache=%d/seed=%d", cache, seed), func(t *testing.T) {
				conformance(t, seed, cache)
			})
		}
	}
}

func conformance(t *testing.T, seed int64, cache int) {
	rng := rand.New(rand.NewSource(seed))
	dir := t.TempDir()
	cfg := func(c *Config) { c.SegmentSize = 16 << 10; c.CacheBytes = cache }
	w := openT(t, dir, cfg)
	defer func() { w.Close() }()
	const id = 9
	ms := raft.NewMemoryStorage()
	term := uint64(1)
	for step := 0; step < 300; step++ {
		last, _ := ms.LastIndex()
		first, _ := ms.FirstIndex()
		// Raft never truncates committed entries, and snapshots cover only
		// committed ones: rewrites start after the latest snapshot.
		msn, _ := ms.Snapshot()
		stable := max(first, msn.GetMetadata().GetIndex()+1)
		switch r := rng.Intn(100); {
		case r < 60: // append, sometimes rewriting a suffix
			at := last + 1
			if last >= stable && rng.Intn(4) == 0 {
				at = stable + uint64(rng.Int63n(int64(last-stable+1)))
				term++
			}
			ents := mkEnts(at, uint64(1+rng.Intn(8)), term, rng.Intn(400), rng.Int63())
			mustSave(t, w, Update{Group: id, Entries: ents, HardState: hs(term, 1, at-1)})
			if err := ms.Append(ents); err != nil {
				t.Fatal(err)
			}
			ms.SetHardState(hs(term, 1, at-1))
		case r < 75 && last >= first: // snapshot and compact
			snapIdx := first + uint64(rng.Int63n(int64(last-first+1)))
			compactTo := snapIdx - uint64(rng.Int63n(int64(snapIdx-first+1)))
			cs := &pb.ConfState{Voters: []uint64{1, 2, uint64(3 + rng.Intn(3))}}
			data := []byte(fmt.Sprintf("state@%d", snapIdx))
			sn := &pb.Snapshot{Data: data, Metadata: &pb.SnapshotMetadata{Index: new(snapIdx), ConfState: cs}}
			werr := w.CreateSnapshot(id, sn, compactTo)
			_, merr := ms.CreateSnapshot(snapIdx, cs, data)
			if errors.Is(merr, raft.ErrSnapOutOfDate) {
				merr = nil // the WAL ignores a snapshot that is not newer
			}
			if !errors.Is(werr, merr) && !(merr == nil && werr == nil) {
				t.Fatalf("step %d: CreateSnapshot(%d): wal %v, memory %v", step, snapIdx, werr, merr)
			}
			if merr == nil && compactTo >= first && snapIdx > msn.GetMetadata().GetIndex() {
				if err := ms.Compact(compactTo); err != nil {
					t.Fatal(err)
				}
			}
		case r < 80: // a snapshot received from the leader
			term++
			idx := max(last, stable-1) + uint64(rng.Intn(20)) + 1
			sn := &pb.Snapshot{Data: []byte("recv"), Metadata: &pb.SnapshotMetadata{
				Index: new(idx), Term: new(term), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}, AutoLeave: new(false)}}}
			mustSave(t, w, Update{Group: id, Snapshot: sn, HardState: hs(term, 0, idx)})
			if err := ms.ApplySnapshot(sn); err != nil {
				t.Fatal(err)
			}
			ms.SetHardState(hs(term, 0, idx))
		case r < 85: // restart
			w.Close()
			w = openT(t, dir, cfg)
		default:
		}
		compareStorage(t, step, rng, w.Storage(id), ms)
	}
	w.Close()
	w = openT(t, dir, cfg)
	compareStorage(t, -1, rng, w.Storage(id), ms)
}

func compareStorage(t *testing.T, step int, rng *rand.Rand, s raft.Storage, ms *raft.MemoryStorage) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("step %d: "+format, append([]any{step}, args...)...)
	}
	wf, _ := s.FirstIndex()
	mf, _ := ms.FirstIndex()
	wl, _ := s.LastIndex()
	ml, _ := ms.LastIndex()
	if wf != mf || wl != ml {
		fail("first/last: wal %d/%d, memory %d/%d", wf, wl, mf, ml)
	}
	whs, wcs, _ := s.InitialState()
	mhs, mcs, _ := ms.InitialState()
	if !proto.Equal(whs, mhs) || !proto.Equal(wcs, mcs) {
		fail("InitialState: wal %v %v, memory %v %v", whs, wcs, mhs, mcs)
	}
	wsn, _ := s.Snapshot()
	msn, _ := ms.Snapshot()
	if !proto.Equal(wsn, msn) {
		fail("Snapshot: wal %v, memory %v", wsn, msn)
	}
	lo := uint64(0)
	if mf > 2 {
		lo = mf - 2
	}
	for i := lo; i <= ml+1; i++ {
		wt, werr := s.Term(i)
		mt, merr := ms.Term(i)
		if wt != mt || !errors.Is(werr, merr) {
			fail("Term(%d): wal %d %v, memory %d %v", i, wt, werr, mt, merr)
		}
	}
	for range 10 {
		lo := lo + uint64(rng.Int63n(int64(ml+2-lo)))
		if lo == 0 {
			lo = 1
		}
		if lo > ml+1 {
			continue
		}
		hi := lo + uint64(rng.Int63n(int64(ml+2-lo)))
		if hi == lo {
			continue // MemoryStorage returns an empty slice; raft never asks
		}
		max := uint64(rng.Intn(3000))
		if rng.Intn(4) == 0 {
			max = 1 << 62
		}
		we, werr := s.Entries(lo, hi, max)
		me, merr := ms.Entries(lo, hi, max)
		if !errors.Is(werr, merr) || len(we) != len(me) {
			fail("Entries(%d, %d, %d): wal %d %v, memory %d %v", lo, hi, max, len(we), werr, len(me), merr)
		}
		for j := range me {
			if !proto.Equal(we[j], me[j]) {
				fail("Entries(%d, %d, %d)[%d] differ: wal %v / memory %v", lo, hi, max, j, we[j], me[j])
			}
		}
	}
}
