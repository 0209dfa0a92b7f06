package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Random 4 KiB and 64 KiB writes, verified; then the whole playground is stopped
// with Ctrl-C, started again on the same directory, and everything read-verified.
func TestFioVerifyAcrossRestart(t *testing.T) {
	testutil.RequireTools(t, "fio")
	p := startPlayground(t, "3GiB")
	jobs := func(extra ...string) []string {
		return append([]string{
			"--name=rand4k", "--rw=randwrite", "--bs=4k", "--offset=0", "--size=1g", "--io_size=24m",
			"--iodepth=16", "--verify=crc32c", "--randseed=42",
			"--name=rand64k", "--rw=randwrite", "--bs=64k", "--offset=1g", "--size=1g", "--io_size=128m",
			"--iodepth=8", "--verify=crc32c", "--randseed=43",
		}, extra...)
	}
	out := fio(t, p.unixURI(), jobs()...)
	logf(t, "write+verify:\n%s", tail(out, 12))
	p.restart()
	out = fio(t, p.unixURI(), jobs("--verify_only")...)
	logf(t, "verify after restart:\n%s", tail(out, 6))
}

// Several jobs on several connections at once (NBD multi-conn), each verified.
func TestFioMultiConn(t *testing.T) {
	testutil.RequireTools(t, "fio")
	p := startPlayground(t, "2GiB")
	fio(t, p.tcpURI(), "--name=multi", "--rw=randwrite", "--bs=4k", "--numjobs=4",
		"--size=256m", "--offset_increment=256m", "--io_size=8m", "--iodepth=8",
		"--verify=crc32c", "--group_reporting")
}

func TestQemuImgRoundTrip(t *testing.T) {
	testutil.RequireTools(t, "qemu-img")
	p := startPlayground(t, "1GiB")
	dir := t.TempDir()
	in := filepath.Join(dir, "in.img")
	data := make([]byte, 96<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, 5*time.Minute, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", in, p.tcpURI())
	out := filepath.Join(dir, "out.img")
	run(t, 5*time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", p.tcpURI(), out)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1<<30 {
		t.Fatalf("image read back is %d bytes, want the volume size %d", len(got), 1<<30)
	}
	if sha256.Sum256(got[:len(data)]) != sha256.Sum256(data) {
		t.Fatalf("image read back differs from the one written")
	}
	if !bytes.Equal(got[len(data):], make([]byte, len(got)-len(data))) {
		t.Fatalf("never-written part of the volume is not zero")
	}
}

func TestNbdinfo(t *testing.T) {
	testutil.RequireTools(t, "nbdinfo")
	p := startPlayground(t, "1GiB")
	var info struct {
		Exports []map[string]any `json:"exports"`
	}
	if err := json.Unmarshal([]byte(run(t, time.Minute, "nbdinfo", "--json", p.unixURI())), &info); err != nil {
		t.Fatal(err)
	}
	if len(info.Exports) != 1 {
		t.Fatalf("nbdinfo shows %d exports, want 1", len(info.Exports))
	}
	e := info.Exports[0]
	want := map[string]any{
		"export-size":          float64(1 << 30),
		"block_size_preferred": float64(4096),
		"can_flush":            true,
		"can_fua":              true,
		"can_trim":             true,
		"can_zero":             true,
		"can_multi_conn":       true,
		"is_read_only":         false,
	}
	if m := e["block_size_minimum"]; m != float64(1) && m != float64(512) {
		t.Errorf("nbdinfo block_size_minimum = %v, want 1 or 512", m)
	}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("nbdinfo %s = %v, want %v", k, e[k], v)
		}
	}
	// A second volume appears in the list.
	mc, err := mdsclient.Dial([]string{p.st.MDS}, adminTLS(t, p.st.TLSDir))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := mc.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "second", Size: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	list := run(t, time.Minute, "nbdinfo", "--list", "--json", "nbd+unix://?socket="+p.st.NBDSocket)
	for _, name := range []string{`"demo"`, `"second"`} {
		if !strings.Contains(list, name) {
			t.Errorf("nbdinfo --list does not show %s:\n%s", name, list)
		}
	}
}

// TRIM and WRITE_ZEROES: the ranges read back as zeros, the rest is untouched.
func TestTrimAndWriteZeroes(t *testing.T) {
	testutil.RequireTools(t, "qemu-io")
	p := startPlayground(t, "1GiB")
	uri := p.tcpURI()
	qio := func(cmds ...string) string {
		args := []string{"-f", "raw"}
		for _, c := range cmds {
			args = append(args, "-c", c)
		}
		out := run(t, 2*time.Minute, "qemu-io", append(args, uri)...)
		if strings.Contains(out, "failed") || strings.Contains(out, "error") {
			t.Fatalf("qemu-io: %s", out)
		}
		return out
	}
	qio("write -P 0xaa 0 8M", "write -P 0xbb 16M 4M")
	qio("discard 1M 2M", "write -z 5M 1M", "discard 16M 4M")
	qio("read -P 0xaa 0 1M", "read -P 0 1M 2M", "read -P 0xaa 3M 2M",
		"read -P 0 5M 1M", "read -P 0xaa 6M 2M", "read -P 0 16M 4M")
}

// ext4 on a real kernel block device: nbdfuse exposes the volume as a file, losetup
// turns it into /dev/loopN.
func TestExt4OnNbdfuse(t *testing.T) {
	testutil.RequireTools(t, "nbdfuse", "losetup", "mkfs.ext4", "mount", "umount", "fusermount3")
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting a file system needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("skipped: /dev/fuse is missing (no FUSE in this kernel/container)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("skipped: /dev/loop-control is missing (no loop devices)")
	}
	p := startPlayground(t, "1GiB")
	dir := t.TempDir()
	fuseDir, mnt := filepath.Join(dir, "fuse"), filepath.Join(dir, "mnt")
	for _, d := range []string{fuseDir, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	attach := func() (dev string, detach func()) {
		fuse := exec.Command("nbdfuse", fuseDir, p.tcpURI())
		fuse.Stderr = os.Stderr
		if err := fuse.Start(); err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(fuseDir, "nbd")
		deadline := time.Now().Add(30 * time.Second)
		for {
			if fi, err := os.Stat(img); err == nil && fi.Size() == 1<<30 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("nbdfuse did not expose %s", img)
			}
			time.Sleep(100 * time.Millisecond)
		}
		dev = strings.TrimSpace(run(t, time.Minute, "losetup", "-f", "--show", img))
		return dev, func() {
			run(t, time.Minute, "losetup", "-d", dev)
			run(t, time.Minute, "fusermount3", "-u", fuseDir)
			_ = fuse.Wait()
		}
	}
	dev, detach := attach()
	run(t, 2*time.Minute, "mkfs.ext4", "-q", "-F", dev)
	run(t, time.Minute, "mount", dev, mnt)
	files := map[string][]byte{}
	for i, n := range []int{1 << 10, 300 << 10, 5 << 20, 17 << 20} {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		name := filepath.Join(mnt, "file"+string(rune('a'+i)))
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	run(t, time.Minute, "sync")
	run(t, time.Minute, "umount", mnt)
	detach()

	dev, detach = attach()
	defer detach()
	run(t, time.Minute, "mount", dev, mnt)
	defer run(t, time.Minute, "umount", mnt)
	for name, want := range files {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("%s differs after unmount, detach and remount", name)
		}
	}
}

// kill -9 the chunkserver that leads the most copysets while a verified fio write
// job runs: fio finishes with no IO error and the verify passes.
func TestKillLeaderDuringFio(t *testing.T) {
	testutil.RequireTools(t, "fio")
	p := startPlayground(t, "2GiB")
	victim := p.busiestLeader()
	fioDone := make(chan string, 1)
	go func() {
		fioDone <- fio(t, p.unixURI(), "--name=survive", "--rw=randwrite", "--bs=4k", "--size=1g",
			"--io_size=48m", "--iodepth=16", "--verify=crc32c", "--randseed=7")
	}()
	time.Sleep(2 * time.Second)
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill chunkserver %d: %v", victim.Index, err)
	}
	logf(t, "killed chunkserver %d (pid %d), the busiest leader", victim.Index, victim.PID)
	select {
	case out := <-fioDone:
		logf(t, "fio after the kill:\n%s", tail(out, 12))
	case <-time.After(8 * time.Minute):
		t.Fatal("fio did not finish after the leader was killed")
	}
	// It comes back with the command the playground recorded.
	cmd := exec.Command(victim.RestartCmd[0], victim.RestartCmd[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p.waitHealthy(60 * time.Second)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
