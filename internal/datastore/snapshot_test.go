package datastore

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// fillSparse writes a few scattered extents into several chunks and returns
// the bytes written (for stream-size checks).
func fillSparse(t *testing.T, cs *Copyset, seed uint64) int {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 99))
	total := 0
	for i := range 6 {
		id := ChunkID{uint64(i % 2), uint64(i)}
		for range 3 {
			off := int64(r.IntN(testChunk/4096-8)) * 4096
			p := randBytes(r, 8192)
			if err := cs.WriteAt(id, p, off); err != nil {
				t.Fatal(err)
			}
			total += len(p)
		}
	}
	// A chunk that exists but was wholly trimmed.
	id := ChunkID{5, 5}
	if err := cs.WriteAt(id, []byte("gone"), 0); err != nil {
		t.Fatal(err)
	}
	if err := cs.Discard(id, 0, testChunk); err != nil {
		t.Fatal(err)
	}
	return total
}

func snapshotOf(t *testing.T, cs *Copyset) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := cs.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	src := openStore(t, t.TempDir(), 2, Knobs{})
	defer src.Close()
	a := mustCopyset(t, src, 1)
	written := fillSparse(t, a, 1)
	stream := snapshotOf(t, a)
	// Holes are skipped: the stream is about the size of the data, far below
	// 7 full chunks.
	if limit := written + 64<<10; len(stream) > limit {
		t.Fatalf("stream of %d bytes for %d bytes of data (limit %d): holes not skipped", len(stream), written, limit)
	}

	dstDir := t.TempDir()
	dst := openStore(t, dstDir, 2, Knobs{})
	b := mustCopyset(t, dst, 1)
	// The receiver has its own older data, which must vanish on install.
	if err := b.WriteAt(ChunkID{77, 0}, []byte("stale"), 0); err != nil {
		t.Fatal(err)
	}
	if err := b.ReceiveSnapshot(7, bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	if p := make([]byte, 5); b.ReadAt(ChunkID{77, 0}, p, 0) != nil || string(p) != "stale" {
		t.Fatal("ReceiveSnapshot changed the live data before InstallStaged")
	}
	if err := b.InstallStaged(7); err != nil {
		t.Fatal(err)
	}
	compareStores(t, a, b)
	if ids, _ := b.Chunks(); len(ids) != 7 {
		t.Fatalf("receiver has %d chunks, want 7: %v", len(ids), ids)
	}
	if err := b.InstallStaged(7); !errors.Is(err, ErrNoStaged) {
		t.Fatalf("second InstallStaged: %v, want ErrNoStaged", err)
	}
	// And after a restart.
	dst.Close()
	dst = openStore(t, dstDir, 2, Knobs{})
	defer dst.Close()
	compareStores(t, a, mustCopyset(t, dst, 1))
}

func TestSnapshotWhileWriting(t *testing.T) {
	src := openStore(t, t.TempDir(), 0, Knobs{})
	defer src.Close()
	a := mustCopyset(t, src, 1)
	fillSparse(t, a, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := rand.New(rand.NewPCG(7, 7))
		for i := range 300 {
			id := ChunkID{uint64(i % 2), uint64(i % 6)}
			if err := a.WriteAt(id, randBytes(r, 4096), int64(r.IntN(255))*4096); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var buf bytes.Buffer
	if err := a.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	<-done
	dst := openStore(t, t.TempDir(), 0, Knobs{})
	defer dst.Close()
	b := mustCopyset(t, dst, 1)
	if err := b.ReceiveSnapshot(7, &buf); err != nil {
		t.Fatalf("a snapshot taken during writes is a valid stream: %v", err)
	}
}

func TestSnapshotRejectsBadStreams(t *testing.T) {
	src := openStore(t, t.TempDir(), 0, Knobs{})
	defer src.Close()
	a := mustCopyset(t, src, 1)
	fillSparse(t, a, 3)
	stream := snapshotOf(t, a)

	dst := openStore(t, t.TempDir(), 0, Knobs{})
	defer dst.Close()
	b := mustCopyset(t, dst, 1)
	if err := b.WriteAt(ChunkID{1, 1}, []byte("keep me"), 0); err != nil {
		t.Fatal(err)
	}
	before, _ := b.Checksum(ChunkID{1, 1})
	r := rand.New(rand.NewPCG(11, 12))
	cases := map[string][]byte{
		"empty":          nil,
		"header-only":    stream[:snapHeaderSize],
		"truncated-mid":  stream[:len(stream)/2],
		"missing-crc":    stream[:len(stream)-4],
		"last-byte-gone": stream[:len(stream)-1],
	}
	for i := range 8 { // single flipped bits anywhere
		c := bytes.Clone(stream)
		pos := r.IntN(len(c))
		c[pos] ^= 1 << r.IntN(8)
		cases["flip-"+string(rune('a'+i))] = c
	}
	other := openStore(t, t.TempDir(), 0, Knobs{})
	defer other.Close()
	big, _ := other.Copyset(1, testChunk*2)
	big.WriteAt(ChunkID{1, 1}, []byte("x"), 0)
	cases["chunk-size"] = snapshotOf(t, big)

	for name, s := range cases {
		err := b.ReceiveSnapshot(7, bytes.NewReader(s))
		if err == nil {
			t.Errorf("%s: stream accepted", name)
			continue
		}
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrChunkSize) {
			t.Errorf("%s: error %v, want ErrCorrupt or ErrChunkSize", name, err)
		}
		if b.HasStaged(7) {
			t.Errorf("%s: a rejected stream left a staged snapshot", name)
		}
		if err := b.InstallStaged(7); !errors.Is(err, ErrNoStaged) {
			t.Errorf("%s: InstallStaged after a rejected stream: %v", name, err)
		}
		if after, _ := b.Checksum(ChunkID{1, 1}); after != before {
			t.Fatalf("%s: live data changed", name)
		}
		if _, err := os.Stat(filepath.Join(b.dir, stagingDirName)); err == nil {
			t.Errorf("%s: staging dir left behind", name)
		}
	}
	// A reader failing mid-stream is returned, not hidden.
	boom := errors.New("connection reset")
	err := b.ReceiveSnapshot(7, io.MultiReader(bytes.NewReader(stream[:100]), errReader{boom}))
	if !errors.Is(err, boom) {
		t.Fatalf("reader error: %v, want %v", err, boom)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestInstallInterrupted crashes InstallStaged before each of its steps and
// checks that reopening yields either exactly the old or exactly the new
// chunks — and the new ones whenever step 1 already happened.
func TestInstallInterrupted(t *testing.T) {
	src := openStore(t, t.TempDir(), 0, Knobs{})
	defer src.Close()
	a := mustCopyset(t, src, 1)
	fillSparse(t, a, 4)
	stream := snapshotOf(t, a)
	// A newer snapshot staged beside it must not be taken for it.
	src2 := openStore(t, t.TempDir(), 0, Knobs{})
	defer src2.Close()
	a2 := mustCopyset(t, src2, 1)
	fillSparse(t, a2, 5)
	newer := snapshotOf(t, a2)

	for step := 1; step <= 4; step++ {
		dir := t.TempDir()
		crash := errors.New("simulated crash")
		dst := openStore(t, dir, 0, Knobs{BeforeInstallStep: func(n int) error {
			if n == step {
				return crash
			}
			return nil
		}})
		b := mustCopyset(t, dst, 1)
		oldID := ChunkID{42, 0}
		if err := b.WriteAt(oldID, []byte("old data"), 0); err != nil {
			t.Fatal(err)
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := b.ReceiveSnapshot(7, bytes.NewReader(stream)); err != nil {
			t.Fatal(err)
		}
		if err := b.ReceiveSnapshot(9, bytes.NewReader(newer)); err != nil {
			t.Fatal(err)
		}
		if err := b.InstallStaged(7); !errors.Is(err, crash) {
			t.Fatalf("step %d: InstallStaged = %v, want the crash", step, err)
		}
		dst.Close()

		dst = openStore(t, dir, 0, Knobs{})
		b = mustCopyset(t, dst, 1)
		ids, _ := b.Chunks()
		hasOld := len(ids) == 1 && ids[0] == oldID
		if step == 1 {
			// Nothing moved yet: old data, snapshot still staged.
			if !hasOld || !b.HasStaged(7) {
				t.Fatalf("crash before step 1: chunks %v, staged %v; want old data and the staged snapshot", ids, b.HasStaged(7))
			}
			if err := b.InstallStaged(7); err != nil {
				t.Fatal(err)
			}
		}
		compareStores(t, a, b)
		if b.HasStaged(7) {
			t.Fatalf("step %d: staged snapshot left after recovery", step)
		}
		if inst, err := b.Installed(); inst != 7 || err != nil {
			t.Fatalf("step %d: Installed = %d, %v; want 7", step, inst, err)
		}
		if !b.HasStaged(9) {
			t.Fatalf("step %d: the newer staged snapshot is gone", step)
		}
		if err := b.InstallStaged(9); err != nil {
			t.Fatal(err)
		}
		compareStores(t, a2, b)
		for _, leftover := range []string{oldDirName, stagingDirName} {
			if _, err := os.Stat(filepath.Join(b.dir, leftover)); err == nil {
				t.Fatalf("step %d: %s left after recovery", step, leftover)
			}
		}
		dst.Close()
	}
}

// TestSnapshotGolden freezes the stream format: a tiny copyset with one
// fully written chunk must stream to exactly these bytes.
func TestSnapshotGolden(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir(), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cs, err := s.Copyset(0x0000000100000002, 8192)
	if err != nil {
		t.Fatal(err)
	}
	// The chunk is written in full so the bytes do not depend on whether
	// the file system reports holes.
	if err := cs.WriteAt(ChunkID{3, 4}, bytes.Repeat([]byte("a"), 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := cs.WriteAt(ChunkID{3, 4}, bytes.Repeat([]byte("b"), 4096), 4096); err != nil {
		t.Fatal(err)
	}
	got := snapshotOf(t, cs)
	golden := filepath.Join("testdata", "snapshot-v1.golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("snapshot stream format changed:\n got %x...\nwant %x...", got[:64], want[:min(64, len(want))])
	}
}

// Two snapshots staged at once (overlapping streams): each install uses the
// data received for its own index; an index with nothing staged is
// ErrNoStaged even while another index is staged; an install drops the
// staged snapshots below it, DropStaged those up to its argument.
func TestStagedSnapshotsByIndex(t *testing.T) {
	src := openStore(t, t.TempDir(), 0, Knobs{})
	defer src.Close()
	older := mustCopyset(t, src, 1)
	fillSparse(t, older, 1)
	olderStream := snapshotOf(t, older)
	src2 := openStore(t, t.TempDir(), 0, Knobs{})
	defer src2.Close()
	newer := mustCopyset(t, src2, 1)
	fillSparse(t, newer, 2)
	newerStream := snapshotOf(t, newer)

	dst := openStore(t, t.TempDir(), 0, Knobs{})
	defer dst.Close()
	b := mustCopyset(t, dst, 1)
	for _, r := range []struct {
		index  uint64
		stream []byte
	}{{3, olderStream}, {10, olderStream}, {20, newerStream}} {
		if err := b.ReceiveSnapshot(r.index, bytes.NewReader(r.stream)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.InstallStaged(15); !errors.Is(err, ErrNoStaged) {
		t.Fatalf("install of an index not staged: %v, want ErrNoStaged", err)
	}
	if err := b.DropStaged(5); err != nil || b.HasStaged(3) || !b.HasStaged(10) {
		t.Fatalf("DropStaged(5): %v; staged 3 %v, 10 %v", err, b.HasStaged(3), b.HasStaged(10))
	}
	if err := b.InstallStaged(10); err != nil {
		t.Fatal(err)
	}
	compareStores(t, older, b)
	if err := b.InstallStaged(20); err != nil {
		t.Fatal(err)
	}
	compareStores(t, newer, b)
	if inst, _ := b.Installed(); inst != 20 {
		t.Fatalf("Installed = %d, want 20", inst)
	}
	// Installing 20 dropped what was staged below it.
	if err := b.ReceiveSnapshot(11, bytes.NewReader(olderStream)); err != nil {
		t.Fatal(err)
	}
	if err := b.ReceiveSnapshot(30, bytes.NewReader(olderStream)); err != nil {
		t.Fatal(err)
	}
	if err := b.InstallStaged(30); err != nil {
		t.Fatal(err)
	}
	if b.HasStaged(11) {
		t.Fatal("a staged snapshot below the installed one was kept")
	}
}
