package lazyfs

import (
	"os"
	"path/filepath"
	"testing"
)

// MountTemp mounts a lazyfs over a fresh backing directory in t's temporary
// directory and returns it with its mount point; it is unmounted when t ends.
// It skips t, saying why, where FUSE is missing or cannot be mounted.
func MountTemp(t testing.TB) (*FS, string) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("lazyfs needs FUSE: /dev/fuse is missing (Debian: apt-get install fuse3)")
	}
	dir := t.TempDir()
	z, err := New(filepath.Join(dir, "backing"))
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := z.Mount(mnt); err != nil {
		t.Skipf("lazyfs: cannot mount FUSE here (needs root or fusermount3): %v", err)
	}
	t.Cleanup(func() { _ = z.Unmount() })
	return z, mnt
}

// CutAndRemount cuts the power of the lazyfs mounted at mnt (unmount, Cut)
// and mounts it again; the processes using it must be stopped first. It
// returns what Cut took back.
func (z *FS) CutAndRemount(t testing.TB, mnt string) (files, entries int) {
	t.Helper()
	if err := z.Unmount(); err != nil {
		t.Fatal(err)
	}
	files, entries, err := z.Cut()
	if err != nil {
		t.Fatal(err)
	}
	if err := z.Mount(mnt); err != nil {
		t.Fatal(err)
	}
	return files, entries
}
