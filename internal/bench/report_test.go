package bench

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func testReport() *Report {
	st := func(iops, bs, meanUs, p99Us float64, ios uint64) Stats {
		return Stats{IOPS: iops, BWBytes: iops * bs, MeanNs: meanUs * 1e3, P99Ns: p99Us * 1e3, TotalIOs: ios}
	}
	durable := st(2000, 4096, 500, 1800, 40000)
	durable.P99Approx = true
	return &Report{
		Machine: Machine{
			Date: time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC), Host: "vm", Kernel: "6.1.0", NProc: 2,
			MemBytes: 24 << 30, Disk: "/dev/vda ext4 252G 13G 79G /", Device: "vda (virtio_blk)",
			Fio: "fio-3.33", NBDKit: "nbdkit 1.32.5", Basalt: "b354187", LoadStart: "0.10", LoadEnd: "1.20",
		},
		Size: 1 << 30, Runtime: 20 * time.Second, Ramp: 5 * time.Second,
		// Out of order on purpose: the table sorts by job, then target.
		Rows: []Row{
			{Target: TargetBasaltR3, Job: JobRandWriteQD1, Stats: st(800, 4096, 1250, 3000, 16000),
				Basalt: true, CPU: 4 * time.Second, PeakRSS: 300 << 20},
			{Target: TargetRaw, Job: JobRandWriteQD1, Stats: st(10000, 4096, 100, 400, 200000)},
			{Target: TargetRawSync, Job: jobDurable, Stats: durable},
			{Target: TargetNBDKit, Job: JobRandWriteQD1, Stats: st(20000, 4096, 50, 150, 400000)},
			{Target: TargetBasaltR3, Job: JobRandReadQD32, Stats: st(30000, 4096, 1066, 4000, 600000),
				Basalt: true, CPU: 30 * time.Second, PeakRSS: 320 << 20},
			{Target: TargetNBDKit, Job: JobRandReadQD32, Stats: st(45000, 4096, 711, 3000, 900000)},
			{Target: TargetBasaltR1, Job: JobRandReadQD32, Err: "fio: exit status 1"},
		},
		Procs: []ProcPeak{{Name: "playground (MDS, etcd, NBD)", PID: 100, PeakRSS: 120 << 20}},
		Notes: []string{"a note"},
	}
}

func TestMarkdownGolden(t *testing.T) {
	got := testReport().Markdown()
	path := filepath.Join("testdata", "report.golden.md")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run Golden -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("markdown differs from %s (go test -run Golden -update if intended):\n%s", path, got)
	}
}

func TestMarkdownFigures(t *testing.T) {
	md := testReport().Markdown()
	for _, want := range []string{
		// basalt-r3 QD1 write: 800/10000 IOPS, 800/20000; latency 1250/100, 1250/50;
		// CPU 4 s over 16,000 IOs = 2.50 s per 10k; RSS 300 MiB.
		"| basalt-r3 | randwrite-4k-qd1 | 800 | 3.1 | 1,250 | 3,000 | 0.08× | 0.04× | 12.50× | 25.00× | 2.50 | 300 |",
		// No raw row for randread-qd32: the ratio says so; no QD1 latency ratios.
		"| basalt-r3 | randread-4k-qd32 | 30,000 | 117.2 | 1,066 | 4,000 | — | 0.67× |  |  | 0.50 | 320 |",
		"| raw-fdatasync | randwrite-4k-qd1 | 2,000 | 7.8 | 500 | 1,800* |",
		"| basalt-r1 | randread-4k-qd32 | failed |",
		// Goals: 1250/500 = 2.5 ≤ 4; p99/mean = 2.4 ≤ 3; 30000/45000 = 67 % ≥ 60 %.
		"basalt-r3 randwrite-4k-qd1 mean ≤ 4 × raw-fdatasync mean: measured 2.50× — met",
		"basalt-r3 randread-4k-qd32 IOPS ≥ 60 % of nbdkit's: measured 67 % — met",
		"- playground (MDS, etcd, NBD) (pid 100): 120 MiB",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Rows sit side by side per job: raw, raw-fdatasync, nbdkit, basalt-r3.
	order := []string{"| raw | randwrite-4k-qd1", "| raw-fdatasync |", "| nbdkit | randwrite-4k-qd1", "| basalt-r3 | randwrite-4k-qd1", "| nbdkit | randread-4k-qd32"}
	last := -1
	for _, o := range order {
		i := strings.Index(md, o)
		if i < last {
			t.Errorf("%q is out of order", o)
		}
		last = i
	}
}

func TestGoalMissed(t *testing.T) {
	r := testReport()
	r.Rows[0].Stats.MeanNs = 2500e3 // 5 × the durable 500 µs
	md := r.Markdown()
	if want := "measured 5.00× — MISSED by 25 %"; !strings.Contains(md, want) {
		t.Errorf("markdown lacks %q:\n%s", want, md)
	}
}

// TestAgainstBaseline: a run with --baseline compares each basalt row with the
// baseline build's twin row and checks issue 13's large-write targets.
func TestAgainstBaseline(t *testing.T) {
	r := testReport()
	r.Machine.Baseline = "efa97bd (/tmp/old/basalt)"
	seq := func(target string, iops, meanUs, p99Us float64, cpu time.Duration) Row {
		return Row{Target: target, Job: JobSeqWrite, Basalt: true, CPU: cpu, PeakRSS: 300 << 20,
			Stats: Stats{IOPS: iops, BWBytes: iops * (256 << 10), MeanNs: meanUs * 1e3, P99Ns: p99Us * 1e3, TotalIOs: uint64(iops) * 20}}
	}
	r.Rows = append(r.Rows,
		// Before: 750 IOPS, 1.6 ms CPU per IO. After: 1,200 IOPS (1.6×), 0.7 ms (0.4375×), p99 4× mean.
		seq(TargetBasaltR3+BaselineSuffix, 750, 10800, 52000, 24*time.Second),
		seq(TargetBasaltR3, 1200, 6600, 26400, time.Duration(0.7e-3*24000*float64(time.Second))),
		// A 4 KiB row 20 % slower than its baseline is flagged.
		Row{Target: TargetBasaltR3 + BaselineSuffix, Job: JobRandWriteQD1, Basalt: true, CPU: 4 * time.Second,
			Stats: Stats{IOPS: 1000, BWBytes: 1000 * 4096, MeanNs: 1000e3, P99Ns: 2000e3, TotalIOs: 20000}},
	)
	md := r.Markdown()
	for _, want := range []string{
		"- baseline: rows `…@base` ran basalt efa97bd (/tmp/old/basalt), in the same sitting",
		"| basalt-r3@base | write-256k-qd8 | 750 | 187.5 |",
		"| basalt-r3 | write-256k-qd8 | 1.60× | 1.60× | 0.61× | 0.51× | 0.44× |",
		// randwrite-4k-qd1: 800 against 1,000 IOPS, 1,250 against 1,000 µs; CPU 4 s/16k against 4 s/20k.
		"| basalt-r3 | randwrite-4k-qd1 | 0.80× ! | 0.80× ! | 1.25× ! | 1.50× ! | 1.25× ! |",
		"CPU per IO ≤ 0.5 × the baseline's: measured 0.44× — met",
		"MiB/s ≥ 1.5 × the baseline's: measured 1.60× — met",
		"p99 < 5 × its own mean: measured 4.00× — met",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// The baseline's row sits right above the current build's.
	if i, j := strings.Index(md, "| basalt-r3@base | write-256k-qd8"), strings.Index(md, "| basalt-r3 | write-256k-qd8 | 1,200"); i < 0 || j < i {
		t.Errorf("baseline row not above the current row:\n%s", md)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999.4: "999", 1000: "1,000", 1234567.8: "1,234,568", -4500: "-4,500"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestSecurityModesSection: with the mode targets measured, the report
// shows each 4 KiB job's CPU per IO by mode and what each mode adds.
func TestSecurityModesSection(t *testing.T) {
	r := testReport()
	st := Stats{IOPS: 1000, BWBytes: 4096e3, MeanNs: 1e6, P99Ns: 2e6, TotalIOs: 10000}
	for target, cpu := range map[string]time.Duration{
		TargetBasaltR3Insecure:  1 * time.Second, // 100 µs / IO
		TargetBasaltR3TCP:       1200 * time.Millisecond,
		TargetBasaltR3Encrypted: 1500 * time.Millisecond,
	} {
		r.Rows = append(r.Rows, Row{Target: target, Job: JobRandWriteQD1, Stats: st, Basalt: true, CPU: cpu})
	}
	md := r.Markdown()
	for _, want := range []string{
		"## Security modes: the cost per 4 KiB IO",
		"| randwrite-4k-qd1 | basalt-r3-insecure | 1,000 | 1,000 | 100.0 |  |  |",
		"| randwrite-4k-qd1 | basalt-r3-tcp | 1,000 | 1,000 | 120.0 |",
		"| randwrite-4k-qd1 | basalt-r3-encrypted | 1,000 | 1,000 | 150.0 | +30.0 | 1.00× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
