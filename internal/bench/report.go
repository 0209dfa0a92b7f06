package bench

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Row is one line of the table: one job on one target.
type Row struct {
	Target string
	Job    Job
	Stats  Stats
	// Basalt rows carry the resource use of the basalt processes.
	Basalt  bool
	CPU     time.Duration // CPU used by all basalt processes after the ramp
	PeakRSS uint64        // sum of their VmHWM at the end of the job
	Err     string        // the job failed; the figures are empty
}

// ProcPeak is one basalt process's peak RSS at the end of the run.
type ProcPeak struct {
	Name    string
	PID     int
	PeakRSS uint64
	Binary  string // the basalt binary it ran
}

// Report is everything the markdown shows.
type Report struct {
	Machine Machine
	Size    uint64
	Runtime time.Duration
	Ramp    time.Duration
	Rows    []Row
	Procs   []ProcPeak
	Notes   []string // free-form lines under the table (failures, caveats)
}

// targetOrder is the row order within one job.
// A baseline build's row sits right above the same target's current row.
var targetOrder = []string{TargetRaw, TargetRawSync, TargetNBDKit, TargetBasaltR3Insecure, TargetBasaltR3 + BaselineSuffix, TargetBasaltR3,
	TargetBasaltR3NVMf, TargetBasaltR3QemuNBD, TargetBasaltR3ISCSI,
	TargetBasaltR3TCP, TargetBasaltR3Encrypted, TargetBasaltR1 + BaselineSuffix, TargetBasaltR1}

func jobIndex(name string) int {
	for i, j := range AllJobs {
		if j.Name == name {
			return i
		}
	}
	return len(AllJobs)
}

// sortedRows orders the rows by job (matrix order), then target, so the targets
// of one job sit side by side.
func (r *Report) sortedRows() []Row {
	rows := slices.Clone(r.Rows)
	slices.SortStableFunc(rows, func(a, b Row) int {
		if d := jobIndex(a.Job.Name) - jobIndex(b.Job.Name); d != 0 {
			return d
		}
		return slices.Index(targetOrder, a.Target) - slices.Index(targetOrder, b.Target)
	})
	return rows
}

// find returns the successful row of target and job, if any.
func (r *Report) find(target, job string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Target == target && row.Job.Name == job && row.Err == "" {
			return row, true
		}
	}
	return Row{}, false
}

// Markdown renders the report: header, table, goals, notes.
func (r *Report) Markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "# basalt fio benchmark, %s\n\n", m.Date.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "- machine: %s, %d CPUs (nproc), %s memory, kernel %s\n", orDash(m.Host), m.NProc, mib(m.MemBytes, "GiB"), orDash(m.Kernel))
	fmt.Fprintf(&b, "- disk: %s; device %s\n", orDash(m.Disk), orDash(m.Device))
	if m.LoadStart != "" || m.LoadEnd != "" {
		fmt.Fprintf(&b, "- load average (1 min) at start %s, at end %s\n", orDash(m.LoadStart), orDash(m.LoadEnd))
	}
	fmt.Fprintf(&b, "- tools: %s, %s; basalt %s\n", orDash(m.Fio), orDash(m.NBDKit), orDash(m.Basalt))
	if m.Baseline != "" {
		fmt.Fprintf(&b, "- baseline: rows `…%s` ran basalt %s, in the same sitting\n", BaselineSuffix, m.Baseline)
	}
	fmt.Fprintf(&b, "- each job: one fio process, numjobs=1, %s working set (written sequentially first), %s after a %s ramp\n\n",
		sizeString(r.Size), r.Runtime, r.Ramp)

	b.WriteString("| target | job | IOPS | MiB/s | mean lat µs | p99 lat µs | IOPS vs raw | IOPS vs nbdkit | QD1 lat vs raw | QD1 lat vs nbdkit | basalt CPU s / 10k IO | basalt peak RSS MiB |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, row := range r.sortedRows() {
		if row.Err != "" {
			fmt.Fprintf(&b, "| %s | %s | failed | | | | | | | | | |\n", row.Target, row.Job.Name)
			continue
		}
		s := row.Stats
		p99 := usec(s.P99Ns)
		if s.P99Approx {
			p99 += "*"
		}
		cols := []string{row.Target, row.Job.Name, thousands(s.IOPS), fmt.Sprintf("%.1f", s.BWBytes/(1<<20)),
			usec(s.MeanNs), p99}
		if row.Basalt {
			cols = append(cols, r.iopsRatio(row, TargetRaw), r.iopsRatio(row, TargetNBDKit),
				r.latRatio(row, TargetRaw), r.latRatio(row, TargetNBDKit))
			cpu := ""
			if s.TotalIOs > 0 && row.CPU > 0 {
				cpu = fmt.Sprintf("%.2f", row.CPU.Seconds()*1e4/float64(s.TotalIOs))
			}
			cols = append(cols, cpu, fmt.Sprintf("%.0f", float64(row.PeakRSS)/(1<<20)))
		} else {
			cols = append(cols, "", "", "", "", "", "")
		}
		b.WriteString("| " + strings.Join(cols, " | ") + " |\n")
	}
	b.WriteString("\nLatency is fio's total latency (lat_ns, submission to completion). " +
		"Ratios: IOPS as basalt over raw or nbdkit, mean latency likewise (QD1 jobs only). " +
		"CPU: utime+stime of the playground process (MDS, etcd, NBD front end) and every chunkserver " +
		"from the end of the ramp to the end of the job, per 10,000 IOs; peak RSS: their summed VmHWM. " +
		"`raw-fdatasync` is libaio direct=1 with fdatasync=1: its mean is the time per durable write (1/IOPS at QD1). " +
		"`*`: p99 not one exact percentile (write p99 + sync p99 for the durable row; the larger of read and write otherwise).\n")

	if goals := r.goals(); len(goals) > 0 {
		b.WriteString("\n## Issue 4 targets (benchmarks, not pass/fail tests)\n\n")
		for _, g := range goals {
			b.WriteString("- " + g + "\n")
		}
	}
	if modes := r.securityModes(); len(modes) > 0 {
		b.WriteString("\n## Security modes: the cost per 4 KiB IO\n\n")
		b.WriteString("| job | target (mode) | IOPS | mean lat µs | basalt CPU µs / IO | CPU µs / IO over the one before | IOPS vs insecure |\n|---|---|--:|--:|--:|--:|--:|\n")
		for _, line := range modes {
			b.WriteString(line + "\n")
		}
		b.WriteString("\nThe modes of docs/security.md, each on a playground of its own: `" + TargetBasaltR3Insecure + "` no TLS and no " +
			"authentication (the pre-security path); `" + TargetBasaltR3 + "` authenticated (the default; same-host socket); `" +
			TargetBasaltR3TCP + "` authenticated over TCP; `" + TargetBasaltR3Encrypted + "` encrypted (TLS 1.3 for every " +
			"connection, over TCP). The cost of authentication per IO is `" + TargetBasaltR3 + "` over `" + TargetBasaltR3Insecure +
			"`; of encryption, `" + TargetBasaltR3Encrypted + "` over `" + TargetBasaltR3TCP + "` (the column's value on each row " +
			"is that row over the row above it). CPU counts every basalt process (front end, MDS, three chunkservers) " +
			"after the ramp.\n")
	}
	if cmp := r.againstBaseline(); len(cmp) > 0 {
		b.WriteString("\n## Against the baseline build (same sitting)\n\n")
		b.WriteString("| target | job | IOPS | MiB/s | mean lat | p99 lat | CPU / IO |\n|---|---|--:|--:|--:|--:|--:|\n")
		for _, line := range cmp {
			b.WriteString(line + "\n")
		}
		b.WriteString("\nEach figure is this build's over the baseline's: above 1 is more IOPS, MiB/s, latency or CPU per IO. " +
			"`!` marks a row where this build is worse by more than 10 % (fewer IOPS, more latency or CPU per IO).\n")
		if goals := r.baselineGoals(); len(goals) > 0 {
			b.WriteString("\n## Issue 13 targets against the baseline (benchmarks, not pass/fail tests)\n\n")
			for _, g := range goals {
				b.WriteString("- " + g + "\n")
			}
		}
	}
	if len(r.Procs) > 0 {
		b.WriteString("\n## basalt processes at the end (peak RSS)\n\n")
		for _, p := range r.Procs {
			bin := ""
			if p.Binary != "" {
				bin = ", " + p.Binary
			}
			fmt.Fprintf(&b, "- %s (pid %d%s): %s\n", p.Name, p.PID, bin, mib(p.PeakRSS, "MiB"))
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range r.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
	return b.String()
}

func (r *Report) iopsRatio(row Row, base string) string {
	br, ok := r.find(base, row.Job.Name)
	if !ok || br.Stats.IOPS == 0 {
		return "—"
	}
	return ratio(row.Stats.IOPS / br.Stats.IOPS)
}

func (r *Report) latRatio(row Row, base string) string {
	if !row.Job.QD1() {
		return ""
	}
	br, ok := r.find(base, row.Job.Name)
	if !ok || br.Stats.MeanNs == 0 {
		return "—"
	}
	return ratio(row.Stats.MeanNs / br.Stats.MeanNs)
}

// modeTargets are the security modes' targets, in the order their costs
// add up (securityModes).
var modeTargets = []string{TargetBasaltR3Insecure, TargetBasaltR3, TargetBasaltR3TCP, TargetBasaltR3Encrypted}

// securityModes renders one line per 4 KiB job and mode measured, when at
// least two modes were.
func (r *Report) securityModes() []string {
	var out []string
	for _, j := range AllJobs {
		if j.BlockSize != 4<<10 {
			continue
		}
		var rows []Row
		for _, t := range modeTargets {
			if row, ok := r.find(t, j.Name); ok {
				rows = append(rows, row)
			}
		}
		if len(rows) < 2 {
			continue
		}
		insecure, hasInsecure := r.find(TargetBasaltR3Insecure, j.Name)
		for i, row := range rows {
			cpu := cpuPerIO(row) * 1e6
			delta, vs := "", ""
			if i > 0 {
				if prev := cpuPerIO(rows[i-1]) * 1e6; cpu > 0 && prev > 0 {
					delta = fmt.Sprintf("%+.1f", cpu-prev)
				}
			}
			if hasInsecure && row.Target != TargetBasaltR3Insecure && insecure.Stats.IOPS > 0 {
				vs = ratio(row.Stats.IOPS / insecure.Stats.IOPS)
			}
			cpuS := ""
			if cpu > 0 {
				cpuS = fmt.Sprintf("%.1f", cpu)
			}
			out = append(out, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s |", j.Name, row.Target,
				thousands(row.Stats.IOPS), usec(row.Stats.MeanNs), cpuS, delta, vs))
		}
	}
	return out
}

// cpuPerIO is the basalt CPU seconds per IO of a row, or 0 when not measured.
func cpuPerIO(row Row) float64 {
	if row.Stats.TotalIOs == 0 || row.CPU <= 0 {
		return 0
	}
	return row.CPU.Seconds() / float64(row.Stats.TotalIOs)
}

// againstBaseline renders one table line per basalt row that has a baseline twin.
func (r *Report) againstBaseline() []string {
	var out []string
	for _, row := range r.sortedRows() {
		if !row.Basalt || row.Err != "" || strings.HasSuffix(row.Target, BaselineSuffix) {
			continue
		}
		base, ok := r.find(row.Target+BaselineSuffix, row.Job.Name)
		if !ok {
			continue
		}
		s, bs := row.Stats, base.Stats
		cell := func(v, b float64, higherIsWorse bool) string {
			if b == 0 || v == 0 {
				return "—"
			}
			q := v / b
			mark := ""
			if (higherIsWorse && q > 1.1) || (!higherIsWorse && q < 1/1.1) {
				mark = " !"
			}
			return ratio(q) + mark
		}
		cols := []string{row.Target, row.Job.Name, cell(s.IOPS, bs.IOPS, false), cell(s.BWBytes, bs.BWBytes, false),
			cell(s.MeanNs, bs.MeanNs, true), cell(s.P99Ns, bs.P99Ns, true), cell(cpuPerIO(row), cpuPerIO(base), true)}
		out = append(out, "| "+strings.Join(cols, " | ")+" |")
	}
	return out
}

// baselineGoals evaluates issue 13's large-write targets: against the baseline
// build, CPU per 256 KiB write at most half and MiB/s at least 1.5×; p99 under 5×
// the mean.
func (r *Report) baselineGoals() []string {
	row, ok := r.find(TargetBasaltR3, JobSeqWrite.Name)
	base, okb := r.find(TargetBasaltR3+BaselineSuffix, JobSeqWrite.Name)
	if !ok || !okb {
		return nil
	}
	check := func(text string, v, limit float64, atLeast bool, unit string) string {
		verdict := "met"
		if atLeast && v < limit {
			verdict = fmt.Sprintf("MISSED by %.0f %%", 100*(limit-v)/limit)
		} else if !atLeast && v > limit {
			verdict = fmt.Sprintf("MISSED by %.0f %%", 100*(v-limit)/limit)
		}
		return fmt.Sprintf("%s: measured %s%s — %s", text, trimFloat(v), unit, verdict)
	}
	var out []string
	if c, cb := cpuPerIO(row), cpuPerIO(base); c > 0 && cb > 0 {
		out = append(out, check("basalt-r3 write-256k-qd8 CPU per IO ≤ 0.5 × the baseline's", c/cb, 0.5, false, "×"))
	}
	if base.Stats.BWBytes > 0 {
		out = append(out, check("basalt-r3 write-256k-qd8 MiB/s ≥ 1.5 × the baseline's", row.Stats.BWBytes/base.Stats.BWBytes, 1.5, true, "×"))
	}
	if row.Stats.MeanNs > 0 {
		out = append(out, check("basalt-r3 write-256k-qd8 p99 < 5 × its own mean", row.Stats.P99Ns/row.Stats.MeanNs, 5, false, "×"))
	}
	return out
}

// goal is one target of issue 4: measured = f(rows), met when measured <= limit
// (or >= limit when atLeast).
type goal struct {
	text    string
	need    [][2]string // target, job pairs that must be present
	measure func(get func(target, job string) Stats) float64
	limit   float64
	atLeast bool
	unit    string
}

var goals = []goal{
	{text: "basalt-r3 randwrite-4k-qd1 mean ≤ 4 × raw-fdatasync mean",
		need: [][2]string{{TargetBasaltR3, JobRandWriteQD1.Name}, {TargetRawSync, JobRandWriteQD1.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return g(TargetBasaltR3, JobRandWriteQD1.Name).MeanNs / g(TargetRawSync, JobRandWriteQD1.Name).MeanNs
		}, limit: 4, unit: "×"},
	{text: "basalt-r3 randwrite-4k-qd1 p99 ≤ 3 × its own mean",
		need: [][2]string{{TargetBasaltR3, JobRandWriteQD1.Name}},
		measure: func(g func(string, string) Stats) float64 {
			s := g(TargetBasaltR3, JobRandWriteQD1.Name)
			return s.P99Ns / s.MeanNs
		}, limit: 3, unit: "×"},
	{text: "basalt-r3 randread-4k-qd1 mean ≤ 2 × nbdkit's",
		need: [][2]string{{TargetBasaltR3, JobRandReadQD1.Name}, {TargetNBDKit, JobRandReadQD1.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return g(TargetBasaltR3, JobRandReadQD1.Name).MeanNs / g(TargetNBDKit, JobRandReadQD1.Name).MeanNs
		}, limit: 2, unit: "×"},
	{text: "basalt-r3 randwrite-4k-qd32 IOPS ≥ 35 % of nbdkit's",
		need: [][2]string{{TargetBasaltR3, JobRandWriteQD32.Name}, {TargetNBDKit, JobRandWriteQD32.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return 100 * g(TargetBasaltR3, JobRandWriteQD32.Name).IOPS / g(TargetNBDKit, JobRandWriteQD32.Name).IOPS
		}, limit: 35, atLeast: true, unit: " %"},
	{text: "basalt-r3 randread-4k-qd32 IOPS ≥ 60 % of nbdkit's",
		need: [][2]string{{TargetBasaltR3, JobRandReadQD32.Name}, {TargetNBDKit, JobRandReadQD32.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return 100 * g(TargetBasaltR3, JobRandReadQD32.Name).IOPS / g(TargetNBDKit, JobRandReadQD32.Name).IOPS
		}, limit: 60, atLeast: true, unit: " %"},
	{text: "basalt-r3 write-256k-qd8 MiB/s ≥ 70 % of raw's / 6",
		need: [][2]string{{TargetBasaltR3, JobSeqWrite.Name}, {TargetRaw, JobSeqWrite.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return 100 * g(TargetBasaltR3, JobSeqWrite.Name).BWBytes / (g(TargetRaw, JobSeqWrite.Name).BWBytes / 6)
		}, limit: 70, atLeast: true, unit: " %"},
	{text: "basalt-r1 randread-4k-qd32 IOPS ≥ 90 % of nbdkit's",
		need: [][2]string{{TargetBasaltR1, JobRandReadQD32.Name}, {TargetNBDKit, JobRandReadQD32.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return 100 * g(TargetBasaltR1, JobRandReadQD32.Name).IOPS / g(TargetNBDKit, JobRandReadQD32.Name).IOPS
		}, limit: 90, atLeast: true, unit: " %"},
	{text: "basalt-r1 randwrite-4k-qd32 IOPS ≥ 90 % of nbdkit's",
		need: [][2]string{{TargetBasaltR1, JobRandWriteQD32.Name}, {TargetNBDKit, JobRandWriteQD32.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return 100 * g(TargetBasaltR1, JobRandWriteQD32.Name).IOPS / g(TargetNBDKit, JobRandWriteQD32.Name).IOPS
		}, limit: 90, atLeast: true, unit: " %"},
	{text: "basalt-r1 randread-4k-qd1 mean ≤ 1.15 × nbdkit's",
		need: [][2]string{{TargetBasaltR1, JobRandReadQD1.Name}, {TargetNBDKit, JobRandReadQD1.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return g(TargetBasaltR1, JobRandReadQD1.Name).MeanNs / g(TargetNBDKit, JobRandReadQD1.Name).MeanNs
		}, limit: 1.15, unit: "×"},
	{text: "basalt-r1 randwrite-4k-qd1 mean ≤ 1.15 × nbdkit's",
		need: [][2]string{{TargetBasaltR1, JobRandWriteQD1.Name}, {TargetNBDKit, JobRandWriteQD1.Name}},
		measure: func(g func(string, string) Stats) float64 {
			return g(TargetBasaltR1, JobRandWriteQD1.Name).MeanNs / g(TargetNBDKit, JobRandWriteQD1.Name).MeanNs
		}, limit: 1.15, unit: "×"},
}

// goals evaluates every issue-4 target whose rows are present.
func (r *Report) goals() []string {
	get := func(target, job string) Stats {
		row, _ := r.find(target, job)
		return row.Stats
	}
	var out []string
	for _, g := range goals {
		ok := true
		for _, n := range g.need {
			if _, found := r.find(n[0], n[1]); !found {
				ok = false
			}
		}
		if !ok {
			continue
		}
		v := g.measure(get)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		verdict := "met"
		if g.atLeast && v < g.limit {
			verdict = fmt.Sprintf("MISSED by %.0f %%", 100*(g.limit-v)/g.limit)
		} else if !g.atLeast && v > g.limit {
			verdict = fmt.Sprintf("MISSED by %.0f %%", 100*(v-g.limit)/g.limit)
		}
		out = append(out, fmt.Sprintf("%s: measured %s%s — %s", g.text, trimFloat(v), g.unit, verdict))
	}
	return out
}

func trimFloat(v float64) string {
	if math.Abs(v) >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func ratio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v)
}

// usec renders nanoseconds as microseconds.
func usec(ns float64) string {
	if math.IsNaN(ns) || ns <= 0 {
		return "—"
	}
	us := ns / 1e3
	if us >= 100 {
		return thousands(us)
	}
	return fmt.Sprintf("%.1f", us)
}

// thousands renders v rounded, with thousands separators: 12,345.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func mib(n uint64, unit string) string {
	switch unit {
	case "GiB":
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	default:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	}
}

func sizeString(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
