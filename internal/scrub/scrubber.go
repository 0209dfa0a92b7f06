package scrub

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/pkg/api"
)

// ScrubberConfig configures a background Scrubber. Zero values take the defaults.
type ScrubberConfig struct {
	// Targets returns the copysets to scrub now: a chunkserver passes the ones
	// it leads (LeaderTargets). Called before every copyset, so leadership
	// changes are followed.
	Targets func() []Target
	// BytesPerSec bounds the chunk data checksummed, summed over every replica
	// asked (default DefaultScrubRate).
	BytesPerSec int64
	// Interval is the pause after each copyset (default DefaultScrubInterval).
	Interval time.Duration
	// PassInterval is the least time from the start of one pass over every
	// copyset to the start of the next (default DefaultPassInterval).
	PassInterval time.Duration
	// Check tunes the comparison (re-checks, timeouts, Fetcher). Its Limiter
	// is replaced by one of BytesPerSec.
	Check  Config
	Logger *slog.Logger
}

// Defaults of ScrubberConfig: gentle — one copyset at a time.
const (
	DefaultScrubRate     = 16 << 20 // bytes/s
	DefaultScrubInterval = 5 * time.Second
	DefaultPassInterval  = time.Hour
)

// Stats are a Scrubber's cumulative counts (for metrics).
type Stats struct {
	Passes           uint64 // passes over every target completed
	CopysetsScrubbed uint64 // copyset checks completed (whatever their result)
	ChunksCompared   uint64 // chunks compared over those checks
	Mismatches       uint64 // chunks whose replicas persistently differ
	Unsettled        uint64 // chunks that kept changing while re-checked
	Unreachable      uint64 // replicas that could not be asked
	BytesChecksummed uint64 // chunk bytes the replicas read to answer
}

// Scrubber slowly and repeatedly compares the replicas of its targets,
// logging differences at Warn. Run it on its own goroutine.
type Scrubber struct {
	cfg ScrubberConfig
	log *slog.Logger
	chk *Checker

	passes, copysets, chunks, mismatches, unsettled, unreachable, bytes atomic.Uint64
}

// NewScrubber returns a Scrubber; nothing runs until Run.
func NewScrubber(cfg ScrubberConfig) *Scrubber {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BytesPerSec <= 0 {
		cfg.BytesPerSec = DefaultScrubRate
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultScrubInterval
	}
	if cfg.PassInterval <= 0 {
		cfg.PassInterval = DefaultPassInterval
	}
	if cfg.Targets == nil {
		cfg.Targets = func() []Target { return nil }
	}
	cfg.Check.Logger = cfg.Logger
	cfg.Check.Limiter = NewLimiter(cfg.BytesPerSec, 0)
	return &Scrubber{cfg: cfg, log: cfg.Logger.With("component", "scrub"), chk: NewChecker(cfg.Check)}
}

// Stats returns the counts so far.
func (s *Scrubber) Stats() Stats {
	return Stats{
		Passes: s.passes.Load(), CopysetsScrubbed: s.copysets.Load(), ChunksCompared: s.chunks.Load(),
		Mismatches: s.mismatches.Load(), Unsettled: s.unsettled.Load(), Unreachable: s.unreachable.Load(),
		BytesChecksummed: s.bytes.Load(),
	}
}

// Run walks the targets one copyset at a time, in (pool, copyset) order,
// until ctx ends; then it closes its connections and returns.
func (s *Scrubber) Run(ctx context.Context) {
	defer s.chk.Close()
	s.log.Info("background scrub started", "bytes_per_sec", s.cfg.BytesPerSec,
		"interval", s.cfg.Interval, "pass_interval", s.cfg.PassInterval)
	for ctx.Err() == nil {
		start := time.Now()
		wait := s.cfg.PassInterval
		if s.pass(ctx) == 0 {
			// Nothing to scrub (no leader elected yet after a start, or
			// this chunkserver leads nothing): look again soon.
			wait = s.cfg.Interval
		} else if ctx.Err() == nil {
			s.passes.Add(1)
		}
		if sleepCtx(ctx, wait-time.Since(start)) != nil {
			break
		}
	}
	s.log.Info("background scrub stopped", "copysets", s.copysets.Load(), "mismatches", s.mismatches.Load())
}

// pass scrubs every target once and returns how many it scrubbed. The target
// list is re-read before each copyset and walked by key, so copysets gained
// or lost meanwhile are picked up or skipped.
func (s *Scrubber) pass(ctx context.Context) int {
	var (
		next     uint64 // key of the next copyset to scrub: pool<<32 | copyset
		scrubbed int
		found    int
		warned   = map[uint64]bool{} // members reported unreachable this pass
	)
	for ctx.Err() == nil {
		t, ok := nextTarget(s.cfg.Targets(), next)
		if !ok {
			break
		}
		key := api.GroupID(t.Pool, t.Copyset)
		next = key + 1
		rep := s.chk.Check(ctx, t)
		if ctx.Err() != nil {
			return scrubbed // a check cut short proves nothing
		}
		s.record(&rep, warned)
		scrubbed++
		found += len(rep.Mismatches)
		if key == ^uint64(0) || sleepCtx(ctx, s.cfg.Interval) != nil {
			break
		}
	}
	if ctx.Err() == nil && scrubbed > 0 {
		s.log.Info("scrub pass done", "copysets", scrubbed, "mismatches", found)
	}
	return scrubbed
}

// record counts a report and logs what it found. An unreachable member is
// logged at Warn once per pass (warned), then at Debug.
func (s *Scrubber) record(rep *Report, warned map[uint64]bool) {
	s.copysets.Add(1)
	s.chunks.Add(uint64(rep.Chunks))
	s.mismatches.Add(uint64(len(rep.Mismatches)))
	s.unsettled.Add(uint64(len(rep.Unsettled)))
	s.unreachable.Add(uint64(len(rep.Unreachable)))
	s.bytes.Add(uint64(rep.Bytes))
	for _, d := range rep.Mismatches {
		s.log.Warn("replicas differ", "pool", d.Pool, "copyset", d.Copyset,
			"group", api.GroupID(d.Pool, d.Copyset), "volume", d.Volume, "chunk", d.Index,
			"differ", d.Differ, "replicas", crcList(d.Replicas))
	}
	for _, u := range rep.Unreachable {
		level := slog.LevelWarn
		if warned[u.Member] {
			level = slog.LevelDebug
		}
		warned[u.Member] = true
		s.log.Log(context.Background(), level, "replica could not be scrubbed", "pool", rep.Pool, "copyset", rep.Copyset,
			"group", api.GroupID(rep.Pool, rep.Copyset), "chunkserver", u.Member, "addr", u.Addr, "err", u.Err)
	}
	if n := len(rep.Unsettled); n > 0 {
		s.log.Info("chunks kept changing while re-checked; judged next pass", "pool", rep.Pool,
			"copyset", rep.Copyset, "chunks", n)
	}
}

// nextTarget returns the target with the smallest key >= from.
func nextTarget(ts []Target, from uint64) (Target, bool) {
	var best *Target
	for i := range ts {
		k := api.GroupID(ts[i].Pool, ts[i].Copyset)
		if k >= from && (best == nil || k < api.GroupID(best.Pool, best.Copyset)) {
			best = &ts[i]
		}
	}
	if best == nil {
		return Target{}, false
	}
	return *best, true
}

// MaxFollowerLag is how many entries a follower's log may trail the leader's
// commit index for LeaderTargets to scrub the copyset.
const MaxFollowerLag = 1000

// LeaderTargets picks, from a chunkserver's raft groups, the copysets worth
// comparing now: led by this chunkserver, healthy, with no learner (no
// membership change in flight), and every voter's log within MaxFollowerLag
// entries of the commit index (a follower catching up differs for a reason).
// addrOf maps a chunkserver id to its data-plane address (self included);
// chunkSize maps a pool to its chunk size (0 if unknown: skipped).
func LeaderTargets(groups []raftstore.GroupStatus, addrOf func(id uint64) string, chunkSize func(pool uint32) uint64) []Target {
	var out []Target
	for _, g := range groups {
		if !g.IsLeader || !g.Healthy || len(g.Learners) > 0 || len(g.Voters) < 2 {
			continue
		}
		pool, id := api.SplitGroupID(g.ID)
		t := Target{Pool: pool, Copyset: id, ChunkSize: chunkSize(pool)}
		ok := t.ChunkSize > 0
		for _, v := range g.Voters {
			if match, known := g.Progress[v]; !known || match+MaxFollowerLag < g.Commit {
				ok = false
			}
			t.Members = append(t.Members, Member{ID: v, Addr: addrOf(v)})
		}
		if ok {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b Target) int {
		return cmp.Compare(api.GroupID(a.Pool, a.Copyset), api.GroupID(b.Pool, b.Copyset))
	})
	return out
}

// crcList formats replicas for a log line: "1=0x1a2b3c4d 2=zero".
func crcList(rs []ReplicaCRC) string {
	b := make([]byte, 0, 16*len(rs))
	for i, r := range rs {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, FormatReplica(r)...)
	}
	return string(b)
}
