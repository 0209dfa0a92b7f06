package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat. It is 100
// on every Linux architecture Go supports (sysconf(_SC_CLK_TCK) needs cgo).
const clockTicks = 100

// ErrProcGone: the process to sample no longer exists.
var ErrProcGone = errors.New("bench: process is gone")

// ProcSample is one reading of a process's resource use.
type ProcSample struct {
	CPU     time.Duration // utime + stime
	PeakRSS uint64        // VmHWM, bytes
	RSS     uint64        // VmRSS, bytes
}

// SampleProc reads /proc/PID/stat and /proc/PID/status.
func SampleProc(pid int) (ProcSample, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return ProcSample{}, fmt.Errorf("%w: pid %d", ErrProcGone, pid)
		}
		return ProcSample{}, err
	}
	cpu, err := parseStatCPU(stat)
	if err != nil {
		return ProcSample{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcSample{}, fmt.Errorf("%w: pid %d: %v", ErrProcGone, pid, err)
	}
	return ProcSample{
		CPU:     cpu,
		PeakRSS: statusKB(status, "VmHWM:") << 10,
		RSS:     statusKB(status, "VmRSS:") << 10,
	}, nil
}

// parseStatCPU returns utime+stime from the text of /proc/PID/stat. The command
// name (field 2) is in parentheses and may hold spaces and parentheses itself, so
// fields are counted from the last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: malformed /proc stat")
	}
	// After ')': field 3 (state) is rest[0]; utime is field 14, stime field 15.
	rest := strings.Fields(string(stat[i+1:]))
	if len(rest) < 13 {
		return 0, fmt.Errorf("bench: short /proc stat (%d fields)", len(rest))
	}
	ut, err1 := strconv.ParseUint(rest[11], 10, 64)
	st, err2 := strconv.ParseUint(rest[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: malformed utime/stime in /proc stat")
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// statusKB returns the value in kB of a "Key:   123 kB" line, or 0.
func statusKB(status []byte, key string) uint64 {
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseUint(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// procSet is the basalt processes of one target and what they were called.
type procSet struct {
	names []string
	pids  []int
}

// sample reads every process; the first failure is returned.
func (p procSet) sample() ([]ProcSample, error) {
	out := make([]ProcSample, len(p.pids))
	for i, pid := range p.pids {
		s, err := SampleProc(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.names[i], err)
		}
		out[i] = s
	}
	return out, nil
}

// usage sums the CPU used between two samples and the peak RSS at the second.
func usage(before, after []ProcSample) (cpu time.Duration, peak uint64) {
	for i := range after {
		if i < len(before) {
			cpu += after[i].CPU - before[i].CPU
		}
		peak += after[i].PeakRSS
	}
	return cpu, peak
}
