package testhost

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A synthetic depmod output: hard dependencies, a soft dependency given as an
// alias with two providers (as ext4's crypto-crc32c is), and a built-in module.
func TestModuleClosure(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"modules.dep": "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/jbd2/jbd2.ko\n" +
			"kernel/lib/crc16.ko:\nkernel/fs/jbd2/jbd2.ko:\n" +
			"kernel/crypto/crc32c_generic.ko:\nkernel/arch/x86/crypto/crc32c-intel.ko:\n" +
			"kernel/drivers/block/nbd.ko:\nkernel/drivers/block/loop.ko:\n",
		"modules.softdep": "# Soft dependencies\nsoftdep ext4 pre: crypto-crc32c\nsoftdep jbd2 pre: crypto-crc32c\n",
		"modules.alias":   "alias crypto-crc32c crc32c_intel\nalias crypto-crc32c crc32c_generic\nalias fs-ext4 ext4\n",
		"modules.builtin": "kernel/drivers/virtio/virtio_mmio.ko\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ix, err := loadModuleIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ix.closure([]string{"ext4", "crc32c-intel", "virtio_mmio"})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/crypto/crc32c_generic.ko",
		"kernel/fs/ext4/ext4.ko", "kernel/fs/jbd2/jbd2.ko", "kernel/lib/crc16.ko"}
	if !slices.Equal(got, want) {
		t.Errorf("closure = %v, want %v", got, want)
	}
	if _, err := ix.closure([]string{"no_such_module"}); err == nil || !strings.Contains(err.Error(), "no_such_module") {
		t.Errorf("an unknown module: err %v, want one naming it", err)
	}
}

// The archive unpacks with cpio as written: directories, a file from the host,
// a file from memory with its mode, a symlink.
func TestCpioUnpacks(t *testing.T) {
	cpio := lookTool("cpio")
	args := []string{"-i", "-d", "-m", "--quiet"}
	if cpio == "" {
		if cpio = lookTool("busybox"); cpio == "" {
			t.Skip("skipped: neither cpio nor busybox is installed (scripts/install-deps installs busybox-static)")
		}
		args = []string{"cpio", "-i", "-d", "-m"}
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, []byte("from the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	im := &image{entries: map[string]entry{}}
	im.put("usr/lib/x/host.txt", entry{mode: cpioModeFile | 0o640, src: src})
	im.data("init", 0o755, []byte("#!/bin/sh\n"))
	im.data("etc/empty", 0o644, nil)
	im.link("lib", "usr/lib")
	var archive bytes.Buffer
	if err := im.write(&archive); err != nil {
		t.Fatal(err)
	}
	if archive.Len()%4 != 0 {
		t.Errorf("archive is %d bytes, not a multiple of 4", archive.Len())
	}
	out := t.TempDir()
	cmd := exec.Command(cpio, args...)
	cmd.Dir, cmd.Stdin = out, &archive
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", cpio, args, err, b)
	}
	check := func(p, content string, perm os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(out, p))
		if err != nil || string(b) != content {
			t.Errorf("%s: %q, %v; want %q", p, b, err, content)
			return
		}
		if fi, _ := os.Stat(filepath.Join(out, p)); fi.Mode().Perm() != perm {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), perm)
		}
	}
	check("usr/lib/x/host.txt", "from the host\n", 0o640)
	check("lib/x/host.txt", "from the host\n", 0o640) // through the symlink
	check("init", "#!/bin/sh\n", 0o755)
	check("etc/empty", "", 0o644)
	if target, err := os.Readlink(filepath.Join(out, "lib")); err != nil || target != "usr/lib" {
		t.Errorf("lib links to %q (%v), want usr/lib", target, err)
	}
}

// The same inputs give the same archive and key; any changed byte changes the key.
func TestImageKey(t *testing.T) {
	mk := func(init string) *image {
		im := &image{entries: map[string]entry{}}
		im.data("init", 0o755, []byte(init))
		im.link("bin", "usr/bin")
		return im
	}
	a, _ := mk("echo a").key()
	b, _ := mk("echo a").key()
	c, _ := mk("echo b").key()
	if a != b || a == c {
		t.Errorf("keys: same inputs %s and %s, changed input %s", a, b, c)
	}
}

func TestLdd(t *testing.T) {
	kmod := lookTool("kmod")
	if kmod == "" {
		t.Skip("skipped: kmod is not installed (scripts/install-deps installs it)")
	}
	libs, err := ldd(kmod)
	if err != nil {
		t.Fatal(err)
	}
	var loader, libc bool
	for _, l := range libs {
		loader = loader || strings.Contains(l, "ld-linux")
		libc = libc || strings.HasSuffix(l, "/libc.so.6")
	}
	if !loader || !libc {
		t.Errorf("ldd %s = %v, want the loader and libc among them", kmod, libs)
	}
	if bb := lookTool("busybox"); bb != "" {
		if libs, err := ldd(bb); err != nil || len(libs) != 0 {
			t.Errorf("ldd of the static busybox = %v, %v; want none", libs, err)
		}
	}
}
