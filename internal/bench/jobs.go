package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Job is one entry of the fio matrix.
type Job struct {
	Name      string // how --jobs and the table name it
	RW        string // fio rw=
	BlockSize int    // bytes
	IODepth   int
	RWMixRead int  // percent reads for randrw; 0 otherwise
	FDataSync bool // fdatasync after every write (the raw durable floor)
}

// QD1 reports whether the job keeps one IO in flight, which makes its latency
// the interesting figure.
func (j Job) QD1() bool { return j.IODepth == 1 }

// mixed reports whether the job both reads and writes.
func (j Job) mixed() bool { return j.RWMixRead > 0 }

// The jobs of the matrix, in table order.
var (
	JobRandWriteQD1  = Job{Name: "randwrite-4k-qd1", RW: "randwrite", BlockSize: 4 << 10, IODepth: 1}
	JobRandWriteQD32 = Job{Name: "randwrite-4k-qd32", RW: "randwrite", BlockSize: 4 << 10, IODepth: 32}
	JobRandReadQD1   = Job{Name: "randread-4k-qd1", RW: "randread", BlockSize: 4 << 10, IODepth: 1}
	JobRandReadQD32  = Job{Name: "randread-4k-qd32", RW: "randread", BlockSize: 4 << 10, IODepth: 32}
	JobSeqWrite      = Job{Name: "write-256k-qd8", RW: "write", BlockSize: 256 << 10, IODepth: 8}
	JobRandRW        = Job{Name: "randrw-8k-qd8", RW: "randrw", BlockSize: 8 << 10, IODepth: 8, RWMixRead: 50}

	// jobDurable is the raw-only durable variant of JobRandWriteQD1; its rows are
	// labelled with target TargetRawSync and job JobRandWriteQD1.Name.
	jobDurable = Job{Name: JobRandWriteQD1.Name, RW: "randwrite", BlockSize: 4 << 10, IODepth: 1, FDataSync: true}

	// prefillJob writes the whole working set once.
	prefillJob = Job{Name: "prefill", RW: "write", BlockSize: 1 << 20, IODepth: 8}
)

// AllJobs is the default matrix.
var AllJobs = []Job{JobRandWriteQD1, JobRandWriteQD32, JobRandReadQD1, JobRandReadQD32, JobSeqWrite, JobRandRW}

// Target names.
const (
	TargetRaw      = "raw"
	TargetRawSync  = "raw-fdatasync" // the durable variant of raw's QD1 write
	TargetNBDKit   = "nbdkit"
	TargetBasaltR3 = "basalt-r3"
	TargetBasaltR1 = "basalt-r1"

	// The security modes (docs/security.md), each basalt-r3 on a playground
	// of its own: without TLS or authentication (the pre-security path),
	// authenticated over TCP (no same-host socket: the fair base for the
	// next), and encrypted (TLS for every connection, over TCP). basalt-r3
	// is authenticated on the same-host socket, as deployed.
	TargetBasaltR3Insecure  = "basalt-r3-insecure"
	TargetBasaltR3TCP       = "basalt-r3-tcp"
	TargetBasaltR3Encrypted = "basalt-r3-encrypted"

	// The front ends side by side (docs/performance.md), on basalt-r3's
	// playground and volume: NVMe/TCP driven by the Go host
	// (internal/nvmfhost), and iSCSI and NBD both driven by `qemu-img bench`
	// (libiscsi, QEMU's NBD client on the Unix socket); all three at
	// qemu-img bench's strided offsets (qemuBenchOffset), so the rows
	// compare protocols, not access patterns.
	TargetBasaltR3NVMf    = "basalt-r3-nvmf"
	TargetBasaltR3ISCSI   = "basalt-r3-iscsi"
	TargetBasaltR3QemuNBD = "basalt-r3-qemu-nbd"
)

var frontendTargets = []string{TargetBasaltR3NVMf, TargetBasaltR3ISCSI, TargetBasaltR3QemuNBD}

// BaselineSuffix marks a basalt target run with Config.Baseline's binary instead of
// Config.Binary: "basalt-r3@base" is basalt-r3 as the baseline build serves it.
const BaselineSuffix = "@base"

// AllTargets is the default set, in table order (the durable raw row follows raw).
// The basalt-r3 modes run last: each starts a playground of its own.
var AllTargets = []string{TargetRaw, TargetNBDKit, TargetBasaltR3, TargetBasaltR3NVMf, TargetBasaltR3QemuNBD, TargetBasaltR3ISCSI, TargetBasaltR1,
	TargetBasaltR3Insecure, TargetBasaltR3TCP, TargetBasaltR3Encrypted}

// SelectJobs returns the jobs named in the comma-separated list, in matrix order;
// an empty list selects all.
func SelectJobs(list string) ([]Job, error) {
	names, err := pick(list, func() []string {
		var n []string
		for _, j := range AllJobs {
			n = append(n, j.Name)
		}
		return n
	}())
	if err != nil {
		return nil, fmt.Errorf("--jobs: %w", err)
	}
	var out []Job
	for _, j := range AllJobs {
		if names[j.Name] {
			out = append(out, j)
		}
	}
	return out, nil
}

// SelectTargets returns the targets named in the comma-separated list, in table
// order; an empty list selects all.
func SelectTargets(list string) ([]string, error) {
	names, err := pick(list, AllTargets)
	if err != nil {
		return nil, fmt.Errorf("--targets: %w", err)
	}
	var out []string
	for _, t := range AllTargets {
		if names[t] {
			out = append(out, t)
		}
	}
	return out, nil
}

func pick(list string, known []string) (map[string]bool, error) {
	set := map[string]bool{}
	if strings.TrimSpace(list) == "" {
		for _, k := range known {
			set[k] = true
		}
		return set, nil
	}
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		ok := false
		for _, k := range known {
			if k == p {
				ok = true
			}
		}
		if !ok {
			return nil, fmt.Errorf("unknown name %q (known: %s)", p, strings.Join(known, ", "))
		}
		set[p] = true
	}
	if len(set) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return set, nil
}

// fioArgs returns the job's fio arguments, without the engine and target ones.
// A zero runtime means "once over the working set" (the prefill).
func (j Job) fioArgs(size uint64, runtime, ramp time.Duration) []string {
	a := []string{
		"--name=" + j.Name,
		"--rw=" + j.RW,
		"--bs=" + strconv.Itoa(j.BlockSize),
		"--iodepth=" + strconv.Itoa(j.IODepth),
		"--size=" + strconv.FormatUint(size, 10),
		"--numjobs=1",
		"--group_reporting",
		"--lat_percentiles=1",
		"--randrepeat=0",
		"--norandommap",
		"--output-format=json",
	}
	if runtime > 0 {
		a = append(a, "--time_based", "--runtime="+seconds(runtime))
		if ramp > 0 {
			a = append(a, "--ramp_time="+seconds(ramp))
		}
	}
	if j.mixed() {
		a = append(a, "--rwmixread="+strconv.Itoa(j.RWMixRead), "--unified_rw_reporting=mixed")
	}
	if j.FDataSync {
		a = append(a, "--fdatasync=1")
	}
	return a
}

// seconds renders d for fio, which takes plain seconds or a unit suffix.
func seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10)
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// ParseDuration reads a duration as fio and people write it: plain seconds
// ("20", "1.5") or with a unit ("20s", "500ms", "1m").
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(t, 64); err == nil {
		if f < 0 || f > 1e6 {
			return 0, fmt.Errorf("not a duration: %q", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(t)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("not a duration: %q (use e.g. 20, 20s, 500ms)", s)
	}
	return d, nil
}

// ParseSize reads a byte count the way fio and people write it: "1GiB", "256m",
// "512M", "4k", "1048576". Suffixes are binary (k = 1024).
func ParseSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "b"), "i")
	mult := uint64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(t), 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("not a size: %q (use e.g. 1GiB, 256m, 4096)", s)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("size too large: %q", s)
	}
	return n * mult, nil
}
