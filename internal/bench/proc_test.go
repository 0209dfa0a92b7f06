package bench

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestSampleOwnProcess(t *testing.T) {
	before, err := SampleProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Burn a little CPU and touch 64 MiB so both counters must move.
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	// Spin until the kernel's own account (getrusage) shows 150 ms of CPU,
	// not for 150 ms of wall time: on a loaded machine that may be far less CPU.
	x := 0
	spun := selfCPU(t)
	for deadline := time.Now().Add(time.Minute); selfCPU(t)-spun < 150*time.Millisecond && time.Now().Before(deadline); {
		for range 100000 {
			x++
		}
	}
	after, err := SampleProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after.CPU - before.CPU; d < 50*time.Millisecond || d > 10*time.Second {
		t.Errorf("CPU used while spinning for 150ms of CPU: %s", d)
	}
	if after.PeakRSS < 64<<20 || after.PeakRSS < after.RSS || after.RSS == 0 {
		t.Errorf("peak RSS %d, RSS %d after touching 64 MiB", after.PeakRSS, after.RSS)
	}
	if buf[len(buf)-1] == 0 && x < 0 {
		t.Log(x) // keep buf and x alive
	}
}

func TestSampleGoneProcess(t *testing.T) {
	// PIDs never exceed pid_max (at most 2^22).
	if _, err := SampleProc(1 << 23); !errors.Is(err, ErrProcGone) {
		t.Fatalf("got %v, want ErrProcGone", err)
	}
}

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and parentheses; utime 250, stime 50 ticks.
	stat := "4242 (basalt (cs) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 1000 200"
	got, err := parseStatCPU([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("short stat accepted")
	}
}

func TestUsage(t *testing.T) {
	before := []ProcSample{{CPU: time.Second}, {CPU: 2 * time.Second}}
	after := []ProcSample{{CPU: 3 * time.Second, PeakRSS: 10 << 20}, {CPU: 2500 * time.Millisecond, PeakRSS: 20 << 20}}
	cpu, peak := usage(before, after)
	if cpu != 2500*time.Millisecond || peak != 30<<20 {
		t.Errorf("usage = %s, %d", cpu, peak)
	}
}

// selfCPU is this process's user and system CPU time as getrusage reports it.
func selfCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
