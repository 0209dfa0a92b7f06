package chunkserver

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/wal"
)

// A second chunkserver on a data directory in use is refused before it touches
// the WAL or the chunk files; after the first stops, the directory can be used.
func TestDataDirLock(t *testing.T) {
	dir := t.TempDir()
	first, err := New(Config{DataDir: dir, MDS: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	walBefore, _ := os.ReadDir(filepath.Join(dir, "wal"))
	_, err = New(Config{DataDir: dir, MDS: []string{"127.0.0.1:1"}})
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second chunkserver on the same directory: got %v, want ErrDataDirInUse", err)
	}
	walAfter, _ := os.ReadDir(filepath.Join(dir, "wal"))
	if len(walAfter) != len(walBefore) {
		t.Fatalf("the refused chunkserver changed the WAL directory: %d files before, %d after", len(walBefore), len(walAfter))
	}
	first.shutdown()
	again, err := New(Config{DataDir: dir, MDS: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatalf("directory still locked after the first chunkserver stopped: %v", err)
	}
	again.shutdown()
}

// A WAL that cannot be trusted (here: a segment in a format version this
// build does not read) stops the chunkserver with a message for the operator,
// keeping the WAL's error for errors.Is.
func TestUntrustedWALRefused(t *testing.T) {
	dir := t.TempDir()
	cs, err := New(Config{DataDir: dir, MDS: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	cs.shutdown()
	seg := filepath.Join(dir, "wal", "0000000000000001.wal")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[4] = 99 // the version
	if err := os.WriteFile(seg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{DataDir: dir, MDS: []string{"127.0.0.1:1"}})
	if !errors.Is(err, wal.ErrVersion) {
		t.Fatalf("New with a version 99 segment: %v, want wal.ErrVersion", err)
	}
	for _, want := range []string{"refusing to start: the WAL at " + filepath.Join(dir, "wal") + " cannot be trusted",
		"the MDS will re-replicate its copysets", "move the data directory " + dir + " aside to rejoin empty"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
