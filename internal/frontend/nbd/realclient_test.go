package nbd

// Real clients nobody here wrote judge the server: libnbd's nbdinfo, qemu-img
// and fio's nbd engine, over a Unix socket, against the memory backend. Each
// test skips, loudly, when its tool is missing (Debian: libnbd-bin, qemu-utils,
// fio).

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/testutil"
)

func nbdURI(sock, export string) string {
	return "nbd+unix:///" + export + "?socket=" + sock
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = t.TempDir() // fio leaves verify state files in its working directory
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

func TestNbdinfo(t *testing.T) {
	testutil.RequireTool(t, "nbdinfo")
	ro := frontendtest.NewDisk(1 << 20)
	ro.ReadOnly = true
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": frontendtest.NewDisk(48 << 20), "ro": ro}.Exports()})

	var info struct {
		Exports []map[string]any `json:"exports"`
	}
	out := run(t, "nbdinfo", "--json", nbdURI(ts.sock, "disk"))
	if err := json.Unmarshal(out, &info); err != nil || len(info.Exports) != 1 {
		t.Fatalf("nbdinfo --json output %s: %v", out, err)
	}
	e := info.Exports[0]
	want := map[string]any{
		"export-name":          "disk",
		"export-size":          float64(48 << 20),
		"block_size_minimum":   float64(1),
		"block_size_preferred": float64(4096),
		"block_size_maximum":   float64(32 << 20),
		"is_read_only":         false,
		"can_flush":            true,
		"can_fua":              true,
		"can_trim":             true,
		"can_zero":             true,
		"can_multi_conn":       true,
	}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("nbdinfo %s = %v, want %v", k, e[k], v)
		}
	}

	out = run(t, "nbdinfo", "--json", nbdURI(ts.sock, "ro"))
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if e := info.Exports[0]; e["is_read_only"] != true || e["can_trim"] != false {
		t.Errorf("read-only export: is_read_only %v can_trim %v", e["is_read_only"], e["can_trim"])
	}

	out = run(t, "nbdinfo", "--list", "--json", nbdURI(ts.sock, ""))
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("nbdinfo --list: %s: %v", out, err)
	}
	var names []string
	for _, e := range info.Exports {
		names = append(names, e["export-name"].(string))
	}
	if strings.Join(names, ",") != "disk,ro" {
		t.Errorf("nbdinfo --list exports %q, want disk,ro", names)
	}
}

func TestQemuImgConvertRoundTrip(t *testing.T) {
	testutil.RequireTool(t, "qemu-img")
	const size = 24 << 20
	disk := frontendtest.NewDisk(size)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})

	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	dst := filepath.Join(dir, "dst.img")
	rng := rand.New(rand.NewPCG(3, 4))
	img := make([]byte, size)
	for i := 0; i < size; i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			img[i+j] = byte(v >> (8 * j))
		}
	}
	clear(img[4<<20 : 6<<20]) // a hole, which qemu may write as zeroes
	if err := os.WriteFile(src, img, 0o644); err != nil {
		t.Fatal(err)
	}
	uri := nbdURI(ts.sock, "disk")
	run(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, uri)
	if !bytes.Equal(disk.Bytes(0, size), img) {
		t.Fatal("export content differs from the image written by qemu-img")
	}
	run(t, "qemu-img", "convert", "-f", "raw", "-O", "raw", uri, dst)
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(img) {
		t.Fatal("checksum of the image read back differs")
	}
	out := run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri)
	if !strings.Contains(string(out), "identical") {
		t.Errorf("qemu-img compare: %s", out)
	}
}

func TestFioMultiConnVerify(t *testing.T) {
	testutil.RequireTool(t, "fio")
	const jobs, region = 4, 8 << 20
	disk := frontendtest.NewDisk(jobs * region)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	out := run(t, "fio",
		"--name=nbdverify", "--ioengine=nbd", "--uri="+nbdURI(ts.sock, "disk"),
		"--rw=randwrite", "--bssplit=4k/70:64k/30", "--iodepth=16",
		"--numjobs=4", "--size=8M", "--offset_increment=8M",
		"--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0", "--randseed=42",
		"--group_reporting", "--output-format=json",
	)
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"write"`
			Read struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:] // fio may print notes before the JSON
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		t.Fatalf("fio output: %v\n%s", err, out)
	}
	j := res.Jobs[0]
	if j.Error != 0 || j.Write.IOBytes != jobs*region || j.Read.IOBytes != jobs*region {
		t.Fatalf("fio: error %d, wrote %d, verified %d bytes; want 0, %d, %d", j.Error, j.Write.IOBytes, j.Read.IOBytes, jobs*region, jobs*region)
	}
	if n := ts.accepted.Load(); n < jobs {
		t.Errorf("fio used %d connections, want at least %d (one per job)", n, jobs)
	}
}
