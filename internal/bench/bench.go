package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Config says what to run.
type Config struct {
	Dir    string // bench-owned working directory (files, playground); default bench/work
	Out    string // markdown file; default bench/results/latest.md; "-" for none
	Binary string // basalt binary the playground runs; default this executable
	// Baseline, if set, is another basalt binary (an earlier build) that every basalt
	// target is also run with, in the same sitting, as target+BaselineSuffix; the
	// report then compares the two builds row by row.
	Baseline string
	Size     uint64        // working set; default 1 GiB
	Runtime  time.Duration // per job, after the ramp; default 20 s
	Ramp     time.Duration // default 5 s
	Targets  []string      // default AllTargets
	Jobs     []Job         // default AllJobs
	Copysets uint32        // copysets per basalt pool; 0 = the MDS default
	Keep     bool          // keep data files and the playground directory
	Stdout   io.Writer     // where the table goes; default os.Stdout
	Logger   *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Dir == "" {
		c.Dir = filepath.Join("bench", "work")
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return err
	}
	c.Dir = abs
	if c.Out == "" {
		c.Out = filepath.Join("bench", "results", "latest.md")
	}
	if c.Binary == "" {
		if c.Binary, err = os.Executable(); err != nil {
			return err
		}
	}
	if c.Size == 0 {
		c.Size = 1 << 30
	}
	if c.Size < 1<<20 || c.Size%(1<<20) != 0 {
		return fmt.Errorf("bench: working set %d must be a whole number of MiB, at least 1 MiB", c.Size)
	}
	if c.Runtime == 0 {
		c.Runtime = 20 * time.Second
	}
	if c.Runtime < time.Second {
		return fmt.Errorf("bench: runtime %s is under a second", c.Runtime)
	}
	if c.Ramp < 0 {
		return fmt.Errorf("bench: negative ramp %s", c.Ramp)
	}
	if len(c.Targets) == 0 {
		c.Targets = AllTargets
	}
	if len(c.Jobs) == 0 {
		c.Jobs = AllJobs
	}
	if c.Baseline != "" {
		if _, err := os.Stat(c.Baseline); err != nil {
			return fmt.Errorf("bench: baseline binary: %w", err)
		}
		var withBase []string
		for _, t := range c.Targets {
			if isBasaltTarget(t) {
				withBase = append(withBase, t+BaselineSuffix)
			}
			withBase = append(withBase, t)
		}
		c.Targets = withBase
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// runner holds one run's state. Everything runs on the caller's goroutine, one
// fio process at a time.
type runner struct {
	cfg Config
	log *slog.Logger
	rep *Report

	// pg is the playground of the basalt targets now running, started by the first
	// of them and stopped when a target needs another binary, or at the end.
	pg       *playgroundProc
	pgBinary string           // the binary pg runs
	pgKey    string           // its binary and flags (playgroundKey)
	pgErr    map[string]error // a playground (by key) that failed to start
	// r1Local: the chunkserver NBD socket basalt-r1 is served on (the local fast
	// path); "" when it goes through the playground's front end.
	r1Local string
}

// Run runs the matrix, prints the markdown table to cfg.Stdout, writes it to
// cfg.Out, and returns the report. A target or job that fails becomes a row or a
// note saying so, and Run goes on with the rest; it then returns the report and
// an error naming the failures.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, fmt.Errorf("bench: fio not found (run ./scripts/install-deps): %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Logger.With("component", "bench"), pgErr: map[string]error{}}
	r.rep = &Report{
		Machine: DescribeMachine(ctx, cfg.Dir),
		Size:    cfg.Size,
		Runtime: cfg.Runtime,
		Ramp:    cfg.Ramp,
	}
	if cfg.Baseline != "" {
		r.rep.Machine.Baseline = revisionOf(cfg.Baseline)
	}
	var failures []string
	defer r.closePlayground()
	for _, name := range cfg.Targets {
		if ctx.Err() != nil {
			failures = append(failures, "interrupted")
			break
		}
		if err := r.runTarget(ctx, name); err != nil {
			r.log.Error("target failed", "target", name, "err", err)
			failures = append(failures, fmt.Sprintf("%s: %v", name, err))
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("`%s` was not measured: %s", name, oneLine(err.Error())))
		}
	}
	r.closePlayground()
	for _, t := range cfg.Targets {
		if t == TargetBasaltR1 && r.r1Local != "" {
			r.rep.Notes = append(r.rep.Notes, "`basalt-r1` is a 1-replica volume (pool `local`, one copyset, so the whole volume "+
				"is on one chunkserver) served by the NBD front end inside that chunkserver ("+r.r1Local+"): the local fast path "+
				"(docs/design.md §7, §9), no socket between the front end and the copyset; its writes still go through raft and the WAL's fdatasync.")
		} else if t == TargetBasaltR1 {
			r.rep.Notes = append(r.rep.Notes, "`basalt-r1` is a 1-replica volume (pool `local`) served by the same playground NBD front end over "+
				"its Unix socket as `basalt-r3`: the playground's chunkservers serve no NBD in process, so every IO "+
				"still crosses a socket from the front end to the chunkserver.")
		}
	}
	if slices.ContainsFunc(cfg.Targets, isFrontendTarget) {
		r.rep.Notes = append(r.rep.Notes, "Front ends side by side, all on `basalt-r3`'s playground and volume: `"+TargetBasaltR3NVMf+
			"` is NVMe/TCP from the bench's own Go host (internal/nvmfhost: one I/O queue, the job's depth of commands in flight, "+
			"its latencies measured per IO); `"+TargetBasaltR3ISCSI+"` (libiscsi) and `"+TargetBasaltR3QemuNBD+
			"` (QEMU's NBD client on the same Unix socket as `basalt-r3`) are driven by `qemu-img bench`, which reports only its "+
			"run time: their mean latency is depth / IOPS (Little's law) and their p99 is empty. All three use `qemu-img bench`'s "+
			"offsets, which are not random: from 0, the rand jobs step 1 MiB + one block per request, wrapping at the volume's end "+
			"(so 32 requests in flight fall on one or two chunks); `basalt-r3` (fio) is the true-random reference. "+
			"The clients' own CPU is not in the CPU column.")
	}
	r.rep.Notes = append(r.rep.Notes,
		"The CPU column leaves out fio itself (the NBD client) and counts the MDS and etcd, which idle during IO.",
		"fio's JSON output of every job is kept in "+cfg.Dir+"/fio-TARGET-JOB.json until the next run.",
		"Reproduce: `bench/run "+strings.Join(r.reproduceArgs(), " ")+"`.")
	for _, row := range r.rep.Rows {
		if row.Err != "" {
			failures = append(failures, fmt.Sprintf("%s %s: %s", row.Target, row.Job.Name, row.Err))
		}
	}

	r.rep.Machine.LoadEnd = LoadAvg()
	md := r.rep.Markdown()
	fmt.Fprint(cfg.Stdout, md)
	switch {
	case ctx.Err() != nil:
		r.log.Warn("interrupted: the partial table is not written", "file", cfg.Out)
	case cfg.Out != "-":
		if err := os.MkdirAll(filepath.Dir(cfg.Out), 0o755); err != nil {
			return r.rep, err
		}
		if err := os.WriteFile(cfg.Out, []byte(md), 0o644); err != nil {
			return r.rep, err
		}
		r.log.Info("table written", "file", cfg.Out)
	}
	if len(failures) > 0 {
		return r.rep, fmt.Errorf("bench: %d failure(s): %s", len(failures), strings.Join(failures, "; "))
	}
	return r.rep, nil
}

func (r *runner) reproduceArgs() []string {
	a := []string{"--runtime", r.cfg.Runtime.String(), "--ramp", r.cfg.Ramp.String(), "--size", sizeFlag(r.cfg.Size)}
	var targets []string
	for _, t := range r.cfg.Targets {
		if !strings.HasSuffix(t, BaselineSuffix) {
			targets = append(targets, t)
		}
	}
	if len(targets) != len(AllTargets) {
		a = append(a, "--targets", strings.Join(targets, ","))
	}
	if r.cfg.Baseline != "" {
		a = append(a, "--baseline", r.cfg.Baseline)
	}
	if len(r.cfg.Jobs) != len(AllJobs) {
		var n []string
		for _, j := range r.cfg.Jobs {
			n = append(n, j.Name)
		}
		a = append(a, "--jobs", strings.Join(n, ","))
	}
	return a
}

func sizeFlag(n uint64) string {
	if n%(1<<30) == 0 {
		return fmt.Sprintf("%dGiB", n>>30)
	}
	return fmt.Sprintf("%dMiB", n>>20)
}

// runTarget opens one target, writes its working set, and runs every job on it.
func (r *runner) runTarget(ctx context.Context, name string) error {
	var (
		t   *target
		err error
	)
	switch name {
	case TargetRaw:
		t, err = r.openRaw(ctx)
	case TargetNBDKit:
		t, err = r.openNBDKit(ctx)
	case TargetBasaltR3, TargetBasaltR3 + BaselineSuffix, TargetBasaltR3Insecure, TargetBasaltR3TCP, TargetBasaltR3Encrypted:
		t, err = r.openBasaltR3(ctx, name)
	case TargetBasaltR1, TargetBasaltR1 + BaselineSuffix:
		t, err = r.openBasaltR1(ctx, name)
	case TargetBasaltR3NVMf:
		t, err = r.openBasaltR3NVMf(ctx, name)
	case TargetBasaltR3ISCSI, TargetBasaltR3QemuNBD:
		t, err = r.openQemuBench(ctx, name, name == TargetBasaltR3ISCSI)
	default:
		err = fmt.Errorf("unknown target %q", name)
	}
	if err != nil {
		return err
	}
	defer t.close()

	start := time.Now()
	r.log.Info("writing the working set", "target", name, "size", sizeString(r.cfg.Size))
	pf, err := r.fio(ctx, t, prefillJob, 0, 0, procSet{})
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	r.log.Info("working set written", "target", name, "MiB/s", fmt.Sprintf("%.0f", pf.Stats.BWBytes/(1<<20)),
		"took", time.Since(start).Round(time.Millisecond))

	for _, j := range r.cfg.Jobs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if t.supports != nil && !t.supports(j) {
			r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("`%s` does not run %s (qemu-img bench neither mixes reads and writes nor syncs).", name, j.Name))
			continue
		}
		r.rep.Rows = append(r.rep.Rows, r.runJob(ctx, t, name, j))
		if name == TargetRaw && j.Name == JobRandWriteQD1.Name {
			r.rep.Rows = append(r.rep.Rows, r.runJob(ctx, t, TargetRawSync, jobDurable))
		}
	}
	return nil
}

// runJob runs one timed job and turns it into a row.
func (r *runner) runJob(ctx context.Context, t *target, label string, j Job) Row {
	row := Row{Target: label, Job: j, Basalt: len(t.procs.pids) > 0}
	r.log.Info("fio job", "target", label, "job", j.Name, "runtime", r.cfg.Runtime, "ramp", r.cfg.Ramp)
	res, err := r.fio(ctx, t, j, r.cfg.Runtime, r.cfg.Ramp, t.procs)
	if err != nil {
		row.Err = oneLine(err.Error())
		r.log.Error("fio job failed", "target", label, "job", j.Name, "err", err)
		return row
	}
	row.Stats, row.CPU, row.PeakRSS = res.Stats, res.CPU, res.PeakRSS
	r.log.Info("fio job done", "target", label, "job", j.Name, "iops", fmt.Sprintf("%.0f", res.Stats.IOPS),
		"mean_us", fmt.Sprintf("%.1f", res.Stats.MeanNs/1e3), "p99_us", fmt.Sprintf("%.1f", res.Stats.P99Ns/1e3))
	return row
}

// fioResult is one fio run with the resource use of the target's processes.
type fioResult struct {
	Stats   Stats
	CPU     time.Duration
	PeakRSS uint64
}

// fio runs one fio process for job j on t. With processes to watch, their CPU is
// sampled when the ramp ends and when fio exits, and their peak RSS at the end.
func (r *runner) fio(ctx context.Context, t *target, j Job, runtime, ramp time.Duration, procs procSet) (fioResult, error) {
	if t.driver != nil {
		return t.driver(ctx, j, runtime, ramp, procs)
	}
	out := filepath.Join(r.cfg.Dir, fmt.Sprintf("fio-%s-%s.json", t.name, j.Name))
	if j.FDataSync {
		out = filepath.Join(r.cfg.Dir, fmt.Sprintf("fio-%s-%s-fdatasync.json", t.name, j.Name))
	}
	_ = os.Remove(out)
	args := append(j.fioArgs(r.cfg.Size, runtime, ramp), t.engine...)
	args = append(args, "--output="+out)

	// A job that overruns its time by far is hung; the prefill gets a minute per GiB.
	limit := ramp + runtime + 2*time.Minute
	if runtime == 0 {
		limit = 2*time.Minute + time.Duration(r.cfg.Size>>30+1)*time.Minute
	}
	fctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(fctx, "fio", args...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	r.log.Debug("fio", "args", strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		return fioResult{}, fmt.Errorf("start fio: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var (
		before, after []ProcSample
		sampleErr     error
		waitErr       error
		finished      bool
	)
	if len(procs.pids) > 0 {
		select {
		case <-time.After(ramp):
			before, sampleErr = procs.sample()
		case waitErr = <-done:
			finished = true
		}
	}
	if !finished {
		waitErr = <-done
	}
	if len(procs.pids) > 0 && sampleErr == nil && before != nil {
		after, sampleErr = procs.sample()
	}
	if waitErr != nil {
		if fctx.Err() == context.DeadlineExceeded {
			return fioResult{}, fmt.Errorf("fio did not finish within %s (hung target?)", limit)
		}
		if ctx.Err() != nil {
			return fioResult{}, ctx.Err()
		}
		return fioResult{}, fmt.Errorf("fio: %w: %s", waitErr, lastLines(stderr.String(), 5))
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return fioResult{}, err
	}
	st, _, err := ParseFio(data, j.FDataSync)
	if err != nil {
		return fioResult{}, fmt.Errorf("%w: %s", err, lastLines(stderr.String(), 5))
	}
	res := fioResult{Stats: st}
	if len(procs.pids) > 0 {
		if sampleErr != nil {
			// A basalt process died during the job: the figures stand, the
			// resource columns cannot be trusted.
			return fioResult{}, fmt.Errorf("sampling basalt processes: %w", sampleErr)
		}
		if after != nil {
			res.CPU, res.PeakRSS = usage(before, after)
		}
	}
	return res, nil
}

// remove deletes a bench file or directory unless --keep.
func (r *runner) remove(path string) {
	if r.cfg.Keep {
		return
	}
	if err := os.RemoveAll(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Warn("cleanup", "path", path, "err", err)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
