package fsdir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMkdirAll(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "a", "b", "c")
	if err := MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		t.Fatalf("stat %s: %v", p, err)
	}
	if err := MkdirAll(p, 0o755); err != nil { // exists: fine
		t.Fatal(err)
	}
	f := filepath.Join(root, "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(filepath.Join(f, "sub"), 0o755); err == nil {
		t.Fatal("MkdirAll under a file succeeded")
	}
	if err := Sync(filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	if err := Sync(filepath.Join(root, "missing")); err == nil {
		t.Fatal("Sync of a missing directory succeeded")
	}
}
