package iscsi

// QEMU's iSCSI driver (libiscsi, Debian qemu-block-extra) as a real client:
// qemu-img convert in and out with checksums compared, qemu-io with patterns.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// runTool runs a client with a deadline (a hung client is killed) and fails
// the test with its bounded output if it fails.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = t.TempDir()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if len(out) > 4000 {
			out = out[len(out)-4000:]
		}
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// requireQemuISCSI skips unless qemu-img has its iSCSI driver.
func requireQemuISCSI(t *testing.T) {
	t.Helper()
	testutil.RequireTools(t, "qemu-img", "qemu-io")
	out, _ := exec.Command("qemu-img", "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("iscsi")) {
		t.Skip("qemu-img has no iscsi driver (Debian package qemu-block-extra)")
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestQemuImgConvert(t *testing.T) {
	requireQemuISCSI(t)
	const size = 24 << 20
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(size)}, Config{})
	target := TargetName(testCluster, "disk")
	url := "iscsi://" + addr + "/" + target + "/0"

	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < size; i += 4096 {
		if rng.IntN(4) == 0 {
			continue // leave some holes, which qemu-img may skip or zero
		}
		for j := i; j < i+4096; j += 8 {
			v := rng.Uint64()
			for k := range 8 {
				data[j+k] = byte(v >> (8 * k))
			}
		}
	}
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, url)
	out := filepath.Join(dir, "out.img")
	runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "raw", url, out)
	if fileSum(t, src) != fileSum(t, out) {
		t.Fatalf("the image read back over iSCSI differs from the one written")
	}

	// The same with CRC32C header digests, through --image-opts.
	opts := "driver=iscsi,transport=tcp,portal=" + addr + ",target=" + target + ",lun=0,header-digest=crc32c"
	out2 := filepath.Join(dir, "out2.img")
	runTool(t, "qemu-img", "convert", "--image-opts", "-O", "raw", opts, out2)
	if fileSum(t, src) != fileSum(t, out2) {
		t.Fatalf("the image read back with header digests differs")
	}

	info := runTool(t, "qemu-img", "info", url)
	if !strings.Contains(info, "25165824 bytes") {
		t.Errorf("qemu-img info: %s", info)
	}
	// qemu-io: patterns written and read back, and a discard that reads as zeros.
	runTool(t, "qemu-io", "-f", "raw",
		"-c", "write -P 0xab 1M 3M", "-c", "read -P 0xab 1M 3M",
		"-c", "write -z 2M 64k", "-c", "read -P 0 2M 64k",
		"-c", "discard 8M 1M", "-c", "read -P 0 8M 1M", url)
}
