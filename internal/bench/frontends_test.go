package bench

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testutil"
)

// qemuBenchJobs are the jobs `qemu-img bench` runs, so the ones whose
// NVMe/TCP offsets must be its offsets.
func qemuBenchJobs(t *testing.T) []Job {
	var jobs []Job
	for _, j := range AllJobs {
		if qemuBenchSupports(j) {
			jobs = append(jobs, j)
		}
	}
	if len(jobs) < 4 {
		t.Fatalf("only %d jobs run on qemu-img bench", len(jobs))
	}
	return jobs
}

// TestNVMfOffsetsFollowQemuBenchArgs: the Go host's offsets for a job are
// the sequence the job's `qemu-img bench` arguments ask for: from 0, plus
// the -S step per request, wrapping modulo the image size (qemu 7.2).
func TestNVMfOffsetsFollowQemuBenchArgs(t *testing.T) {
	const size = 256 << 20
	for _, j := range qemuBenchJobs(t) {
		args := qemuBenchArgs("nbd://x", j, 1)
		i := slices.Index(args, "-S")
		if i < 0 {
			t.Fatalf("%s: no -S in %v", j.Name, args)
		}
		step, err := strconv.ParseInt(args[i+1], 10, 64)
		if err != nil || step <= 0 {
			t.Fatalf("%s: -S %q", j.Name, args[i+1])
		}
		var want int64
		for k := range int64(3*size/j.BlockSize + 5) {
			if got := nvmfOffset(j, size, k, nil); got != want {
				t.Fatalf("%s: request %d at %d, qemu-img bench -S %d puts it at %d", j.Name, k, got, step, want)
			}
			if want+int64(j.BlockSize) > size {
				t.Fatalf("%s: request %d at %d overruns the %d-byte volume", j.Name, k, want, size)
			}
			want = (want + step) % size
		}
	}
}

var nbdkitLogRequest = regexp.MustCompile(`(?m)^.* (?:Read|Write) id=\d+ offset=0x([0-9a-f]+) `)

// TestNVMfOffsetsMatchQemuImg: the real judge. `qemu-img bench`, run with
// the bench's arguments against an nbdkit memory disk whose log filter
// records every request, asks for exactly the offsets the Go host uses:
// in order at queue depth 1, the same ones at higher depths (where requests
// complete, and so are logged, out of order). Each run wraps the disk twice.
func TestNVMfOffsetsMatchQemuImg(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nbdkit and qemu-img; not in -short")
	}
	testutil.RequireTools(t, "qemu-img", "nbdkit")
	const size = 8 << 20
	dir := t.TempDir()
	sock, logf := filepath.Join(dir, "nbd.sock"), filepath.Join(dir, "log")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, "nbdkit", "-f", "-U", sock, "--filter=log", "memory", strconv.Itoa(size), "logfile="+logf)
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nbdkit made no socket in a minute")
		}
	}
	uri := "nbd+unix:///?socket=" + sock
	logged := 0
	for _, j := range qemuBenchJobs(t) {
		count := 2*size/j.BlockSize + 7
		if out, err := exec.CommandContext(ctx, "qemu-img", qemuBenchArgs(uri, j, count)...).CombinedOutput(); err != nil {
			t.Fatalf("%s: qemu-img bench: %v: %s", j.Name, err, out)
		}
		// Every request is logged before its reply is sent, so before
		// qemu-img exits; read the log up to this run's requests.
		var got []int64
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			got = loggedOffsets(t, logf)
			if len(got) >= logged+count || time.Now().After(deadline) {
				break
			}
		}
		if len(got) != logged+count {
			t.Fatalf("%s: %d requests logged, want %d", j.Name, len(got)-logged, count)
		}
		got = got[logged:]
		logged += count
		want := make([]int64, count)
		for k := range want {
			want[k] = nvmfOffset(j, size, int64(k), nil)
		}
		if j.IODepth > 1 {
			slices.Sort(got)
			slices.Sort(want)
		}
		for k := range want {
			if got[k] != want[k] {
				t.Fatalf("%s (depth %d): qemu-img's request %d at %d, the Go host's at %d", j.Name, j.IODepth, k, got[k], want[k])
			}
		}
		t.Logf("%s: %d requests, the same offsets", j.Name, count)
	}
}

func loggedOffsets(t *testing.T, path string) []int64 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var offs []int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := nbdkitLogRequest.FindStringSubmatch(sc.Text() + " "); m != nil {
			o, err := strconv.ParseInt(m[1], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			offs = append(offs, o)
		}
	}
	return offs
}
