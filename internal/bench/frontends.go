package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/nvmfhost"
)

// The front ends side by side (issues 16 and 17): the playground's 3-replica
// volume over NVMe/TCP, driven by the Go host (internal/nvmfhost), and over
// iSCSI and NBD, driven by `qemu-img bench` (libiscsi and QEMU's NBD client:
// the same user-space client for both).

// drive runs work, which calls rampDone when its ramp ends, and samples the
// CPU of procs from then to the end of work.
func drive(procs procSet, work func(rampDone func()) (Stats, error)) (fioResult, error) {
	var (
		before []ProcSample
		serr   error
	)
	st, err := work(func() {
		if len(procs.pids) > 0 {
			before, serr = procs.sample()
		}
	})
	if err != nil {
		return fioResult{}, err
	}
	res := fioResult{Stats: st}
	if len(procs.pids) > 0 && before != nil {
		after, err := procs.sample()
		if err = errors.Join(serr, err); err != nil {
			return fioResult{}, fmt.Errorf("sampling basalt processes: %w", err)
		}
		res.CPU, res.PeakRSS = usage(before, after)
	}
	return res, nil
}

// openBasaltR3NVMf connects the Go NVMe/TCP host to the playground's
// 3-replica volume: one I/O queue (as fio's NBD engine has one connection).
func (r *runner) openBasaltR3NVMf(ctx context.Context, name string) (*target, error) {
	p, err := r.playground(ctx, name)
	if err != nil {
		return nil, err
	}
	if p.state.NVMf == "" || p.state.NVMfNQN == "" {
		return nil, errors.New("the playground serves no NVMe/TCP")
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	h, err := nvmfhost.Connect(cctx, p.state.NVMf, p.state.NVMfNQN, nvmfhost.Options{Queues: 1, QueueSize: 128})
	if err != nil {
		return nil, fmt.Errorf("NVMe/TCP connect to %s: %w", p.state.NVMf, err)
	}
	if h.Size() < int64(r.cfg.Size) {
		h.Close()
		return nil, fmt.Errorf("NVMe/TCP namespace of %d bytes, want %d", h.Size(), r.cfg.Size)
	}
	r.log.Info("NVMe/TCP host connected", "addr", p.state.NVMf, "nqn", p.state.NVMfNQN,
		"mdts", h.MaxTransfer, "in_capsule", h.InCapsule)
	t := &target{name: name, procs: p.procs(), close: func() { h.Close() }}
	t.driver = func(ctx context.Context, j Job, runtime, ramp time.Duration, procs procSet) (fioResult, error) {
		return drive(procs, func(rampDone func()) (Stats, error) {
			return runNVMf(ctx, h, j, r.cfg.Size, runtime, ramp, rampDone)
		})
	}
	return t, nil
}

// runNVMf runs job j on queue 0 of h with j.IODepth commands in flight: for
// runtime after ramp, or for size / block size requests when runtime is 0.
func runNVMf(ctx context.Context, h *nvmfhost.Host, j Job, size uint64, runtime, ramp time.Duration, rampDone func()) (Stats, error) {
	bs := int64(j.BlockSize)
	blocks := int64(size) / bs
	var (
		next     atomic.Int64 // the next request's number
		measured atomic.Bool
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
		lats     = make([][]int64, j.IODepth)
		bytesN   = make([]int64, j.IODepth)
	)
	start := time.Now()
	rampEnd, end := start.Add(ramp), start.Add(ramp+runtime)
	if ramp == 0 && runtime > 0 {
		measured.Store(true)
		rampDone()
	}
	var rampOnce sync.Once
	for w := range j.IODepth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, bs)
			rand.Read(buf)
			rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			for ctx.Err() == nil {
				now := time.Now()
				if runtime > 0 {
					if now.After(end) {
						return
					}
					if !measured.Load() && now.After(rampEnd) {
						rampOnce.Do(func() { rampDone(); measured.Store(true) })
					}
				}
				k := next.Add(1) - 1
				if runtime == 0 && k >= blocks {
					return
				}
				off := nvmfOffset(j, size, k, rng)
				write := j.RW == "write" || j.RW == "randwrite" || (j.mixed() && rng.IntN(100) >= j.RWMixRead)
				var err error
				t0 := time.Now()
				if write {
					err = h.WriteAt(0, buf, off)
				} else {
					err = h.ReadAt(0, buf, off)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("NVMe/TCP %s of %d bytes at %d: %w", j.RW, bs, off, err) })
					return
				}
				if runtime == 0 || (measured.Load() && t0.After(rampEnd)) {
					lats[w] = append(lats[w], int64(time.Since(t0)))
					bytesN[w] += bs
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return Stats{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	elapsed := time.Since(start)
	if runtime > 0 {
		elapsed = runtime
	}
	var all []int64
	var total int64
	for w := range lats {
		all = append(all, lats[w]...)
		total += bytesN[w]
	}
	if len(all) == 0 {
		return Stats{}, errors.New("no IO completed")
	}
	slices.Sort(all)
	var sum float64
	for _, l := range all {
		sum += float64(l)
	}
	return Stats{
		IOPS:     float64(len(all)) / elapsed.Seconds(),
		BWBytes:  float64(total) / elapsed.Seconds(),
		MeanNs:   sum / float64(len(all)),
		P99Ns:    float64(all[int(math.Ceil(0.99*float64(len(all))))-1]),
		TotalIOs: uint64(len(all)),
	}, nil
}

// nvmfOffset is the offset of the Go host's request k of job j on a volume
// of size bytes: `qemu-img bench`'s (qemuBenchOffset) for a job it runs, so
// the front-end rows compare protocols, not access patterns (issue 17);
// uniformly random, block-aligned, for the others (mixed).
func nvmfOffset(j Job, size uint64, k int64, rng *mrand.Rand) int64 {
	if qemuBenchSupports(j) {
		return qemuBenchOffset(j, size, k)
	}
	bs := int64(j.BlockSize)
	return rng.Int64N(int64(size)/bs) * bs
}

// qemuBenchSupports: qemu-img bench reads or writes (not both) at a fixed
// stride.
func qemuBenchSupports(j Job) bool { return !j.mixed() && !j.FDataSync }

// openQemuBench serves the playground's 3-replica volume to `qemu-img bench`
// at uri (its iSCSI LUN or its NBD socket).
func (r *runner) openQemuBench(ctx context.Context, name string, iscsi bool) (*target, error) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		return nil, fmt.Errorf("qemu-img not found (run ./scripts/install-deps): %w", err)
	}
	p, err := r.playground(ctx, name)
	if err != nil {
		return nil, err
	}
	uri := "nbd+unix:///" + volumeR3 + "?socket=" + p.state.NBDSocket
	if iscsi {
		if p.state.ISCSIURI == "" {
			return nil, errors.New("the playground serves no iSCSI")
		}
		uri = p.state.ISCSIURI
	}
	t := &target{name: name, procs: p.procs(), close: func() {}, supports: qemuBenchSupports}
	t.driver = func(ctx context.Context, j Job, runtime, ramp time.Duration, procs procSet) (fioResult, error) {
		return drive(procs, func(rampDone func()) (Stats, error) {
			return r.runQemuBench(ctx, uri, j, runtime, rampDone)
		})
	}
	return t, nil
}

// qemuBenchStride is the step between the offsets of consecutive requests
// of job j in `qemu-img bench` (-S; its default is the block size, so the
// sequential jobs read or write in order).
func qemuBenchStride(j Job) int64 {
	if j.RW == "randwrite" || j.RW == "randread" {
		// No random offsets in qemu-img bench: a stride of 1 MiB and one
		// block spreads consecutive requests over the volume's chunks.
		return 1<<20 + int64(j.BlockSize)
	}
	return int64(j.BlockSize)
}

// qemuBenchOffset is the offset of request k (from 0, in submission order)
// of job j on a volume of size bytes, as `qemu-img bench` computes it: from
// offset 0 (no -o), each request the previous one's plus the stride,
// modulo the image size (qemu 7.2's bench_cb; QEMU 10.1 wraps modulo size
// minus the block size instead). The Go NVMe/TCP host takes its offsets
// from here too.
func qemuBenchOffset(j Job, size uint64, k int64) int64 {
	// (k*stride) mod size, without overflowing k*stride.
	s := int64(size)
	return int64((uint64(k%s) * uint64(qemuBenchStride(j)%s)) % uint64(s))
}

var qemuBenchTime = regexp.MustCompile(`Run completed in ([0-9.]+) seconds`)

// qemuBenchArgs are the arguments of `qemu-img bench` running count
// requests of job j on uri.
func qemuBenchArgs(uri string, j Job, count int) []string {
	args := []string{"bench", "-f", "raw", "-t", "none", "-c", strconv.Itoa(count), "-d", strconv.Itoa(j.IODepth),
		"-s", strconv.Itoa(j.BlockSize), "-S", strconv.FormatInt(qemuBenchStride(j), 10)}
	if j.RW == "write" || j.RW == "randwrite" {
		args = append(args, "-w")
	}
	return append(args, uri)
}

// qemuBench runs `qemu-img bench` for count requests and returns its time.
func qemuBench(ctx context.Context, uri string, j Job, count int) (time.Duration, error) {
	args := qemuBenchArgs(uri, j, count)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("qemu-img %v: %w: %s", args, err, lastLines(string(out), 5))
	}
	m := qemuBenchTime.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("qemu-img bench: no run time in %q", lastLines(string(out), 5))
	}
	s, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil || s <= 0 {
		return 0, fmt.Errorf("qemu-img bench: run time %q", m[1])
	}
	return time.Duration(s * float64(time.Second)), nil
}

// runQemuBench: with runtime 0, one pass over the working set; else a
// calibration run (the ramp) sizes a run of about runtime. Mean latency is
// the queue depth over IOPS (Little's law): qemu-img bench reports no
// latency, so p99 stays empty.
func (r *runner) runQemuBench(ctx context.Context, uri string, j Job, runtime time.Duration, rampDone func()) (Stats, error) {
	count := int(r.cfg.Size / uint64(j.BlockSize))
	if runtime > 0 {
		probe := 200 * j.IODepth
		d, err := qemuBench(ctx, uri, j, probe)
		if err != nil {
			return Stats{}, err
		}
		count = max(probe, int(float64(probe)*runtime.Seconds()/d.Seconds()))
		rampDone()
	}
	d, err := qemuBench(ctx, uri, j, count)
	if err != nil {
		return Stats{}, err
	}
	iops := float64(count) / d.Seconds()
	return Stats{IOPS: iops, BWBytes: iops * float64(j.BlockSize), MeanNs: float64(j.IODepth) / iops * 1e9,
		TotalIOs: uint64(count)}, nil
}
