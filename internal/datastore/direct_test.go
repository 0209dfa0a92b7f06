package datastore

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestWriteAtUncached: large writes aligned in the file and in memory go
// around the page cache; other writes (misaligned memory, offset, or small)
// take the buffered path. Either way the data reads back at once, over
// older buffered data of the same range too, the chunk is dirty until Sync,
// and it is all there after a reopen.
func TestWriteAtUncached(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 2, Knobs{})
	cs := mustCopyset(t, s, 5)
	r := rand.New(rand.NewPCG(5, 6))
	id := ChunkID{3, 0}
	want := make([]byte, testChunk)
	write := func(p []byte, off int64) {
		t.Helper()
		if err := cs.WriteAtUncached(id, p, off); err != nil {
			t.Fatalf("WriteAtUncached %d bytes at %d: %v", len(p), off, err)
		}
		copy(want[off:], p)
	}

	// Buffered data first, then a direct write over it.
	small := randBytes(r, 4096)
	if err := cs.WriteAt(id, small, 128<<10+4096); err != nil {
		t.Fatal(err)
	}
	copy(want[128<<10+4096:], small)
	big := make([]byte, 256<<10+directAlign)
	copy(big, randBytes(r, len(big)))
	aligned := big[:128<<10]
	if !isAligned(aligned) {
		t.Skip("skipped: a 256 KiB allocation is not 512-byte aligned on this platform")
	}
	write(aligned, 128<<10)                  // direct
	write(big[512:512+64<<10], 900<<10)      // direct
	write(big[40:40+64<<10], 512<<10)        // misaligned memory: buffered
	write(randBytes(r, 4096), 600<<10)       // too small: buffered
	write(randBytes(r, 64<<10), 700<<10+100) // misaligned offset: buffered
	if !bytes.Equal(readChunk(t, cs, id), want) {
		t.Fatal("chunk differs from what was written")
	}
	if s.noDirect.Load() {
		t.Logf("this file system refuses O_DIRECT: every write went through the page cache")
	} else if n := s.direct.Load(); n != 2 {
		t.Fatalf("%d direct writes, want 2", n)
	}
	if got := cs.DirtyCount(); got != 1 {
		t.Fatalf("DirtyCount = %d, want 1", got)
	}
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := cs.DirtyCount(); got != 0 {
		t.Fatalf("DirtyCount after Sync = %d", got)
	}
	s.Close()

	s = openStore(t, dir, 2, Knobs{})
	defer s.Close()
	if !bytes.Equal(readChunk(t, mustCopyset(t, s, 5), id), want) {
		t.Fatal("chunk differs after reopen")
	}
}
