package wal

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openT(t testing.TB, dir string, mod func(*Config)) *WAL {
	t.Helper()
	cfg := Config{Dir: dir, SegmentSize: 1 << 20, Logger: quietLogger()}
	if mod != nil {
		mod(&cfg)
	}
	w, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return w
}

// mkEnts makes n entries from index first with data derived from seed.
func mkEnts(first, n, term uint64, size int, seed int64) []*pb.Entry {
	rng := rand.New(rand.NewSource(seed))
	ents := make([]*pb.Entry, n)
	for i := range ents {
		data := make([]byte, size)
		rng.Read(data)
		ents[i] = &pb.Entry{Term: new(term), Index: new(first + uint64(i)), Type: new(pb.EntryType_EntryNormal), Data: data}
	}
	return ents
}

func hs(term, vote, commit uint64) *pb.HardState {
	return &pb.HardState{Term: new(term), Vote: new(vote), Commit: new(commit)}
}

func mustSave(t testing.TB, w *WAL, us ...Update) {
	t.Helper()
	if err := w.Save(us); err != nil {
		t.Fatalf("Save: %v", err)
	}
}

// logOf reads the group's whole log through its raft.Storage.
func logOf(t testing.TB, s raft.Storage) []*pb.Entry {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if last < first {
		return nil
	}
	ents, err := s.Entries(first, last+1, 1<<62)
	if err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	return ents
}

func checkLog(t testing.TB, s raft.Storage, want []*pb.Entry) {
	t.Helper()
	got := logOf(t, s)
	if len(got) != len(want) {
		t.Fatalf("log has %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("entry %d: got index %d term %d len %d, want index %d term %d len %d", i,
				got[i].GetIndex(), got[i].GetTerm(), len(got[i].Data),
				want[i].GetIndex(), want[i].GetTerm(), len(want[i].Data))
		}
	}
}

func checkHardState(t testing.TB, s raft.Storage, want *pb.HardState) {
	t.Helper()
	got, _, err := s.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("HardState = %v, want %v", got, want)
	}
}

func TestSaveAndReopen(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, nil)
	ents := mkEnts(1, 10, 1, 100, 1)
	mustSave(t, w, Update{Group: 7, HardState: hs(1, 2, 5), Entries: ents})
	checkLog(t, w.Storage(7), ents)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Save([]Update{{Group: 7, Entries: mkEnts(11, 1, 1, 1, 1)}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Save after Close: %v, want ErrClosed", err)
	}
	w = openT(t, dir, nil)
	defer w.Close()
	if got := w.Groups(); !slices.Equal(got, []uint64{7}) {
		t.Fatalf("Groups = %v", got)
	}
	checkLog(t, w.Storage(7), ents)
	checkHardState(t, w.Storage(7), hs(1, 2, 5))
}

func TestEmptySaveReturnsAtOnce(t *testing.T) {
	w := openT(t, t.TempDir(), nil)
	defer w.Close()
	done := make(chan error, 1)
	go func() { done <- w.Save([]Update{{Group: 1}, {Group: 2, HardState: &pb.HardState{}}}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Save of empty updates did not return")
	}
	if st := w.Stats(); st.Syncs != 0 {
		t.Fatalf("empty Save synced %d times", st.Syncs)
	}
}

func TestTruncationAndRestart(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, nil)
	a := mkEnts(1, 10, 1, 50, 1)
	mustSave(t, w, Update{Group: 1, Entries: a})
	b := mkEnts(6, 3, 2, 70, 2) // replaces 6..10 with 6..8
	mustSave(t, w, Update{Group: 1, Entries: b, HardState: hs(2, 1, 5)})
	want := append(slices.Clone(a[:5]), b...)
	check := func(w *WAL) {
		s := w.Storage(1)
		checkLog(t, s, want)
		if last, _ := s.LastIndex(); last != 8 {
			t.Fatalf("LastIndex = %d, want 8", last)
		}
		if term, _ := s.Term(8); term != 2 {
			t.Fatalf("Term(8) = %d, want 2", term)
		}
		if _, err := s.Term(9); !errors.Is(err, raft.ErrUnavailable) {
			t.Fatalf("Term(9) err = %v, want ErrUnavailable", err)
		}
	}
	check(w)
	// Gaps and non-contiguous entries are refused and change nothing.
	if err := w.Save([]Update{{Group: 1, Entries: mkEnts(10, 1, 2, 1, 3)}}); !errors.Is(err, ErrGap) {
		t.Fatalf("gap: %v", err)
	}
	bad := append(mkEnts(9, 1, 2, 1, 3), mkEnts(11, 1, 2, 1, 3)...)
	if err := w.Save([]Update{{Group: 1, Entries: bad}}); !errors.Is(err, ErrNonContiguous) {
		t.Fatalf("non-contiguous: %v", err)
	}
	check(w)
	w.Close()
	w = openT(t, dir, nil)
	defer w.Close()
	check(w)
	// Two updates of one group in one Save apply in order.
	d1, d2 := mkEnts(9, 2, 3, 5, 5), mkEnts(10, 3, 4, 5, 6)
	mustSave(t, w, Update{Group: 1, Entries: d1}, Update{Group: 1, Entries: d2})
	checkLog(t, w.Storage(1), append(append(slices.Clone(want), d1[0]), d2...))
	// Appends after a restart continue the truncated log.
	mustSave(t, w, Update{Group: 1, Entries: mkEnts(9, 1, 5, 1, 1)})
	want = want[:8]
	c := mkEnts(9, 2, 2, 10, 4)
	mustSave(t, w, Update{Group: 1, Entries: c})
	want = append(want, c...)
	checkLog(t, w.Storage(1), want)
}

func TestSnapshotAndCompaction(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, nil)
	ents := mkEnts(1, 100, 3, 20, 1)
	mustSave(t, w, Update{Group: 5, Entries: ents, HardState: hs(3, 1, 100)})
	cs := &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}
	snap := &pb.Snapshot{Data: []byte("epochs"), Metadata: &pb.SnapshotMetadata{Index: new(uint64(60)), ConfState: cs}}
	if err := w.CreateSnapshot(5, snap, 50); err != nil {
		t.Fatal(err)
	}
	old := &pb.Snapshot{Data: []byte("old"), Metadata: &pb.SnapshotMetadata{Index: new(uint64(55)), ConfState: cs}}
	if err := w.CreateSnapshot(5, old, 55); err != nil {
		t.Fatalf("older snapshot: %v, want nil (ignored)", err)
	}
	if err := w.CreateSnapshot(5, &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(uint64(70))}}, 80); !errors.Is(err, ErrCompactBeyondSnapshot) {
		t.Fatalf("compact beyond snapshot: %v", err)
	}
	if err := w.CreateSnapshot(5, &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(uint64(101))}}, 0); !errors.Is(err, ErrSnapshotBeyondLog) {
		t.Fatalf("snapshot beyond log: %v", err)
	}
	check := func(w *WAL) {
		t.Helper()
		s := w.Storage(5)
		if fi, _ := s.FirstIndex(); fi != 51 {
			t.Fatalf("FirstIndex = %d, want 51", fi)
		}
		if term, err := s.Term(50); err != nil || term != 3 {
			t.Fatalf("Term(50) = %d, %v", term, err)
		}
		if _, err := s.Term(49); !errors.Is(err, raft.ErrCompacted) {
			t.Fatalf("Term(49): %v, want ErrCompacted", err)
		}
		if _, err := s.Entries(50, 52, 1<<30); !errors.Is(err, raft.ErrCompacted) {
			t.Fatalf("Entries(50): %v, want ErrCompacted", err)
		}
		checkLog(t, s, ents[50:])
		got, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if got.GetMetadata().GetIndex() != 60 || got.GetMetadata().GetTerm() != 3 || string(got.Data) != "epochs" {
			t.Fatalf("Snapshot = %v", got)
		}
		_, gotCS, _ := s.InitialState()
		if !slices.Equal(gotCS.Voters, cs.Voters) || !slices.Equal(gotCS.Learners, cs.Learners) {
			t.Fatalf("ConfState = %v, want %v", gotCS, cs)
		}
	}
	check(w)
	w.Close()
	w = openT(t, dir, nil)
	check(w)

	// A snapshot received from a leader resets the log after it.
	recv := &pb.Snapshot{Data: []byte("s2"), Metadata: &pb.SnapshotMetadata{Index: new(uint64(500)), Term: new(uint64(7)), ConfState: cs}}
	next := mkEnts(501, 3, 7, 10, 9)
	mustSave(t, w, Update{Group: 5, Snapshot: recv, Entries: next, HardState: hs(7, 2, 500)})
	checkAfterRecv := func(w *WAL) {
		t.Helper()
		s := w.Storage(5)
		if fi, _ := s.FirstIndex(); fi != 501 {
			t.Fatalf("FirstIndex = %d, want 501", fi)
		}
		if term, _ := s.Term(500); term != 7 {
			t.Fatalf("Term(500) = %d, want 7", term)
		}
		checkLog(t, s, next)
		checkHardState(t, s, hs(7, 2, 500))
		if sn, _ := s.Snapshot(); sn.GetMetadata().GetIndex() != 500 || string(sn.Data) != "s2" {
			t.Fatalf("Snapshot = %v", sn)
		}
	}
	checkAfterRecv(w)
	w.Close()
	w = openT(t, dir, nil)
	defer w.Close()
	checkAfterRecv(w)
}

func TestRemoveGroup(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, nil)
	mustSave(t, w, Update{Group: 1, Entries: mkEnts(1, 3, 1, 10, 1), HardState: hs(1, 1, 1)},
		Update{Group: 2, Entries: mkEnts(1, 3, 1, 10, 2)})
	if err := w.RemoveGroup(1); err != nil {
		t.Fatal(err)
	}
	if got := w.Groups(); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("Groups = %v, want [2]", got)
	}
	w.Close()
	w = openT(t, dir, nil)
	defer w.Close()
	if got := w.Groups(); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("Groups after reopen = %v, want [2]", got)
	}
	if last, _ := w.Storage(1).LastIndex(); last != 0 {
		t.Fatalf("removed group has LastIndex %d", last)
	}
	checkLog(t, w.Storage(2), mkEnts(1, 3, 1, 10, 2))
}

// TestTornTailEveryOffset cuts the last record at every byte offset, with
// nothing, zeros or garbage after the cut, and checks that Open keeps the
// earlier records, drops the torn one, and that appends work afterwards.
func TestTornTailEveryOffset(t *testing.T) {
	src := t.TempDir()
	const segSize = 64 << 10
	w := openT(t, src, func(c *Config) { c.SegmentSize = segSize })
	first := mkEnts(1, 5, 1, 30, 1)
	mustSave(t, w, Update{Group: 3, Entries: first, HardState: hs(1, 1, 3)})
	w.mu.Lock()
	before := w.writeOff
	w.mu.Unlock()
	torn := mkEnts(6, 2, 1, 40, 2)
	mustSave(t, w, Update{Group: 3, Entries: torn})
	w.mu.Lock()
	after := w.writeOff
	w.mu.Unlock()
	w.Close()
	seg := filepath.Join(src, segmentName(1))
	full, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(42))
	variants := []string{"truncated", "zeros", "garbage"}
	for cut := before; cut < after; cut++ {
		for _, v := range variants {
			dir := t.TempDir()
			img := slices.Clone(full[:cut])
			switch v {
			case "zeros":
				img = append(img, make([]byte, segSize-len(img))...)
			case "garbage":
				g := make([]byte, 64)
				rng.Read(g)
				img = append(img, g...)
			}
			if err := os.WriteFile(filepath.Join(dir, segmentName(1)), img, 0o644); err != nil {
				t.Fatal(err)
			}
			w, err := Open(Config{Dir: dir, SegmentSize: segSize, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("cut %d (%s): Open: %v", cut, v, err)
			}
			checkLog(t, w.Storage(3), first)
			checkHardState(t, w.Storage(3), hs(1, 1, 3))
			again := mkEnts(6, 1, 2, 8, int64(cut))
			if err := w.Save([]Update{{Group: 3, Entries: again}}); err != nil {
				t.Fatalf("cut %d (%s): Save after repair: %v", cut, v, err)
			}
			w.Close()
			w, err = Open(Config{Dir: dir, SegmentSize: segSize, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("cut %d (%s): second Open: %v", cut, v, err)
			}
			checkLog(t, w.Storage(3), append(slices.Clone(first), again...))
			w.Close()
		}
	}
}

func TestCorruptionInOldSegmentIsAnError(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, func(c *Config) { c.SegmentSize = 4 << 10 })
	for i := uint64(0); i < 20; i++ {
		mustSave(t, w, Update{Group: 1, Entries: mkEnts(1+i*4, 4, 1, 200, int64(i))})
	}
	if n := w.SegmentCount(); n < 3 {
		t.Fatalf("SegmentCount = %d, want >= 3", n)
	}
	w.Close()
	seg := filepath.Join(dir, segmentName(1))
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[segHeaderSize+recHeaderSize+40] ^= 0x01
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: dir, SegmentSize: 4 << 10, Logger: quietLogger()}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open with a flipped bit in segment 1: %v, want ErrCorrupt", err)
	}
	// A missing middle segment is corruption too.
	b[segHeaderSize+recHeaderSize+40] ^= 0x01
	os.WriteFile(seg, b, 0o644)
	os.Remove(filepath.Join(dir, segmentName(2)))
	if _, err := Open(Config{Dir: dir, SegmentSize: 4 << 10, Logger: quietLogger()}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open without segment 2: %v, want ErrCorrupt", err)
	}
}

// TestGroupCommitConcurrent: goroutines save to their own groups at once;
// everything reads back after a restart, with fewer fsyncs than Saves.
func TestGroupCommitConcurrent(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, func(c *Config) {
		c.SegmentSize = 256 << 10
		c.Knobs.SyncDelay = time.Millisecond
	})
	const groups, saves = 8, 40
	want := make([][]*pb.Entry, groups)
	wantHS := make([]*pb.HardState, groups)
	var wg sync.WaitGroup
	for g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g)))
			next := uint64(1)
			var log []*pb.Entry
			for i := range saves {
				n := uint64(1 + rng.Intn(3))
				first := next
				if i > 0 && rng.Intn(5) == 0 {
					first = next - 1 // rewrite the last entry (new term)
				}
				ents := mkEnts(first, n, uint64(1+i), 1+rng.Intn(3000), rng.Int63())
				st := hs(uint64(1+i), uint64(g), first-1)
				if err := w.Save([]Update{{Group: uint64(100 + g), Entries: ents, HardState: st}}); err != nil {
					t.Errorf("group %d: %v", g, err)
					return
				}
				log = append(log[:first-1], ents...)
				next = first + n
				wantHS[g] = st
			}
			want[g] = log
		}()
	}
	wg.Wait()
	st := w.Stats()
	if st.Saves != groups*saves {
		t.Fatalf("Stats.Saves = %d, want %d", st.Saves, groups*saves)
	}
	if st.Syncs >= st.Saves {
		t.Fatalf("no group commit: %d syncs for %d saves", st.Syncs, st.Saves)
	}
	t.Logf("%d saves, %d syncs, max %d per sync, %d segments", st.Saves, st.Syncs, st.MaxBatchSaves, st.Segments)
	w.Close()
	w = openT(t, dir, func(c *Config) { c.SegmentSize = 256 << 10 })
	defer w.Close()
	for g := range groups {
		checkLog(t, w.Storage(uint64(100+g)), want[g])
		checkHardState(t, w.Storage(uint64(100+g)), wantHS[g])
	}
}

// TestSegmentRolloverAndRemoval: segments are removed only once every group
// compacted past them; PinningGroups names the laggards; restart finds
// every group's HardState, snapshot and remaining entries.
func TestSegmentRolloverAndRemoval(t *testing.T) {
	dir := t.TempDir()
	cfg := func(c *Config) { c.SegmentSize = 8 << 10; c.CacheBytes = 1 << 10 }
	w := openT(t, dir, cfg)
	logs := map[uint64][]*pb.Entry{}
	for i := uint64(0); i < 40; i++ {
		for _, g := range []uint64{1, 2} {
			ents := mkEnts(1+i*2, 2, 1, 300, int64(i*10+g))
			logs[g] = append(logs[g], ents...)
			mustSave(t, w, Update{Group: g, Entries: ents, HardState: hs(1, g, i*2)})
		}
	}
	n := w.SegmentCount()
	if n < 4 {
		t.Fatalf("SegmentCount = %d, want >= 4", n)
	}
	if got := w.PinningGroups(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("PinningGroups = %v, want [1 2]", got)
	}
	snap := func(idx uint64, data string) *pb.Snapshot {
		return &pb.Snapshot{Data: []byte(data), Metadata: &pb.SnapshotMetadata{Index: new(idx), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}
	}
	if err := w.CreateSnapshot(1, snap(70, "g1"), 70); err != nil {
		t.Fatal(err)
	}
	if got := w.SegmentCount(); got != n {
		t.Fatalf("segments removed while group 2 still needs them: %d -> %d", n, got)
	}
	if got := w.PinningGroups(); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("PinningGroups = %v, want [2]", got)
	}
	pins := w.PinningIndexes()
	if len(pins) != 1 || pins[2] == 0 || pins[2] > 72 {
		t.Fatalf("PinningIndexes = %v, want group 2 with an index in (0, 72]", pins)
	}
	if err := w.CreateSnapshot(2, snap(75, "g2"), 72); err != nil {
		t.Fatal(err)
	}
	// Write on so that the compacted segments are behind the active one.
	for i := uint64(0); i < 10; i++ {
		for _, g := range []uint64{1, 2} {
			ents := mkEnts(81+i, 1, 2, 300, int64(1000+i*10+g))
			logs[g] = append(logs[g], ents...)
			mustSave(t, w, Update{Group: g, Entries: ents, HardState: hs(2, g, 80+i)})
		}
	}
	got := w.SegmentCount()
	if got >= n {
		t.Fatalf("SegmentCount = %d after compaction, want fewer than %d", got, n)
	}
	if st := w.Stats(); st.SegmentsRemoved == 0 {
		t.Fatalf("Stats.SegmentsRemoved = 0")
	}
	check := func(w *WAL) {
		t.Helper()
		checkLog(t, w.Storage(1), logs[1][70:])
		checkLog(t, w.Storage(2), logs[2][72:])
		checkHardState(t, w.Storage(1), hs(2, 1, 89))
		checkHardState(t, w.Storage(2), hs(2, 2, 89))
		for g, want := range map[uint64]string{1: "g1", 2: "g2"} {
			s, _ := w.Storage(g).Snapshot()
			if string(s.Data) != want {
				t.Fatalf("group %d snapshot data %q, want %q", g, s.Data, want)
			}
		}
	}
	check(w)
	w.Close()
	w = openT(t, dir, cfg)
	check(w)
	// Removing a group unpins the segments it alone kept.
	for i := uint64(0); i < 30; i++ {
		mustSave(t, w, Update{Group: 3, Entries: mkEnts(1+i, 1, 1, 300, int64(i))})
	}
	if err := w.CreateSnapshot(1, snap(90, "g1b"), 90); err != nil {
		t.Fatal(err)
	}
	if err := w.CreateSnapshot(2, snap(90, "g2b"), 90); err != nil {
		t.Fatal(err)
	}
	if pins := w.PinningGroups(); !slices.Equal(pins, []uint64{3}) {
		t.Fatalf("PinningGroups = %v, want [3]", pins)
	}
	if err := w.RemoveGroup(3); err != nil {
		t.Fatal(err)
	}
	if pins := w.PinningGroups(); len(pins) != 0 {
		t.Fatalf("PinningGroups = %v after RemoveGroup(3), want none", pins)
	}
	if got := w.SegmentCount(); got != 1 {
		t.Fatalf("SegmentCount = %d with everything compacted, want 1", got)
	}
	w.Close()
	w = openT(t, dir, cfg)
	defer w.Close()
	if got := w.Groups(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("Groups = %v, want [1 2]", got)
	}
	for g, want := range map[uint64]string{1: "g1b", 2: "g2b"} {
		s := w.Storage(g)
		if fi, _ := s.FirstIndex(); fi != 91 {
			t.Fatalf("group %d FirstIndex = %d, want 91", g, fi)
		}
		if term, _ := s.Term(90); term != 2 {
			t.Fatalf("group %d Term(90) = %d, want 2", g, term)
		}
		sn, _ := s.Snapshot()
		if string(sn.Data) != want {
			t.Fatalf("group %d snapshot data %q, want %q", g, sn.Data, want)
		}
		checkHardState(t, s, hs(2, g, 89))
	}
}

func TestFailedSyncStopsTheWAL(t *testing.T) {
	dir := t.TempDir()
	var fail bool
	var mu sync.Mutex
	w := openT(t, dir, func(c *Config) {
		c.Knobs.BeforeSync = func() error {
			mu.Lock()
			defer mu.Unlock()
			if fail {
				return errors.New("injected EIO")
			}
			return nil
		}
	})
	ok := mkEnts(1, 3, 1, 10, 1)
	mustSave(t, w, Update{Group: 1, Entries: ok})
	mu.Lock()
	fail = true
	mu.Unlock()
	if err := w.Save([]Update{{Group: 1, Entries: mkEnts(4, 1, 1, 10, 2)}}); !errors.Is(err, ErrFailed) {
		t.Fatalf("Save with failing sync: %v, want ErrFailed", err)
	}
	if err := w.Save([]Update{{Group: 1, Entries: mkEnts(4, 1, 1, 10, 2)}}); !errors.Is(err, ErrFailed) {
		t.Fatalf("Save after failure: %v, want ErrFailed", err)
	}
	// The failed batch was never acknowledged: the index does not show it.
	checkLog(t, w.Storage(1), ok)
	w.Close()
}

func TestEntriesMaxSizeAndDiskReads(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, func(c *Config) { c.CacheBytes = 2 << 10 })
	defer w.Close()
	ents := mkEnts(1, 50, 1, 500, 1)
	mustSave(t, w, Update{Group: 1, Entries: ents})
	// Entries not applied yet stay cached beyond the limit (up to 32 ×).
	if st := w.Stats(); st.CachedBytes != 50*500 {
		t.Fatalf("CachedBytes = %d before any apply, want all %d", st.CachedBytes, 50*500)
	}
	w.SetApplied(1, 10)
	if st := w.Stats(); st.CachedBytes != 40*500 {
		t.Fatalf("CachedBytes = %d with 10 applied, want the %d not applied", st.CachedBytes, 40*500)
	}
	w.SetApplied(1, 50)
	if st := w.Stats(); st.CachedBytes > 2<<10 || st.CachedBytes == 0 {
		t.Fatalf("CachedBytes = %d, want (0, 2048]", st.CachedBytes)
	}
	more := mkEnts(51, 200, 1, 500, 2)
	mustSave(t, w, Update{Group: 1, Entries: more})
	if st := w.Stats(); st.CachedBytes > 32*2<<10 {
		t.Fatalf("CachedBytes = %d with nothing more applied, want at most 32 × 2048", st.CachedBytes)
	}
	s := w.Storage(1)
	size := uint64(proto.Size(ents[0]))
	for _, tc := range []struct {
		max  uint64
		want int
	}{{0, 1}, {size - 1, 1}, {size, 1}, {2 * size, 2}, {10*size + 1, 10}, {1 << 40, 50}} {
		got, err := s.Entries(1, 51, tc.max) // 1..50: read from disk but the last few
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != tc.want {
			t.Fatalf("Entries(maxSize=%d) returned %d entries, want %d", tc.max, len(got), tc.want)
		}
		for i := range got {
			if !proto.Equal(got[i], ents[i]) {
				t.Fatalf("entry %d differs", i+1)
			}
		}
	}
}

func TestBigBatchLargerThanSegment(t *testing.T) {
	dir := t.TempDir()
	cfg := func(c *Config) { c.SegmentSize = 4 << 10 }
	w := openT(t, dir, cfg)
	small := mkEnts(1, 1, 1, 10, 1)
	mustSave(t, w, Update{Group: 1, Entries: small})
	big := mkEnts(2, 3, 1, 5000, 2)
	mustSave(t, w, Update{Group: 1, Entries: big})
	w.Close()
	w = openT(t, dir, cfg)
	defer w.Close()
	checkLog(t, w.Storage(1), append(small, big...))
}

func TestStatsMeans(t *testing.T) {
	s := Stats{Saves: 10, Syncs: 4, SyncTime: 8 * time.Millisecond}
	if s.MeanBatchSaves() != 2.5 || s.MeanSyncTime() != 2*time.Millisecond {
		t.Fatalf("means: %v %v", s.MeanBatchSaves(), s.MeanSyncTime())
	}
	if (Stats{}).MeanBatchSaves() != 0 || (Stats{}).MeanSyncTime() != 0 {
		t.Fatal("means of empty stats are not 0")
	}
}

// TestConcurrentReadersCompactionAndRemoval runs a writer, a snapshotter and
// a reader on one group at once, with the cache off so that reads go to
// segments that compaction is removing. Readers see either correct entries
// or raft.ErrCompacted, never anything else.
func TestConcurrentReadersCompactionAndRemoval(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, func(c *Config) { c.SegmentSize = 8 << 10; c.CacheBytes = -1 })
	defer w.Close()
	entryAt := func(i uint64) *pb.Entry {
		data := bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 64)
		return &pb.Entry{Term: new(uint64(1)), Index: new(i), Type: new(pb.EntryType_EntryNormal), Data: data}
	}
	const total = 1500
	var applied sync.Mutex
	appliedIdx := uint64(0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // snapshotter
		defer wg.Done()
		var snapped uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			applied.Lock()
			a := appliedIdx
			applied.Unlock()
			if a > snapped+50 {
				sn := &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(a)}}
				if err := w.CreateSnapshot(1, sn, a-10); err != nil {
					t.Errorf("CreateSnapshot(%d): %v", a, err)
					return
				}
				snapped = a
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	go func() { // reader
		defer wg.Done()
		s := w.Storage(1)
		rng := rand.New(rand.NewSource(1))
		for {
			select {
			case <-stop:
				return
			default:
			}
			first, _ := s.FirstIndex()
			lastIdx, _ := s.LastIndex()
			if lastIdx < first {
				continue
			}
			lo := first + uint64(rng.Int63n(int64(lastIdx-first+1)))
			ents, err := s.Entries(lo, lastIdx+1, 1<<20)
			if errors.Is(err, raft.ErrCompacted) {
				continue
			}
			if err != nil {
				t.Errorf("Entries(%d, %d): %v", lo, lastIdx+1, err)
				return
			}
			for j, e := range ents {
				if want := entryAt(lo + uint64(j)); !proto.Equal(e, want) {
					t.Errorf("entry %d has wrong content", lo+uint64(j))
					return
				}
			}
		}
	}()
	for i := uint64(1); i <= total; i += 5 {
		ents := []*pb.Entry{entryAt(i), entryAt(i + 1), entryAt(i + 2), entryAt(i + 3), entryAt(i + 4)}
		mustSave(t, w, Update{Group: 1, Entries: ents})
		applied.Lock()
		appliedIdx = i + 4
		applied.Unlock()
	}
	close(stop)
	wg.Wait()
	if st := w.Stats(); st.SegmentsRemoved == 0 {
		t.Fatalf("no segment was removed (stats %+v)", st)
	}
}

// TestCloseWithSavesInFlight: Close lets queued Saves finish; later ones get
// ErrClosed and write nothing, so after a restart each group's log ends
// exactly at its last acknowledged entry.
func TestCloseWithSavesInFlight(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, func(c *Config) { c.Knobs.SyncDelay = 500 * time.Microsecond })
	const savers = 4
	acked := make([]uint64, savers)
	var wg sync.WaitGroup
	for g := range savers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(1); ; i++ {
				err := w.Save([]Update{{Group: uint64(g + 1), Entries: mkEnts(i, 1, 1, 64, int64(i))}})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Save: %v", err)
					return
				}
				acked[g] = i
			}
		}()
	}
	time.Sleep(30 * time.Millisecond)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	w = openT(t, dir, nil)
	defer w.Close()
	for g := range savers {
		if acked[g] == 0 {
			t.Fatalf("group %d: nothing acknowledged in 30ms", g+1)
		}
		if last, _ := w.Storage(uint64(g + 1)).LastIndex(); last != acked[g] {
			t.Fatalf("group %d: LastIndex %d after restart, last acknowledged %d", g+1, last, acked[g])
		}
	}
}

// TestSegmentFullToTheLastBytes: a segment whose records end less than a
// record header before its end is complete, not torn.
func TestSegmentFullToTheLastBytes(t *testing.T) {
	dir := t.TempDir()
	// One page (segments are whole pages): header 16 + a batch record 21 +
	// one entries record of one 4009-byte entry (12+21+13+4009) leaves 4
	// zero bytes.
	const segSize = 4096
	cfg := func(c *Config) { c.SegmentSize = segSize }
	w := openT(t, dir, cfg)
	a := mkEnts(1, 1, 1, 4009, 1)
	mustSave(t, w, Update{Group: 1, Entries: a})
	w.mu.Lock()
	off := w.writeOff
	w.mu.Unlock()
	if off != segSize-4 {
		t.Fatalf("write offset %d, want %d", off, segSize-4)
	}
	b := mkEnts(2, 1, 1, 4009, 2)
	mustSave(t, w, Update{Group: 1, Entries: b})
	if n := w.SegmentCount(); n != 2 {
		t.Fatalf("SegmentCount = %d, want 2", n)
	}
	w.Close()
	w = openT(t, dir, cfg)
	defer w.Close()
	checkLog(t, w.Storage(1), append(a, b...))
}

// TestEntriesSplitIntoRecords: an Update larger than a record is written as
// several records and reads back whole; an entry larger than a record is
// refused.
func TestEntriesSplitIntoRecords(t *testing.T) {
	defer func(old int) { entriesRecordMax = old }(entriesRecordMax)
	entriesRecordMax = 1000
	dir := t.TempDir()
	w := openT(t, dir, nil)
	ents := mkEnts(1, 20, 1, 300, 1)
	mustSave(t, w, Update{Group: 1, Entries: ents, HardState: hs(1, 1, 20)})
	if err := w.Save([]Update{{Group: 1, Entries: mkEnts(21, 1, 1, 1000, 2)}}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized entry: %v, want ErrTooLarge", err)
	}
	w.mu.Lock()
	end := w.writeOff
	w.mu.Unlock()
	w.Close()
	b, err := os.ReadFile(filepath.Join(dir, segmentName(1)))
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	for off := segHeaderSize; off < int(end); {
		n, st := checkRecord(b[off:], segTag(1))
		if st != recOK {
			t.Fatalf("bad record at %d", off)
		}
		if n > entriesRecordMax {
			t.Fatalf("record of %d bytes, limit %d", n, entriesRecordMax)
		}
		records++
		off += recHeaderSize + n
	}
	if records < 7 { // 20 entries of 313 bytes, 3 per record, plus the hard state
		t.Fatalf("%d records, want at least 7", records)
	}
	w = openT(t, dir, nil)
	defer w.Close()
	checkLog(t, w.Storage(1), ents)
}

// TestRolloverUsesPreparedSegment: once the active segment is half full the
// next file is prepared in the background and the rollover uses it; Close
// leaves no temporary file behind.
func TestRolloverUsesPreparedSegment(t *testing.T) {
	dir := t.TempDir()
	cfg := func(c *Config) { c.SegmentSize = 32 << 10 }
	w := openT(t, dir, cfg)
	var want []*pb.Entry
	for i := uint64(1); i <= 60; i++ {
		e := mkEnts(i, 1, 1, 2000, int64(i))
		want = append(want, e...)
		mustSave(t, w, Update{Group: 1, Entries: e})
		waitPreparer(w) // so that every rollover can use a prepared file
	}
	st := w.Stats()
	if st.Rollovers < 2 || st.PreparedSegments != st.Rollovers {
		t.Fatalf("Rollovers %d, PreparedSegments %d: want every rollover (>= 2) prepared", st.Rollovers, st.PreparedSegments)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, "*.tmp"))
	if len(tmps) != 0 {
		t.Fatalf("temporary files left after Close: %v", tmps)
	}
	w = openT(t, dir, cfg)
	defer w.Close()
	checkLog(t, w.Storage(1), want)
}

// TestRecycledSegments: removed segment files are reused for new segments
// (no zero-fill); the old records left in them read as the end of the log,
// and a torn write over them is cut at every byte like one over zeros.
func TestRecycledSegments(t *testing.T) {
	src := t.TempDir()
	const segSize = 16 << 10
	cfg := func(c *Config) { c.SegmentSize = segSize }
	w := openT(t, src, cfg)
	var want []*pb.Entry
	idx := uint64(0)
	for w.Stats().RecycledSegments < 3 || !activeRecycled(t, w) {
		if idx > 2000 {
			t.Fatalf("no recycling after %d entries: %+v", idx, w.Stats())
		}
		idx++
		e := mkEnts(idx, 1, 1, 2000, int64(idx))
		want = append(want, e...)
		mustSave(t, w, Update{Group: 1, Entries: e, HardState: hs(1, 1, idx)})
		if idx%8 == 0 {
			snap := &pb.Snapshot{Data: []byte("s"), Metadata: &pb.SnapshotMetadata{
				Index: new(idx), Term: new(uint64(1)), ConfState: &pb.ConfState{Voters: []uint64{1}}}}
			if err := w.CreateSnapshot(1, snap, idx); err != nil {
				t.Fatal(err)
			}
			want = nil
		}
		waitPreparer(w)
	}
	w.mu.Lock()
	active := w.segs[len(w.segs)-1]
	before := w.writeOff
	w.mu.Unlock()
	pre, err := os.ReadFile(active.path)
	if err != nil {
		t.Fatal(err)
	}
	torn := mkEnts(idx+1, 2, 1, 300, 99)
	mustSave(t, w, Update{Group: 1, Entries: torn})
	w.mu.Lock()
	after := w.writeOff
	w.mu.Unlock()
	w.Close()
	post, err := os.ReadFile(active.path)
	if err != nil {
		t.Fatal(err)
	}
	w = openT(t, src, cfg)
	checkLog(t, w.Storage(1), append(slices.Clone(want), torn...))
	w.Close()

	// A crash during the write leaves the new bytes up to cut and the old
	// ones after it.
	for cut := int(before); cut < int(after); cut++ {
		dir := t.TempDir()
		if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		img := append(slices.Clone(post[:cut]), pre[cut:]...)
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(active.path)), img, 0o644); err != nil {
			t.Fatal(err)
		}
		w := openT(t, dir, cfg)
		got := logOf(t, w.Storage(1))
		if len(got) != len(want) && len(got) != len(want)+len(torn) {
			t.Fatalf("cut %d: %d entries after restart, want %d (torn write lost) or %d", cut, len(got), len(want), len(want)+len(torn))
		}
		checkLog(t, w.Storage(1), append(slices.Clone(want), torn[:len(got)-len(want)]...))
		again := mkEnts(idx+1, 1, 2, 8, int64(cut))
		mustSave(t, w, Update{Group: 1, Entries: again})
		w.Close()
		w = openT(t, dir, cfg)
		checkLog(t, w.Storage(1), append(slices.Clone(want), again...))
		w.Close()
	}
}

// activeRecycled tells whether the active segment is a recycled file (old
// records, not zeros, after the last record) with room for 2 KiB more.
func activeRecycled(t *testing.T, w *WAL) bool {
	w.mu.Lock()
	path, off := w.segs[len(w.segs)-1].path, w.writeOff
	w.mu.Unlock()
	if off+2048 > w.cfg.SegmentSize {
		return false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return !allZero(b[off:])
}

// waitPreparer waits until no spare segment is being prepared.
func waitPreparer(w *WAL) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		w.mu.Lock()
		busy := w.preparing
		w.mu.Unlock()
		if !busy || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSaveAsyncPipelined: a group's SaveAsyncs may overlap. The second is
// accepted (it follows the first, not yet durable) while the first waits in
// its fdatasync; callbacks come once each, in call order, after durability;
// an invalid update is refused at once with nothing written; everything
// acknowledged is there after a reopen.
func TestSaveAsyncPipelined(t *testing.T) {
	dir := t.TempDir()
	release := make(chan struct{})
	var syncs sync.WaitGroup
	syncs.Add(1)
	var once sync.Once
	w := openT(t, dir, func(c *Config) {
		c.Knobs.BeforeSync = func() error {
			once.Do(func() { syncs.Done(); <-release }) // hold the first batch
			return nil
		}
	})
	var mu sync.Mutex
	var order []int
	all := make(chan struct{})
	done := func(i int) func(error) {
		return func(err error) {
			if err != nil {
				t.Errorf("save %d: %v", i, err)
			}
			mu.Lock()
			order = append(order, i)
			if len(order) == 4 {
				close(all)
			}
			mu.Unlock()
		}
	}
	a, b := mkEnts(1, 3, 1, 100, 1), mkEnts(4, 3, 1, 100, 2)
	w.SaveAsync([]Update{{Group: 1, HardState: hs(1, 1, 0), Entries: a}}, done(0))
	syncs.Wait() // the first batch is in its fdatasync
	w.SaveAsync([]Update{{Group: 1, Entries: b}}, done(1))
	w.SaveAsync([]Update{{Group: 1, HardState: hs(1, 1, 3), NoSync: true}}, done(2))
	w.SaveAsync([]Update{{Group: 1}}, done(3)) // nothing to write: still in order
	var gapErr error
	w.SaveAsync([]Update{{Group: 1, Entries: mkEnts(9, 1, 1, 10, 3)}}, func(err error) { gapErr = err })
	if !errors.Is(gapErr, ErrGap) {
		t.Fatalf("SaveAsync of a gap: %v (called at once?), want ErrGap", gapErr)
	}
	mu.Lock()
	if len(order) != 0 {
		t.Fatalf("callbacks %v ran before the first batch was durable", order)
	}
	mu.Unlock()
	close(release)
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatal("SaveAsync callbacks did not all run")
	}
	if !slices.Equal(order, []int{0, 1, 2, 3}) {
		t.Fatalf("callbacks ran in order %v, want 0 1 2 3", order)
	}
	want := append(slices.Clone(a), b...)
	checkLog(t, w.Storage(1), want)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = openT(t, dir, nil)
	defer w.Close()
	checkLog(t, w.Storage(1), want)
	checkHardState(t, w.Storage(1), hs(1, 1, 3))
}

// TestSaveAsyncAfterFailure: on a failed or closed WAL, SaveAsync's callback
// still runs, at once, with the error (a caller waiting for it must not hang).
func TestSaveAsyncAfterFailure(t *testing.T) {
	w := openT(t, t.TempDir(), func(c *Config) {
		c.Knobs.BeforeSync = func() error { return errors.New("injected EIO") }
	})
	errs := make(chan error, 3)
	w.SaveAsync([]Update{{Group: 1, Entries: mkEnts(1, 1, 1, 10, 1)}}, func(err error) { errs <- err })
	if err := <-errs; !errors.Is(err, ErrFailed) {
		t.Fatalf("failed fdatasync: %v, want ErrFailed", err)
	}
	atOnce := func(what string, want error) {
		t.Helper()
		w.SaveAsync([]Update{{Group: 1, Entries: mkEnts(1, 1, 1, 10, 1)}}, func(err error) { errs <- err })
		select {
		case err := <-errs:
			if !errors.Is(err, want) {
				t.Fatalf("SaveAsync on a %s WAL: %v, want %v", what, err, want)
			}
		default:
			t.Fatalf("SaveAsync on a %s WAL did not call back at once", what)
		}
	}
	atOnce("failed", ErrFailed)
	w.Close()
	atOnce("closed", ErrClosed)
}

// TestAppendsWriteWholePages: every append rewrites the start of its first
// page and zero-fills the rest of its last one, so the kernel never reads a
// page in first (preallocated pages are not cached), and large ones go with
// O_DIRECT, mixed with buffered ones in the same pages. Garbage put after the
// last record (as a recycled file holds) is cleared up to the page end by
// the next append, and the log reads back the same after every reopen, which
// reloads the partial last page.
func TestAppendsWriteWholePages(t *testing.T) {
	dir := t.TempDir()
	// No entry cache: the log is read back from the files, where batches of
	// 64 KiB and more were written with O_DIRECT and the rest buffered.
	cfg := func(c *Config) { c.SegmentSize = 512 << 10; c.CacheBytes = -1 }
	w := openT(t, dir, cfg)
	rng := rand.New(rand.NewSource(1))
	var want []*pb.Entry
	rollovers := 0
	for i := uint64(1); i <= 120; i++ {
		size := rng.Intn(9000)
		if i%5 == 0 {
			size = directMinBytes + rng.Intn(100<<10)
		}
		e := mkEnts(i, 1, 1, size, int64(i))
		want = append(want, e...)
		mustSave(t, w, Update{Group: 1, Entries: e})
		w.mu.Lock()
		path, off := w.segs[len(w.segs)-1].path, w.writeOff
		w.mu.Unlock()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if end := roundUp(off); !allZero(b[off:end]) {
			t.Fatalf("save %d: bytes after the last record up to the page end (%d..%d) are not zero", i, off, end)
		}
		// Scribble over the rest of the page, as old records would be.
		if end := roundUp(off); end > off {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, int(end-off)), off); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		if i%5 == 0 && w.direct.fd < 0 && !w.direct.refused {
			t.Fatalf("save %d: a %d-byte entry was not written with O_DIRECT", i, size)
		}
		if i%10 == 0 {
			checkLog(t, w.Storage(1), want)
			rollovers += int(w.Stats().Rollovers)
			w.Close()
			w = openT(t, dir, cfg)
			checkLog(t, w.Storage(1), want)
		}
		waitPreparer(w)
	}
	if rollovers < 5 {
		t.Fatalf("only %d rollovers: the test should cross segments", rollovers)
	}
	w.Close()
	w = openT(t, dir, cfg)
	defer w.Close()
	checkLog(t, w.Storage(1), want)
}

// TestPreallocateWithoutODirect: on a file system that refuses O_DIRECT
// (tmpfs) the zeros go through the page cache, and a file cut mid-page keeps
// its bytes before the cut.
func TestPreallocateWithoutODirect(t *testing.T) {
	for _, dir := range []string{t.TempDir(), "/dev/shm"} {
		if _, err := os.Stat(dir); err != nil {
			t.Logf("skipping %s: %v", dir, err)
			continue
		}
		f, err := os.CreateTemp(dir, "prealloc")
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(f.Name())
		head := bytes.Repeat([]byte{7}, 5000)
		if _, err := f.Write(head); err != nil {
			t.Fatal(err)
		}
		if err := preallocate(f, 3<<20+100); err != nil {
			t.Fatalf("%s: preallocate: %v", dir, err)
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 3<<20+100 || !bytes.Equal(b[:len(head)], head) || !allZero(b[len(head):]) {
			t.Fatalf("%s: preallocated file: %d bytes, head kept %v, zeros after %v", dir, len(b),
				bytes.Equal(b[:len(head)], head), allZero(b[len(head):]))
		}
		f.Close()
	}
}

// TestStalled: Stalled is 0 on an idle WAL, grows while a batch's fdatasync
// hangs (the calls queued behind it do not reset it) and is 0 again once
// everything waiting is durable.
func TestStalled(t *testing.T) {
	hold := make(chan struct{})
	var held sync.Once
	inSync := make(chan struct{})
	w := openT(t, t.TempDir(), func(c *Config) {
		c.Knobs.BeforeSync = func() error {
			select {
			case <-hold:
			default:
				held.Do(func() { close(inSync) })
				<-hold
			}
			return nil
		}
	})
	defer w.Close()
	if d := w.Stalled(); d != 0 {
		t.Fatalf("Stalled on an idle WAL = %s, want 0", d)
	}
	saved := make(chan error, 2)
	go func() { saved <- w.Save([]Update{{Group: 1, Entries: mkEnts(1, 1, 1, 10, 1)}}) }()
	<-inSync
	go func() { saved <- w.Save([]Update{{Group: 1, Entries: mkEnts(2, 1, 1, 10, 2)}}) }()
	// Poll until the hung sync shows: no bound on how fast it grows.
	var seen time.Duration
	for deadline := time.Now().Add(60 * time.Second); seen < 200*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Stalled = %s 60 s into a hung fdatasync", seen)
		}
		if d := w.Stalled(); d < seen {
			t.Fatalf("Stalled went down from %s to %s while the sync hung", seen, d)
		} else {
			seen = d
		}
	}
	close(hold)
	for range 2 {
		if err := <-saved; err != nil {
			t.Fatal(err)
		}
	}
	if d := w.Stalled(); d != 0 {
		t.Fatalf("Stalled once every Save returned = %s, want 0", d)
	}
}
