package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/client"
)

// WorkloadOptions shape a Workload.
type WorkloadOptions struct {
	Writers     int     // concurrent synchronous IO streams (the queue depth); default 8
	ChunkSize   int64   // the pool's chunk size; required when Chunks is set
	Chunks      []int64 // chunk indexes the workload may touch; default the whole volume
	ReadPercent int     // share of IOs that read back and check a range; default 20
	MaxBlocks   int     // a write covers 1..MaxBlocks 4 KiB blocks; default 8
	Seed        int64
	// Prefill writes the whole volume once (1 MiB writes, 4 at a time) before
	// the writers start, so that every chunk holds data.
	Prefill bool
}

// Workload is a verified IO workload through the client library. Each writer owns
// a disjoint set of stripes, so the model of what the volume must hold is exact:
// every acknowledged write is applied to it. Writers also read back ranges of
// their own regions and check them against the model while the fault is on
// (reads must see every acknowledged write). A write that fails leaves its blocks
// unknown until the writer rewrites them at Stop.
//
// Every IO's start and end are recorded (relative to the workload's start), and
// Mark names moments (the fault, the heal) that split the run into phases for
// Figures.
type Workload struct {
	t    testing.TB
	v    atomic.Pointer[client.Volume]
	opts WorkloadOptions
	t0   time.Time
	stop chan struct{}
	wg   sync.WaitGroup

	acked, failed, reads atomic.Int64
	timeouts             atomic.Int64   // failed IOs that ran into the client's deadline
	inflight             []atomic.Int64 // per writer: start of its IO in flight (ns since t0 + 1), 0 if none

	mu      sync.Mutex // guards the fields below
	data    []byte     // the model: every acknowledged write
	recs    []ioRecord
	marks   map[string]time.Duration
	lastErr error
	errs    map[string]int // failed IOs by error
}

type ioRecord struct {
	start, end time.Duration
	ok         bool
}

type region struct{ lo, hi int64 }

// StartWorkload starts opts.Writers writers on v. Stop ends them.
func StartWorkload(t testing.TB, v *client.Volume, opts WorkloadOptions) *Workload {
	t.Helper()
	if opts.Writers == 0 {
		opts.Writers = 8
	}
	if opts.ReadPercent == 0 {
		opts.ReadPercent = 20
	}
	if opts.MaxBlocks == 0 {
		opts.MaxBlocks = 8
	}
	w := &Workload{t: t, opts: opts, t0: time.Now(), stop: make(chan struct{}),
		data: make([]byte, v.Size()), marks: map[string]time.Duration{}, errs: map[string]int{}}
	w.v.Store(v)
	if opts.Prefill {
		w.prefill()
	}
	// The volume (or the chunks in Chunks) is cut into stripes; writer i owns
	// stripes i, i+Writers, ... So every writer touches every chunk, as a
	// database's IO does: when one copyset stalls, soon every writer waits on it,
	// and the longest stretch without a completed IO shows the stall.
	var spans []region
	if len(opts.Chunks) == 0 {
		spans = []region{{0, v.Size()}}
	} else {
		if opts.ChunkSize == 0 {
			t.Fatal("WorkloadOptions.Chunks needs ChunkSize")
		}
		for _, c := range opts.Chunks {
			spans = append(spans, region{c * opts.ChunkSize, (c + 1) * opts.ChunkSize})
		}
	}
	stripe := max(int64(128<<10), int64(opts.MaxBlocks)*4096)
	own := make([][]region, opts.Writers)
	j := 0
	for _, sp := range spans {
		for off := sp.lo; off+stripe <= sp.hi; off += stripe {
			own[j%opts.Writers] = append(own[j%opts.Writers], region{off, off + stripe})
			j++
		}
	}
	w.inflight = make([]atomic.Int64, opts.Writers)
	for i := range own {
		if len(own[i]) == 0 {
			continue
		}
		w.wg.Add(1)
		go w.writer(opts.Seed*1000+int64(i)+1, own[i], &w.inflight[i])
	}
	return w
}

func (w *Workload) prefill() {
	w.t.Helper()
	const step = 1 << 20
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := int64(0); g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(w.opts.Seed + 77 + g))
			v := w.v.Load()
			for off := g * step; off < v.Size(); off += 4 * step {
				buf := make([]byte, min(step, v.Size()-off))
				rng.Read(buf)
				if _, err := v.WriteAt(buf, off); err != nil {
					errs <- fmt.Errorf("prefill at %d: %w", off, err)
					return
				}
				w.apply(off, buf)
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		w.t.Fatal(err)
	}
	w.t.Logf("workload: prefilled %d MiB in %s", w.v.Load().Size()>>20, time.Since(start).Round(time.Millisecond))
	w.t0 = time.Now()
}

func (w *Workload) since() time.Duration { return time.Since(w.t0) }

// Mark records that the named moment is now ("fault", "healed").
func (w *Workload) Mark(name string) {
	w.mu.Lock()
	w.marks[name] = w.since()
	w.mu.Unlock()
}

// Acked is the number of acknowledged IOs so far.
func (w *Workload) Acked() int64 { return w.acked.Load() }

// AwaitProgress waits until 100 more IOs than now are acknowledged: the
// workload is flowing (after a start, a restart, a rotation).
func (w *Workload) AwaitProgress(c *Cluster, what string) {
	w.t.Helper()
	n := w.Acked() + 100
	c.Eventually(120*time.Second, what, func(context.Context) error {
		if w.Acked() < n {
			return fmt.Errorf("%d IOs acknowledged, waiting for %d", w.Acked(), n)
		}
		return nil
	})
}

// Timeouts is the number of IOs that failed because the client's deadline
// passed (an IO that hung), rather than with an answer.
func (w *Workload) Timeouts() int64 { return w.timeouts.Load() }

// LastErr is the error of the last IO that failed (nil if none did).
func (w *Workload) LastErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// Errors returns how many IOs failed, by error text.
func (w *Workload) Errors() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.errs)
}

// Reopen makes the writers use v from now on: an application that reopens its
// volume after its session lapsed. Blocks whose writes failed are rewritten
// through v at Stop.
func (w *Workload) Reopen(v *client.Volume) {
	w.v.Store(v)
	w.t.Logf("workload: volume reopened (epoch %d)", v.Epoch())
}

func (w *Workload) record(start time.Duration, err error) {
	end := w.since()
	w.mu.Lock()
	w.recs = append(w.recs, ioRecord{start: start, end: end, ok: err == nil})
	if err != nil {
		w.lastErr = err
		w.errs[err.Error()]++
	}
	w.mu.Unlock()
	if err == nil {
		w.acked.Add(1)
	} else {
		w.failed.Add(1)
		if errors.Is(err, client.ErrTimeout) {
			w.timeouts.Add(1)
		}
	}
}

// OldestInFlight is how long the oldest IO still in flight has waited (0 if
// none is).
func (w *Workload) OldestInFlight() time.Duration {
	var oldest time.Duration
	now := w.since()
	for i := range w.inflight {
		if s := w.inflight[i].Load(); s != 0 {
			oldest = max(oldest, now-time.Duration(s-1))
		}
	}
	return oldest
}

func (w *Workload) writer(seed int64, own []region, inflight *atomic.Int64) {
	defer w.wg.Done()
	rng := rand.New(rand.NewSource(seed))
	pending := map[int64]bool{} // blocks whose last write failed
	for {
		select {
		case <-w.stop:
			w.rewrite(rng, pending)
			return
		default:
		}
		r := own[rng.Intn(len(own))]
		n := int64(4096 * (1 + rng.Intn(w.opts.MaxBlocks)))
		n = min(n, r.hi-r.lo)
		off := r.lo + rng.Int63n((r.hi-r.lo-n)/4096+1)*4096
		if rng.Intn(100) < w.opts.ReadPercent {
			inflight.Store(int64(w.since()) + 1)
			w.readCheck(off, n, pending)
			inflight.Store(0)
			continue
		}
		buf := make([]byte, n)
		rng.Read(buf)
		start := w.since()
		inflight.Store(int64(start) + 1)
		_, err := w.v.Load().WriteAt(buf, off)
		inflight.Store(0)
		w.record(start, err)
		if err != nil {
			for b := off; b < off+n; b += 4096 {
				pending[b] = true
			}
			backOff(err)
			continue
		}
		w.apply(off, buf)
		for b := off; b < off+n; b += 4096 {
			delete(pending, b)
		}
	}
}

func (w *Workload) apply(off int64, p []byte) {
	w.mu.Lock()
	copy(w.data[off:], p)
	w.mu.Unlock()
}

// readCheck reads [off, off+n) and compares the blocks whose content is known.
func (w *Workload) readCheck(off, n int64, pending map[int64]bool) {
	buf := make([]byte, n)
	start := w.since()
	_, err := w.v.Load().ReadAt(buf, off)
	w.record(start, err)
	if err != nil {
		backOff(err)
		return
	}
	w.reads.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	for b := off; b < off+n; b += 4096 {
		if pending[b] {
			continue
		}
		if !bytes.Equal(buf[b-off:b-off+4096], w.data[b:b+4096]) {
			w.t.Errorf("read at %s: block %d does not hold its last acknowledged write", w.since(), b)
			return
		}
	}
}

// backOff pauses a writer after a failed IO, as an application would, so that a
// volume that fails every IO at once is not hammered.
func backOff(err error) {
	if errors.Is(err, client.ErrLeaseExpired) || errors.Is(err, client.ErrClosed) {
		time.Sleep(100 * time.Millisecond)
		return
	}
	time.Sleep(10 * time.Millisecond)
}

// rewrite writes the blocks whose state is unknown, so the model is exact again.
func (w *Workload) rewrite(rng *rand.Rand, pending map[int64]bool) {
	for b := range pending {
		buf := make([]byte, 4096)
		rng.Read(buf)
		var err error
		for try := 0; try < 20; try++ { // the cluster may still be settling
			if _, err = w.v.Load().WriteAt(buf, b); err == nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if err != nil {
			w.t.Errorf("rewrite of block %d after the fault: %v", b, err)
			return
		}
		w.apply(b, buf)
	}
}

// Stop ends the writers (they first rewrite the blocks whose writes failed).
func (w *Workload) Stop() {
	select {
	case <-w.stop:
		return
	default:
	}
	w.Mark("stop")
	close(w.stop)
	w.wg.Wait()
	w.t.Logf("workload: %d IOs acknowledged (%d reads checked), %d failed %v",
		w.acked.Load(), w.reads.Load(), w.failed.Load(), w.Errors())
}

// Verify reads the whole volume through v and compares it with the model.
func (w *Workload) Verify(v *client.Volume) {
	w.t.Helper()
	got := make([]byte, len(w.data))
	const step = 4 << 20
	for off := 0; off < len(got); off += step {
		end := min(off+step, len(got))
		if _, err := v.ReadAt(got[off:end], int64(off)); err != nil {
			w.t.Fatalf("verify: read at %d: %v", off, err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := firstDiff(got, w.data); i >= 0 {
		w.t.Fatalf("verify: the volume differs from the acknowledged writes at offset %d (4 KiB block %d)", i, i/4096)
	}
	w.t.Logf("verify: all %d MiB match the acknowledged writes", len(got)>>20)
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// Figures are what one fault case measured.
type Figures struct {
	Case   string `json:"case"`
	IOs    int64  `json:"ios"`
	Failed int64  `json:"failed"`
	// BaselineGap is the longest stretch without a completed IO before the fault;
	// MaxGap the longest from the fault on, starting GapStart after the fault.
	BaselineGap time.Duration `json:"baseline_gap"`
	MaxGap      time.Duration `json:"max_gap"`
	GapStart    time.Duration `json:"gap_start"`
	// p99 latency of the IOs that completed in each phase: before the fault,
	// from the fault until the test marked the cluster healed, and after.
	P99Before time.Duration `json:"p99_before"`
	P99During time.Duration `json:"p99_during"`
	P99After  time.Duration `json:"p99_after"`
	// MaxLatency is the slowest IO that completed from the fault on, and
	// MaxFailLatency the slowest that failed.
	MaxLatency     time.Duration `json:"max_latency"`
	MaxFailLatency time.Duration `json:"max_fail_latency,omitempty"`
	// IOPS in the same phases.
	IOPSBefore float64       `json:"iops_before"`
	IOPSDuring float64       `json:"iops_during"`
	IOPSAfter  float64       `json:"iops_after"`
	Healed     time.Duration `json:"healed"` // from the fault to the "healed" mark
	Note       string        `json:"note,omitempty"`
}

// Figures computes the figures of the run (call after Stop). The phases are split
// at the marks "fault" and "healed" (the end of the run when missing).
func (w *Workload) Figures(name string) Figures {
	w.mu.Lock()
	recs := slices.Clone(w.recs)
	fault, okF := w.marks["fault"]
	healed, okH := w.marks["healed"]
	end, okS := w.marks["stop"]
	w.mu.Unlock()
	if !okS { // still running
		end = w.since()
	}
	if !okF {
		fault = end
	}
	if !okH {
		healed = end
	}
	f := Figures{Case: name, IOs: w.acked.Load(), Failed: w.failed.Load(), Healed: healed - fault}
	slices.SortFunc(recs, func(a, b ioRecord) int { return int(a.end - b.end) })
	var before, during, after []time.Duration
	prev := time.Duration(-1)
	for _, r := range recs {
		if !r.ok && r.end >= fault {
			f.MaxFailLatency = max(f.MaxFailLatency, r.end-r.start)
		}
		if !r.ok || r.end > end {
			continue
		}
		lat := r.end - r.start
		if r.end >= fault {
			f.MaxLatency = max(f.MaxLatency, lat)
		}
		switch {
		case r.end < fault:
			before = append(before, lat)
		case r.end < healed:
			during = append(during, lat)
		default:
			after = append(after, lat)
		}
		if prev >= 0 {
			gap := r.end - prev
			if r.end < fault {
				f.BaselineGap = max(f.BaselineGap, gap)
			} else if gap > f.MaxGap {
				f.MaxGap, f.GapStart = gap, prev-fault
			}
		}
		prev = r.end
	}
	if prev >= 0 && end-prev > f.MaxGap && end > fault { // nothing completed until the end
		f.MaxGap, f.GapStart = end-prev, prev-fault
	}
	f.P99Before, f.P99During, f.P99After = p99(before), p99(during), p99(after)
	f.IOPSBefore = rate(len(before), fault)
	f.IOPSDuring = rate(len(during), healed-fault)
	f.IOPSAfter = rate(len(after), end-healed)
	return f
}

func p99(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return lat[(len(lat)*99)/100]
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func (f Figures) String() string {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0fms", float64(d)/1e6) }
	s := fmt.Sprintf("FIGURES %s: longest stall %s (starting %s after the fault; before the fault %s); "+
		"slowest IO %s; p99 before/during/after %s/%s/%s; IOPS %.0f/%.0f/%.0f; healed after %s; %d IOs, %d failed",
		f.Case, ms(f.MaxGap), ms(f.GapStart), ms(f.BaselineGap), ms(f.MaxLatency), ms(f.P99Before), ms(f.P99During), ms(f.P99After),
		f.IOPSBefore, f.IOPSDuring, f.IOPSAfter, ms(f.Healed), f.IOs, f.Failed)
	if f.Failed > 0 {
		s += fmt.Sprintf(" (slowest failure %s)", ms(f.MaxFailLatency))
	}
	if f.Note != "" {
		s += "; " + f.Note
	}
	return s
}

// Report logs f and, when BASALT_FAULTS_REPORT names a file, appends it there
// as one JSON line (docs/reliability.md is written from those lines).
func (f Figures) Report(t testing.TB) {
	t.Helper()
	t.Log(f.String())
	path := os.Getenv("BASALT_FAULTS_REPORT")
	if path == "" {
		return
	}
	b, _ := json.Marshal(f)
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Logf("report: %v", err)
		return
	}
	defer fh.Close()
	fh.Write(append(b, '\n'))
}
