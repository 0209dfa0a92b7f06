package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testutil"
)

// runFio runs job j for one second with ioengine=psync on a small file and
// returns fio's JSON.
func runFio(t *testing.T, j Job) []byte {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "f.img")
	const size = 8 << 20
	if err := createFile(path, size); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.json")
	args := append(j.fioArgs(size, time.Second, 0), "--ioengine=psync", "--filename="+path, "--output="+out)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b, err := exec.CommandContext(ctx, "fio", args...).CombinedOutput(); err != nil {
		t.Fatalf("fio %v: %v\n%s", args, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkStats(t *testing.T, s Stats, bs int) {
	t.Helper()
	if s.IOPS <= 0 || s.TotalIOs == 0 {
		t.Fatalf("no IO: %+v", s)
	}
	// bw = iops × block size, within fio's rounding.
	if got, want := s.BWBytes, s.IOPS*float64(bs); math.Abs(got-want)/want > 0.02 {
		t.Errorf("bandwidth %.0f B/s, want about %.0f (IOPS × bs)", got, want)
	}
	if s.MeanNs <= 0 || math.IsNaN(s.P99Ns) || s.P99Ns < s.MeanNs/10 {
		t.Errorf("implausible latency: mean %.0f ns, p99 %.0f ns", s.MeanNs, s.P99Ns)
	}
}

func TestParseRealFioOutput(t *testing.T) {
	testutil.RequireTool(t, "fio")
	t.Run("randrw-mixed", func(t *testing.T) {
		t.Parallel()
		j := Job{Name: "mixed", RW: "randrw", BlockSize: 4096, IODepth: 1, RWMixRead: 50}
		s, version, err := ParseFio(runFio(t, j), false)
		if err != nil {
			t.Fatal(err)
		}
		if version == "" {
			t.Error("no fio version")
		}
		checkStats(t, s, j.BlockSize)
		if s.P99Approx {
			t.Error("unified_rw_reporting=mixed gives one exact p99, yet it is marked approximate")
		}
	})
	t.Run("randwrite-fdatasync", func(t *testing.T) {
		t.Parallel()
		j := Job{Name: "durable", RW: "randwrite", BlockSize: 4096, IODepth: 1, FDataSync: true}
		data := runFio(t, j)
		plain, _, err := ParseFio(data, false)
		if err != nil {
			t.Fatal(err)
		}
		s, _, err := ParseFio(data, true)
		if err != nil {
			t.Fatal(err)
		}
		checkStats(t, s, j.BlockSize)
		if want := 1e9 / s.IOPS; math.Abs(s.MeanNs-want) > 1 {
			t.Errorf("durable mean %.0f ns, want 1/IOPS = %.0f ns", s.MeanNs, want)
		}
		if !s.P99Approx || s.P99Ns <= plain.P99Ns {
			t.Errorf("durable p99 %.0f ns should add the sync p99 to the write p99 %.0f ns", s.P99Ns, plain.P99Ns)
		}
	})
}

func TestParseFioSeparateDirections(t *testing.T) {
	// Trimmed fio 3.33 output of a randrw job without unified reporting, led by a
	// warning line as fio sometimes prints.
	data := []byte(`fio: some warning
{"fio version": "fio-3.33", "jobs": [{"jobname": "x", "error": 0,
 "read":  {"bw_bytes": 4096000, "iops": 1000, "total_ios": 3000,
           "lat_ns": {"N": 3000, "mean": 100000, "percentile": {"50.000000": 90000, "99.000000": 300000}}},
 "write": {"bw_bytes": 12288000, "iops": 3000, "total_ios": 9000,
           "lat_ns": {"N": 9000, "mean": 200000},
           "clat_ns": {"N": 9000, "mean": 190000, "percentile": {"99.000000": 500000}}},
 "trim":  {"bw_bytes": 0, "iops": 0, "total_ios": 0}}]}`)
	s, v, err := ParseFio(data, false)
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{IOPS: 4000, BWBytes: 16384000, MeanNs: 175000, P99Ns: 500000, TotalIOs: 12000, P99Approx: true}
	if s != want || v != "fio-3.33" {
		t.Fatalf("got %+v %q, want %+v", s, v, want)
	}
}

func TestParseFioErrors(t *testing.T) {
	for name, data := range map[string]string{
		"not json":  "fio: engine nbd not loadable",
		"no jobs":   `{"fio version": "fio-3.33", "jobs": []}`,
		"job error": `{"jobs": [{"jobname": "x", "error": 5}]}`,
		"no io":     `{"jobs": [{"jobname": "x", "read": {"total_ios": 0}, "write": {"total_ios": 0}}]}`,
	} {
		if _, _, err := ParseFio([]byte(data), false); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	_, _, err := ParseFio([]byte(`{"jobs": [{"jobname": "x", "error": 5}]}`), false)
	if !errors.Is(err, ErrFioJob) {
		t.Errorf("job error: %v, want ErrFioJob", err)
	}
}

func TestFioArgs(t *testing.T) {
	got := JobRandRW.fioArgs(1<<30, 20*time.Second, 1500*time.Millisecond)
	want := []string{"--name=randrw-8k-qd8", "--rw=randrw", "--bs=8192", "--iodepth=8", "--size=1073741824",
		"--numjobs=1", "--group_reporting", "--lat_percentiles=1", "--randrepeat=0", "--norandommap",
		"--output-format=json", "--time_based", "--runtime=20", "--ramp_time=1500ms",
		"--rwmixread=50", "--unified_rw_reporting=mixed"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("fioArgs:\n got %v\nwant %v", got, want)
	}
	if a := fmt.Sprint(prefillJob.fioArgs(1<<20, 0, 0)); strings.Contains(a, "time_based") || strings.Contains(a, "ramp") {
		t.Errorf("prefill must run once over the file, not by time: %s", a)
	}
}
