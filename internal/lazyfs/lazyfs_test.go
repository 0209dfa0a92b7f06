package lazyfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

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
	z, mnt := MountTemp(t)
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
	z.CutAndRemount(t, mnt)
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
	z.CutAndRemount(t, mnt)
	got := read(t, p)
	if len(got) != 8192 || string(got[10:12]) != "zz" || string(got[20:22]) != "aa" {
		t.Fatalf("after the second cut: len %d, [10:12]=%q [20:22]=%q", len(got), got[10:12], got[20:22])
	}
}

// A file whose directory was not fsynced is gone after a cut, even if the
// file itself was; unlinks and renames not made durable are undone.
func TestDirectoryEntries(t *testing.T) {
	z, mnt := MountTemp(t)
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
	z.CutAndRemount(t, mnt)
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
	z.CutAndRemount(t, mnt)
	if got := string(read(t, filepath.Join(mnt, "old"))); got != "new content" {
		t.Errorf("old = %q after a durable rename and a cut", got)
	}
}

// SetFull: writes, fallocate, growing truncates, creates and mkdirs fail with
// ENOSPC and change nothing; reads, fsyncs, shrinking truncates, hole punches
// and unlinks go on; clearing it lets writes through again.
func TestFull(t *testing.T) {
	z, mnt := MountTemp(t)
	p := filepath.Join(mnt, "f")
	if err := os.WriteFile(p, bytes.Repeat([]byte("a"), 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z.SetFull(true)
	if _, err := f.WriteAt([]byte("b"), 0); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("write on a full disk: %v, want ENOSPC", err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, 1<<20); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("fallocate on a full disk: %v, want ENOSPC", err)
	}
	if err := f.Truncate(1 << 20); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("growing truncate on a full disk: %v, want ENOSPC", err)
	}
	if _, err := os.Create(filepath.Join(mnt, "g")); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("create on a full disk: %v, want ENOSPC", err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("mkdir on a full disk: %v, want ENOSPC", err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 4096); err != nil {
		t.Errorf("punch hole on a full disk: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Errorf("fsync on a full disk: %v", err)
	}
	if err := f.Truncate(6000); err != nil {
		t.Errorf("shrinking truncate on a full disk: %v", err)
	}
	if got := read(t, p); len(got) != 6000 || got[0] != 'a' || got[4096] != 0 {
		t.Errorf("full disk: file is %d bytes, [0]=%q [4096]=%q; want 6000, 'a', 0", len(got), got[0], got[4096])
	}
	z.SetFull(false)
	if _, err := f.WriteAt([]byte("b"), 0); err != nil {
		t.Errorf("write after the disk was freed: %v", err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Errorf("mkdir after the disk was freed: %v", err)
	}
}

// A directory's removal made durable makes durable the unlinks inside it:
// the cut neither fails nor brings the directory or its files back (a
// chunkserver removes a copyset's directory this way; the power cut of
// TestLinearizable after a move found the cut failing here).
func TestDurableRmdirTakesItsContent(t *testing.T) {
	z, mnt := MountTemp(t)
	d := filepath.Join(mnt, "d")
	os.Mkdir(d, 0o755)
	os.WriteFile(filepath.Join(d, "f"), []byte("f"), 0o644)
	syncDir(t, d)
	syncDir(t, mnt)
	os.Rename(d, d+".removed")
	syncDir(t, mnt)
	if err := os.Remove(filepath.Join(d+".removed", "f")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(d + ".removed"); err != nil {
		t.Fatal(err)
	}
	syncDir(t, mnt) // the rmdir is durable, the unlink's own directory never synced
	if _, entries := z.Pending(); entries != 0 {
		t.Errorf("%d directory changes still pending after the durable rmdir", entries)
	}
	z.CutAndRemount(t, mnt)
	for _, p := range []string{d, d + ".removed"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after the cut: %v, want gone", p, err)
		}
	}
}
