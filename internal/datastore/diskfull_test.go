package datastore

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDiskFull fills a small tmpfs: creating a chunk that does not fit fails
// with ErrNoSpace, and the chunks already written stay readable.
func TestDiskFull(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("SKIP: needs to mount a small tmpfs to fill a disk (root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	s := openStore(t, dir, 0, Knobs{})
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	data := bytes.Repeat([]byte{9}, 4096)
	var err error
	n := 0
	for ; n < 10; n++ {
		if err = cs.WriteAt(ChunkID{1, uint64(n)}, data, 0); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("after %d chunks on a 4 MiB disk: %v, want ErrNoSpace", n, err)
	}
	if n == 0 {
		t.Fatal("not even one chunk fitted")
	}
	for i := range n {
		got := make([]byte, 4096)
		if err := cs.ReadAt(ChunkID{1, uint64(i)}, got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("chunk %d unreadable after ENOSPC: %v", i, err)
		}
	}
	// The failed chunk left no half-made file behind.
	ids, _ := cs.Chunks()
	if len(ids) != n {
		t.Fatalf("%d chunks listed, %d written", len(ids), n)
	}
	ents, _ := os.ReadDir(cs.chunksDir)
	if len(ents) != n {
		t.Fatalf("%d chunk files on disk, %d written", len(ents), n)
	}
}
