package wal

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
)

// Tests of Open's choice between a torn tail (cut it) and corruption of
// durable data (ErrCorrupt), and of the segment format versions it reads.

// writeOffT returns the WAL's next write offset in the active segment.
func writeOffT(w *WAL) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeOff
}

// span is the bytes [start, end) of one batch in segment 1.
type span struct{ start, end int64 }

// openAt opens dir with the test's segment size and a logger into buf.
func openAt(dir string, segSize int64, buf *bytes.Buffer) (*WAL, error) {
	lg := quietLogger()
	if buf != nil {
		lg = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return Open(Config{Dir: dir, SegmentSize: segSize, Logger: lg})
}

// damage is one way of spoiling the bytes at off of a segment image, not
// beyond end.
type damage struct {
	name string
	do   func(b []byte, off, end int64)
}

var damages = []damage{
	{"flip", func(b []byte, off, end int64) { b[off] ^= 0x20 }},
	// Zeros: where a record header was, they read as the end of the records.
	{"zero8", func(b []byte, off, end int64) { clear(b[off:min(off+8, end)]) }},
}

// TestCorruptionMidLastSegmentIsAnError: a flipped byte in the middle of the
// last segment, with records written (and synced) after it, is corruption of
// acknowledged data, not a torn tail. Open fails with ErrCorrupt and leaves
// the file alone; nothing is cut.
func TestCorruptionMidLastSegmentIsAnError(t *testing.T) {
	dir := t.TempDir()
	const segSize = 256 << 10
	w := openT(t, dir, func(c *Config) { c.SegmentSize = segSize })
	var all []*pb.Entry
	for i := range uint64(10) {
		ents := mkEnts(1+i*4, 4, 1, 500, int64(i))
		mustSave(t, w, Update{Group: 1, Entries: ents, HardState: hs(1, 1, 1+i*4)})
		all = append(all, ents...)
	}
	end := writeOffT(w)
	w.Close()
	seg := filepath.Join(dir, segmentName(1))
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[end/2] ^= 0x01
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = openAt(dir, segSize, nil)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open with a flipped byte at %d of %d: %v, want ErrCorrupt", end/2, end, err)
	}
	if after, _ := os.ReadFile(seg); !bytes.Equal(after, b) {
		t.Fatal("Open changed the corrupt segment")
	}
	// Repaired by hand, it reads whole: nothing was cut.
	b[end/2] ^= 0x01
	os.WriteFile(seg, b, 0o644)
	w, err = openAt(dir, segSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	checkLog(t, w.Storage(1), all)
}

// TestEveryDamagedDurableBatchIsAnError damages each batch of a segment in
// turn, at its first bytes (the batch record), in the middle and at its last
// byte, by a flipped byte or by zeros: every batch that a later batch shows
// was durable makes Open fail with ErrCorrupt, the file untouched. The last
// batch has no later one: damage to it reads as a torn tail and is cut (the
// documented limit), keeping every batch before it.
func TestEveryDamagedDurableBatchIsAnError(t *testing.T) {
	src := t.TempDir()
	const segSize = 256 << 10
	w := openT(t, src, func(c *Config) { c.SegmentSize = segSize })
	var batches []span
	save := func(u Update) {
		start := writeOffT(w)
		mustSave(t, w, u)
		batches = append(batches, span{start, writeOffT(w)})
	}
	var kept []*pb.Entry // the log without the last batch
	for i := range uint64(6) {
		ents := mkEnts(1+i*3, 3, 2, 40+int(i)*300, int64(i))
		save(Update{Group: 5, Entries: ents, HardState: hs(2, 1, i*3)})
		kept = append(kept, ents...)
	}
	snap := &pb.Snapshot{Data: []byte("s"), Metadata: &pb.SnapshotMetadata{Index: new(uint64(3)), Term: new(uint64(2)),
		ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}
	start := writeOffT(w)
	if err := w.CreateSnapshot(5, snap, 2); err != nil {
		t.Fatal(err)
	}
	batches = append(batches, span{start, writeOffT(w)})
	kept = kept[2:]
	save(Update{Group: 9, HardState: hs(4, 2, 0)})
	save(Update{Group: 5, Entries: mkEnts(19, 2, 2, 20_000, 7)}) // written by reference
	kept = append(kept, mkEnts(19, 2, 2, 20_000, 7)...)
	save(Update{Group: 5, Entries: mkEnts(21, 1, 2, 100, 8)}) // the last batch
	w.Close()
	full, err := os.ReadFile(filepath.Join(src, segmentName(1)))
	if err != nil {
		t.Fatal(err)
	}
	for bi, bt := range batches {
		lastBatch := bi == len(batches)-1
		for _, off := range []int64{bt.start, bt.start + recHeaderSize + 3, (bt.start + bt.end) / 2, bt.end - 1} {
			for _, dm := range damages {
				dir := t.TempDir()
				img := slices.Clone(full)
				dm.do(img, off, bt.end)
				if bytes.Equal(img, full) {
					continue // zeros over zeros
				}
				seg := filepath.Join(dir, segmentName(1))
				if err := os.WriteFile(seg, img, 0o644); err != nil {
					t.Fatal(err)
				}
				var logs bytes.Buffer
				w, err := openAt(dir, segSize, &logs)
				if !lastBatch {
					if !errors.Is(err, ErrCorrupt) {
						if w != nil {
							w.Close()
						}
						t.Fatalf("batch %d of %d [%d, %d), %s at %d: Open: %v, want ErrCorrupt",
							bi, len(batches), bt.start, bt.end, dm.name, off, err)
					}
					if after, _ := os.ReadFile(seg); !bytes.Equal(after, img) {
						t.Fatalf("batch %d, %s at %d: Open changed the corrupt segment", bi, dm.name, off)
					}
					continue
				}
				// The limit: the last synced batch damaged with nothing
				// after it is indistinguishable from a torn tail.
				if err != nil {
					t.Fatalf("last batch, %s at %d: Open: %v", dm.name, off, err)
				}
				checkLog(t, w.Storage(5), kept)
				checkHardState(t, w.Storage(9), hs(4, 2, 0))
				w.Close()
			}
		}
	}
}

// TestTornTailAfterLastSyncIsCut: a batch written without an fdatasync (a
// commit-index HardState, NoSync) is damaged, and a later batch was written
// (synced or not, it carries the mark of the last sync, before the damage):
// a torn tail. Open cuts it with a warning, keeps the HardState synced before
// it and appends afterwards.
func TestTornTailAfterLastSyncIsCut(t *testing.T) {
	dir := t.TempDir()
	const segSize = 64 << 10
	w := openT(t, dir, func(c *Config) { c.SegmentSize = segSize })
	first := mkEnts(1, 4, 3, 100, 1)
	mustSave(t, w, Update{Group: 2, Entries: first, HardState: hs(3, 2, 2)})
	tornAt := writeOffT(w)
	mustSave(t, w, Update{Group: 2, HardState: hs(3, 2, 4), NoSync: true})
	if st := w.Stats(); st.UnsyncedWrites != 1 {
		t.Fatalf("UnsyncedWrites = %d, want 1", st.UnsyncedWrites)
	}
	mustSave(t, w, Update{Group: 2, Entries: mkEnts(5, 1, 3, 100, 2)})
	w.Close()
	seg := filepath.Join(dir, segmentName(1))
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[tornAt+batchRecordSize+recHeaderSize+5] ^= 0xff // inside the NoSync HardState record
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	w, err = openAt(dir, segSize, &logs)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "torn tail cut off") {
		t.Errorf("no warning about the torn tail in:\n%s", logs.String())
	}
	checkLog(t, w.Storage(2), first)
	checkHardState(t, w.Storage(2), hs(3, 2, 2))
	again := mkEnts(5, 2, 4, 10, 3)
	mustSave(t, w, Update{Group: 2, Entries: again, HardState: hs(4, 2, 5)})
	w.Close()
	w, err = openAt(dir, segSize, nil)
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	defer w.Close()
	checkLog(t, w.Storage(2), append(slices.Clone(first), again...))
	checkHardState(t, w.Storage(2), hs(4, 2, 5))
}

// TestOlderFormatStillRead opens a version 3 segment (testdata, written by
// the release before batch records): it reads back, and new batches go to a
// new segment of the current version, the old one left as it was.
func TestOlderFormatStillRead(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "segment-v3.golden"))
	if err != nil {
		t.Fatal(err)
	}
	if v := le.Uint32(old[4:]); v != 3 {
		t.Fatalf("testdata/segment-v3.golden has version %d", v)
	}
	dir := t.TempDir()
	seg1 := filepath.Join(dir, segmentName(1))
	if err := os.WriteFile(seg1, old, 0o644); err != nil {
		t.Fatal(err)
	}
	const g = 0x0000000100000002
	w := openT(t, dir, nil)
	want := []*pb.Entry{
		{Term: new(uint64(2)), Index: new(uint64(2)), Type: new(pb.EntryType_EntryNormal), Data: []byte("write")},
		{Term: new(uint64(2)), Index: new(uint64(3)), Type: new(pb.EntryType_EntryConfChangeV2), Data: []byte{}},
		{Term: new(uint64(2)), Index: new(uint64(4)), Type: new(pb.EntryType_EntryNormal), Data: bytes.Repeat([]byte("by reference "), 8)[:100]},
	}
	checkLog(t, w.Storage(g), want)
	checkHardState(t, w.Storage(g), hs(2, 1, 1))
	next := mkEnts(5, 1, 2, 50, 1)
	mustSave(t, w, Update{Group: g, Entries: next})
	w.Close()
	b2, err := os.ReadFile(filepath.Join(dir, segmentName(2)))
	if err != nil {
		t.Fatalf("no new segment: %v", err)
	}
	if v := le.Uint32(b2[4:]); v != segVersion {
		t.Fatalf("new segment has version %d, want %d", v, segVersion)
	}
	if b1, _ := os.ReadFile(seg1); !bytes.Equal(b1[:len(old)], old) {
		t.Fatal("the version 3 segment was changed")
	}
	w = openT(t, dir, nil)
	defer w.Close()
	checkLog(t, w.Storage(g), append(want, next...))
}

// TestUnknownVersionIsErrVersion: a segment in a version this build does not
// read (too old or written by a newer release) is ErrVersion, not a torn tail.
func TestUnknownVersionIsErrVersion(t *testing.T) {
	src := t.TempDir()
	w := openT(t, src, nil)
	mustSave(t, w, Update{Group: 1, Entries: mkEnts(1, 2, 1, 10, 1)})
	w.Close()
	b, err := os.ReadFile(filepath.Join(src, segmentName(1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []uint32{0, 1, segVersion + 1, 99} {
		dir := t.TempDir()
		img := slices.Clone(b)
		le.PutUint32(img[4:], v)
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), img, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := openAt(dir, 1<<20, nil)
		if !errors.Is(err, ErrVersion) {
			t.Fatalf("version %d: Open: %v, want ErrVersion", v, err)
		}
	}
}
