package scrub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/basalt-storage/basalt/internal/transport"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Errors of this package.
var (
	// ErrUnreachable: a replica could not be asked for its checksums (no
	// address, connection failed, timeout, or it answered with an error status
	// such as NO_SUCH_COPYSET).
	ErrUnreachable = errors.New("scrub: replica unreachable")
	// ErrReplicasDiffer: replicas of a copyset hold different data in at
	// least one chunk, and the difference persisted through every re-check.
	ErrReplicasDiffer = errors.New("scrub: replicas differ")
	// ErrIncomplete: a check could not compare everything it was asked to (a
	// replica unreachable, or a chunk that kept changing while it was re-checked).
	ErrIncomplete = errors.New("scrub: check incomplete")
	// ErrBadReply: an OpChecksum reply payload is malformed (reported as the
	// replica being unreachable).
	ErrBadReply = errors.New("scrub: malformed checksum reply")
)

// Member is one replica of a copyset: the chunkserver id and its data-plane address.
type Member struct {
	ID   uint64
	Addr string
}

// Target is one copyset to compare.
type Target struct {
	Pool, Copyset uint32
	// ChunkSize is the pool's chunk size: what one listed chunk costs the
	// replica to checksum (rate limiting).
	ChunkSize uint64
	Members   []Member
}

// ReplicaCRC is one replica's content of a chunk.
type ReplicaCRC struct {
	Member uint64 `json:"member"`
	CRC32C uint32 `json:"crc32c"`
	// Zero: the replica has no data in the chunk (never written, trimmed, or
	// all zeros); CRC32C is 0 then.
	Zero bool `json:"zero,omitempty"`
}

// Difference is a chunk whose replicas disagree.
type Difference struct {
	Pool    uint32 `json:"pool"`
	Copyset uint32 `json:"copyset"`
	Volume  uint64 `json:"volume"`
	Index   uint64 `json:"chunk"`
	// Differ lists the members whose content is not the majority's (every
	// member when no content has a strict majority).
	Differ []uint64 `json:"differ"`
	// Replicas holds every compared member's content, as of the last round.
	Replicas []ReplicaCRC `json:"replicas"`
}

// MemberError is a replica that could not be asked.
type MemberError struct {
	Member uint64 `json:"member"`
	Addr   string `json:"addr"`
	Err    string `json:"error"`
}

// Report is the outcome of comparing one copyset's replicas.
type Report struct {
	Pool    uint32   `json:"pool"`
	Copyset uint32   `json:"copyset"`
	Members []uint64 `json:"members"`
	// Compared: replicas that answered every round and were compared.
	Compared int `json:"compared"`
	// Chunks: distinct chunks with data on any compared replica (0 when fewer
	// than two replicas could be compared).
	Chunks int `json:"chunks"`
	// Rounds: checksum requests sent to each replica (1 + re-checks).
	Rounds int `json:"rounds"`
	// Bytes: chunk bytes the replicas read to answer (as far as replies show).
	Bytes int64 `json:"bytes"`
	// Mismatches persisted, unchanged, through every re-check: real divergence.
	Mismatches []Difference `json:"mismatches,omitempty"`
	// Unsettled chunks differed in every round but kept changing (being
	// written), or lost a replica mid-check: they could not be judged.
	Unsettled   []Difference  `json:"unsettled,omitempty"`
	Unreachable []MemberError `json:"unreachable,omitempty"`
}

// Err summarises the report: nil when every replica answered and agreed,
// ErrReplicasDiffer when a mismatch was found, ErrIncomplete when something
// could not be compared.
func (r *Report) Err() error {
	switch {
	case len(r.Mismatches) > 0:
		return ErrReplicasDiffer
	case len(r.Unreachable) > 0 || len(r.Unsettled) > 0:
		return ErrIncomplete
	}
	return nil
}

// Config configures a Checker. Zero values take the defaults.
type Config struct {
	// Fetcher asks replicas for checksums (default: a Dialer over the data
	// plane, closed by Checker.Close).
	Fetcher Fetcher
	// Limiter bounds the chunk bytes checksummed per second over every
	// replica asked (nil: unlimited). Share one between Checkers to bound them
	// together.
	Limiter *Limiter
	// Rechecks: how many times a differing chunk is compared again before it
	// is reported (default DefaultRechecks; < 0: none, report at once).
	Rechecks int
	// RecheckDelay: the pause before the first re-check; it doubles for each
	// later one (default DefaultRecheckDelay).
	RecheckDelay time.Duration
	// Timeout bounds one checksum request (default DefaultTimeout). A replica
	// reads every chunk of the copyset to answer, so it must cover a large one.
	Timeout time.Duration
	Logger  *slog.Logger
	// Security is how the default Fetcher connects to chunkservers
	// (transport.Security: mode and identity; ModeNone by default).
	Security transport.Security
}

// Defaults of Config.
const (
	DefaultRechecks     = 4
	DefaultRecheckDelay = 250 * time.Millisecond // then 500 ms, 1 s, 2 s: 3.75 s in all
	DefaultTimeout      = 10 * time.Minute
)

// Checker compares the replicas of copysets. Check may be called
// concurrently.
type Checker struct {
	cfg      Config
	log      *slog.Logger
	ownFetch *Dialer // the default Fetcher, closed by Close

	mu     sync.Mutex        // guards chunks
	chunks map[uint64]uint64 // chunks listed per replica at the copyset's last check (cost estimate)
}

// NewChecker returns a Checker.
func NewChecker(cfg Config) *Checker {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Rechecks == 0 {
		cfg.Rechecks = DefaultRechecks
	} else if cfg.Rechecks < 0 {
		cfg.Rechecks = 0
	}
	if cfg.RecheckDelay <= 0 {
		cfg.RecheckDelay = DefaultRecheckDelay
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	c := &Checker{cfg: cfg, log: cfg.Logger.With("component", "scrub"), chunks: map[uint64]uint64{}}
	if c.cfg.Fetcher == nil {
		c.ownFetch = NewDialer(cfg.Logger, cfg.Security)
		c.cfg.Fetcher = c.ownFetch
	}
	return c
}

// Close releases the default Fetcher's connections.
func (c *Checker) Close() error {
	if c.ownFetch != nil {
		return c.ownFetch.Close()
	}
	return nil
}

// chunkKey names a chunk within a copyset.
type chunkKey struct{ volume, index uint64 }

// view is one replica's answer: crc32c per chunk with data.
type view map[chunkKey]uint32

// Check compares the replicas of t, re-checking differing chunks before it
// reports them (see doc.go). It returns early, with what it has, when ctx ends.
func (c *Checker) Check(ctx context.Context, t Target) Report {
	rep := Report{Pool: t.Pool, Copyset: t.Copyset}
	members := slices.Clone(t.Members)
	slices.SortFunc(members, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	for _, m := range members {
		rep.Members = append(rep.Members, m.ID)
	}
	if len(members) < 2 {
		rep.Compared = len(members)
		return rep // one replica: nothing to compare with
	}
	log := c.log.With("pool", t.Pool, "copyset", t.Copyset)

	// Round 0: every chunk of every replica.
	views := c.round(ctx, t, &members, &rep)
	if len(members) < 2 {
		rep.Compared = len(members)
		return rep
	}
	keys := map[chunkKey]struct{}{}
	for _, v := range views {
		for k := range v {
			keys[k] = struct{}{}
		}
	}
	rep.Chunks = len(keys)
	var pending []chunkKey
	last := map[chunkKey][]ReplicaCRC{}
	for k := range keys {
		if vals := values(views, members, k); !agree(vals) {
			pending = append(pending, k)
			last[k] = vals
		}
	}
	slices.SortFunc(pending, func(a, b chunkKey) int {
		return cmp.Or(cmp.Compare(a.volume, b.volume), cmp.Compare(a.index, b.index))
	})

	// Re-checks: only the chunks that differed are judged again. A chunk that
	// agrees once was a write in flight; one that still differs is compared
	// with its previous round to tell a quiet chunk from a busy one.
	changed := map[chunkKey]bool{}
	delay := c.cfg.RecheckDelay
	interrupted := false // a re-check could not run or lost a replica
	for r := 0; r < c.cfg.Rechecks && len(pending) > 0; r++ {
		log.Debug("replicas differ; re-checking", "chunks", len(pending), "round", rep.Rounds, "in", delay)
		if sleepCtx(ctx, delay) != nil {
			interrupted = true
			break
		}
		delay *= 2
		before := len(members)
		views = c.round(ctx, t, &members, &rep)
		if len(members) != before {
			interrupted = true // what is pending cannot be judged on fewer replicas
			break
		}
		next := pending[:0]
		for _, k := range pending {
			vals := values(views, members, k)
			if agree(vals) {
				log.Debug("difference cleared on re-check", "volume", k.volume, "chunk", k.index)
				continue
			}
			changed[k] = !slices.Equal(vals, last[k])
			last[k] = vals
			next = append(next, k)
		}
		pending = next
	}
	rep.Compared = len(members)
	for _, k := range pending {
		vals := last[k]
		d := Difference{Pool: t.Pool, Copyset: t.Copyset, Volume: k.volume, Index: k.index,
			Differ: minority(vals), Replicas: vals}
		if interrupted || changed[k] {
			rep.Unsettled = append(rep.Unsettled, d)
		} else {
			rep.Mismatches = append(rep.Mismatches, d)
		}
	}
	return rep
}

// round asks every member in *members for its checksums at once, within the
// rate limit. Members that fail are moved to rep.Unreachable and dropped from
// *members. It returns the answers by member id.
func (c *Checker) round(ctx context.Context, t Target, members *[]Member, rep *Report) map[uint64]view {
	rep.Rounds++
	key := uint64(t.Pool)<<32 | uint64(t.Copyset)
	c.mu.Lock()
	est := max(c.chunks[key], 1) * t.ChunkSize * uint64(len(*members))
	c.mu.Unlock()
	if err := c.cfg.Limiter.Wait(ctx, int64(est)); err != nil {
		for _, m := range *members {
			rep.Unreachable = append(rep.Unreachable, MemberError{Member: m.ID, Addr: m.Addr, Err: err.Error()})
		}
		*members = nil
		return nil
	}
	type answer struct {
		sums []ChunkSum
		err  error
	}
	answers := make([]answer, len(*members))
	var wg sync.WaitGroup
	for i, m := range *members {
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
			defer cancel()
			sums, err := c.cfg.Fetcher.Checksums(fctx, m.Addr, t.Pool, t.Copyset)
			answers[i] = answer{sums, err}
		})
	}
	wg.Wait()

	views := make(map[uint64]view, len(*members))
	live := (*members)[:0:0]
	var listed uint64
	for i, m := range *members {
		a := answers[i]
		if a.err != nil {
			c.log.Debug("replica could not be checked", "pool", t.Pool, "copyset", t.Copyset,
				"chunkserver", m.ID, "addr", m.Addr, "err", a.err)
			rep.Unreachable = append(rep.Unreachable, MemberError{Member: m.ID, Addr: m.Addr, Err: a.err.Error()})
			continue
		}
		v := make(view, len(a.sums))
		for _, s := range a.sums {
			v[chunkKey{s.Volume, s.Index}] = s.CRC32C
		}
		views[m.ID] = v
		live = append(live, m)
		listed = max(listed, uint64(len(a.sums)))
	}
	*members = live
	// The replicas read at least the chunks they listed (all-zero chunks are
	// read but not listed): settle the estimate against that.
	actual := listed * t.ChunkSize * uint64(len(answers))
	c.cfg.Limiter.Charge(int64(actual) - int64(est))
	rep.Bytes += int64(actual)
	c.mu.Lock()
	c.chunks[key] = listed
	c.mu.Unlock()
	return views
}

// values is every member's content of chunk k, in member order.
func values(views map[uint64]view, members []Member, k chunkKey) []ReplicaCRC {
	out := make([]ReplicaCRC, 0, len(members))
	for _, m := range members {
		crc, ok := views[m.ID][k]
		out = append(out, ReplicaCRC{Member: m.ID, CRC32C: crc, Zero: !ok})
	}
	return out
}

func agree(vals []ReplicaCRC) bool {
	for _, v := range vals[1:] {
		if v.CRC32C != vals[0].CRC32C || v.Zero != vals[0].Zero {
			return false
		}
	}
	return true
}

// minority returns the members whose content is not held by a strict
// majority, or every member when no content has one.
func minority(vals []ReplicaCRC) []uint64 {
	type content struct {
		crc  uint32
		zero bool
	}
	count := map[content]int{}
	for _, v := range vals {
		count[content{v.CRC32C, v.Zero}]++
	}
	var major *content
	for c, n := range count {
		if 2*n > len(vals) {
			major = &c
		}
	}
	var out []uint64
	for _, v := range vals {
		if major == nil || (content{v.CRC32C, v.Zero}) != *major {
			out = append(out, v.Member)
		}
	}
	return out
}

// FormatReplica renders one replica's content of a chunk: "2=0x1a2b3c4d", or
// "2=zeros" for a replica with no data in it.
func FormatReplica(r ReplicaCRC) string {
	if r.Zero {
		return fmt.Sprintf("%d=zeros", r.Member)
	}
	return fmt.Sprintf("%d=0x%08x", r.Member, r.CRC32C)
}
