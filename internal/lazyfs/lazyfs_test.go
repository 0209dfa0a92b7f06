package lazyfs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mount mounts a lazyfs over a fresh backing directory, or skips.
func mount(t *testing.T) (*FS, string) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("lazyfs needs FUSE: /dev/fuse is missing")
	}
	dir := t.TempDir()
	z, err := New(filepath.Join(dir, "backing"))
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if err := z.Mount(mnt); err != nil {
		t.Skipf("lazyfs: cannot mount FUSE here (needs root or fusermount3): %v", err)
	}
	t.Cleanup(func() { z.Unmount() })
	return z, mnt
}

func cut(t *testing.T, z *FS, mnt string) {
	t.Helper()
	if err := z.Unmount(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := z.Cut(); err != nil {
		t.Fatal(err)
	}
	if err := z.Mount(mnt); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return b
}

// Data fsynced survives a cut; data written after the last fsync does not,
// overwrites and appends alike; the size goes back too.
func TestSyncedDataSurvivesUnsyncedDoesNot(t *testing.T) {
	z, mnt := mount(t)
	p := filepath.Join(mnt, "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte("a"), 8192), 0)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	syncDir(t, mnt)
	f.WriteAt(bytes.Repeat([]byte("b"), 100), 4000) // overwrite, unsynced
	f.WriteAt(bytes.Repeat([]byte("c"), 100), 8192) // append, unsynced
	if got := read(t, p); len(got) != 8292 || got[4000] != 'b' {
		t.Fatalf("before the cut the writes are visible: len %d", len(got))
	}
	if files, _ := z.Pending(); files != 1 {
		t.Fatalf("pending files %d", files)
	}
	f.Close()
	cut(t, z, mnt)
	if got := read(t, p); !bytes.Equal(got, bytes.Repeat([]byte("a"), 8192)) {
		t.Fatalf("after the cut: len %d, want the 8192 synced bytes of 'a'", len(got))
	}

	// fdatasync through another descriptor counts; the next cut keeps it.
	f, _ = os.OpenFile(p, os.O_WRONLY, 0) // write-only: lazyfs reads the old bytes its own way
	if _, err := f.WriteAt([]byte("zz"), 10); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("yy"), 20); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100); err != nil { // unsynced truncate
		t.Fatal(err)
	}
	f.Close()
	cut(t, z, mnt)
	got := read(t, p)
	if len(got) != 8192 || string(got[10:12]) != "zz" || string(got[20:22]) != "aa" {
		t.Fatalf("after the second cut: len %d, [10:12]=%q [20:22]=%q", len(got), got[10:12], got[20:22])
	}
}

// A file whose directory was not fsynced is gone after a cut, even if the
// file itself was; unlinks and renames not made durable are undone.
func TestDirectoryEntries(t *testing.T) {
	z, mnt := mount(t)
	os.WriteFile(filepath.Join(mnt, "kept"), []byte("k"), 0o644)
	os.WriteFile(filepath.Join(mnt, "old"), []byte("o"), 0o644)
	os.Mkdir(filepath.Join(mnt, "d"), 0o755)
	for _, n := range []string{"kept", "old"} {
		f, _ := os.OpenFile(filepath.Join(mnt, n), os.O_RDWR, 0)
		f.Sync()
		f.Close()
	}
	syncDir(t, mnt)

	// Not durable: a new file (fsynced, its directory not), an unlink, a
	// rename over an existing file, a new file in a new directory.
	f, _ := os.Create(filepath.Join(mnt, "new"))
	f.Write([]byte("n"))
	f.Sync()
	f.Close()
	os.Remove(filepath.Join(mnt, "kept"))
	os.WriteFile(filepath.Join(mnt, "tmp"), []byte("t"), 0o644)
	os.Rename(filepath.Join(mnt, "tmp"), filepath.Join(mnt, "old"))
	os.WriteFile(filepath.Join(mnt, "d", "x"), []byte("x"), 0o644)
	if _, entries := z.Pending(); entries == 0 {
		t.Fatal("no pending directory changes")
	}
	cut(t, z, mnt)
	if _, err := os.Stat(filepath.Join(mnt, "new")); !os.IsNotExist(err) {
		t.Errorf("new: %v, want gone (its directory was not fsynced)", err)
	}
	if got := string(read(t, filepath.Join(mnt, "kept"))); got != "k" {
		t.Errorf("kept = %q after its unlink was cut", got)
	}
	if got := string(read(t, filepath.Join(mnt, "old"))); got != "o" {
		t.Errorf("old = %q after the rename over it was cut", got)
	}
	if _, err := os.Stat(filepath.Join(mnt, "tmp")); !os.IsNotExist(err) {
		t.Errorf("tmp: %v, want gone (created, never durable)", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "d", "x")); !os.IsNotExist(err) {
		t.Errorf("d/x: %v, want gone", err)
	}

	// The durable way: write a temporary file, fsync it, rename, fsync the
	// directory.
	os.WriteFile(filepath.Join(mnt, "tmp"), []byte("new content"), 0o644)
	f, _ = os.OpenFile(filepath.Join(mnt, "tmp"), os.O_RDWR, 0)
	f.Sync()
	f.Close()
	os.Rename(filepath.Join(mnt, "tmp"), filepath.Join(mnt, "old"))
	syncDir(t, mnt)
	cut(t, z, mnt)
	if got := string(read(t, filepath.Join(mnt, "old"))); got != "new content" {
		t.Errorf("old = %q after a durable rename and a cut", got)
	}
}
