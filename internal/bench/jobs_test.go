package bench

import (
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"1GiB": 1 << 30, "256m": 256 << 20, "512M": 512 << 20, "4k": 4096, "4096": 4096,
		"2g": 2 << 30, "1 TiB": 1 << 40, "64MB": 64 << 20,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "m", "-1G", "1.5G", "1X"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func TestSelect(t *testing.T) {
	jobs, err := SelectJobs(" randread-4k-qd1,randwrite-4k-qd1 ")
	if err != nil || len(jobs) != 2 || jobs[0] != JobRandWriteQD1 || jobs[1] != JobRandReadQD1 {
		t.Errorf("SelectJobs = %v, %v; want matrix order", jobs, err)
	}
	if all, _ := SelectJobs(""); len(all) != len(AllJobs) {
		t.Errorf("empty --jobs selects %d jobs", len(all))
	}
	if _, err := SelectJobs("randwrite-4k-qd2"); err == nil {
		t.Error("unknown job accepted")
	}
	targets, err := SelectTargets("basalt-r1,raw")
	if err != nil || len(targets) != 2 || targets[0] != TargetRaw || targets[1] != TargetBasaltR1 {
		t.Errorf("SelectTargets = %v, %v", targets, err)
	}
	if _, err := SelectTargets("ceph"); err == nil {
		t.Error("unknown target accepted")
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"5": 5 * time.Second, "1.5": 1500 * time.Millisecond, "20s": 20 * time.Second, "500ms": 500 * time.Millisecond, "0": 0,
	} {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "5x", "-2s"} {
		if _, err := ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) accepted", bad)
		}
	}
}
