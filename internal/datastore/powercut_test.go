package datastore

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/basalt-storage/basalt/internal/lazyfs"
)

// A power cut right after a copyset's first checkpoint keeps the copyset:
// its chunk data and meta were synced (so the WAL may drop what they hold),
// and that is worth nothing if the directories above them were never made
// durable. Runs the store on lazyfs, which forgets every directory entry
// whose directory was not fsynced.
func TestPowerCutKeepsCheckpointedCopyset(t *testing.T) {
	if testing.Short() {
		t.Skip("FUSE file system: -short")
	}
	z, mnt := lazyfs.MountTemp(t)
	cfg := Config{Dir: filepath.Join(mnt, "data")}

	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := s.Copyset(7, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	id := ChunkID{Volume: 3, Index: 0}
	data := bytes.Repeat([]byte("durable!"), 512)
	if err := cs.WriteAt(id, data, 8192); err != nil {
		t.Fatal(err)
	}
	// The checkpoint: chunks synced, then the applied state saved.
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := cs.SaveMeta([]byte("applied 42")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files, entries := z.CutAndRemount(t, mnt)
	t.Logf("power cut: unsynced data of %d files and %d directory changes taken back", files, entries)

	s, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Copysets(); len(got) != 1 || got[0] != 7 {
		t.Fatalf("copysets after the cut: %v, want [7]", got)
	}
	cs, err = s.Copyset(7, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := cs.LoadMeta()
	if err != nil || string(meta) != "applied 42" {
		t.Fatalf("meta after the cut: %q, %v", meta, err)
	}
	got := make([]byte, len(data))
	if err := cs.ReadAt(id, got, 8192); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the checkpointed chunk data did not survive the cut")
	}
}
