package chunkserver

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
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
