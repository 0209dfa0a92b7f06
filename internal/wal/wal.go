package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/fsdir"
	pb "go.etcd.io/raft/v3/raftpb"
)

// Errors returned by the WAL.
var (
	// ErrCorrupt means data the WAL had made durable is damaged: a record
	// failed its CRC or did not decode somewhere other than the torn tail of
	// the last segment (a later batch's durable mark proves the damaged
	// bytes had been fdatasynced), a segment is missing from the sequence,
	// or the rebuilt log of a group has a hole. Open refuses to guess and
	// leaves the files as they are: an operator must look.
	ErrCorrupt = errors.New("wal: corrupt")
	// ErrVersion means a segment is in a format version this build does not
	// read (an older or newer basalt release wrote it).
	ErrVersion = errors.New("wal: unsupported segment format version")
	// ErrClosed is returned by calls on a closed WAL and by Saves that were
	// still waiting when it closed.
	ErrClosed = errors.New("wal: closed")
	// ErrFailed wraps the write or sync error that stopped the WAL. After a
	// failed write or fdatasync nothing more is accepted: what reached the
	// disk is unknown until the next Open re-reads it.
	ErrFailed = errors.New("wal: failed")
	// ErrNonContiguous means the entries of one Update do not have
	// consecutive indexes.
	ErrNonContiguous = errors.New("wal: entries not contiguous")
	// ErrGap means an Update's first entry lies beyond the group's last
	// index plus one.
	ErrGap = errors.New("wal: entries leave a gap after the last index")
	// ErrTooLarge means an entry does not fit in one record (1 GiB).
	ErrTooLarge = errors.New("wal: entry too large")
	// ErrUnknownGroup means the group has no state in this WAL.
	ErrUnknownGroup = errors.New("wal: unknown group")
	// ErrSnapshotBeyondLog means CreateSnapshot named an index past the
	// group's last entry.
	ErrSnapshotBeyondLog = errors.New("wal: snapshot index beyond the last entry")
	// ErrCompactBeyondSnapshot means CreateSnapshot asked to drop entries
	// that its snapshot does not cover.
	ErrCompactBeyondSnapshot = errors.New("wal: compaction index beyond the snapshot index")
)

// Defaults for Config.
const (
	DefaultSegmentSize = 64 << 20
	DefaultCacheBytes  = 1 << 20
)

// Knobs are fault-injection points for tests. Nil hooks do nothing.
type Knobs struct {
	// BeforeSync runs after a batch was written and before its fdatasync; an
	// error fails the batch (and the WAL) as a sync error would.
	BeforeSync func() error
	// AfterWrite runs right after a batch was written (before BeforeSync).
	AfterWrite func()
	// AfterSync runs after a batch is durable, before its Saves return.
	AfterSync func()
	// SyncDelay is added to every fdatasync (a slow disk).
	SyncDelay time.Duration
}

// Config configures a WAL.
type Config struct {
	Dir         string // created if missing
	SegmentSize int64  // preallocated size of a segment, rounded up to whole 4 KiB pages; default DefaultSegmentSize
	// CacheBytes bounds the applied entry data cached in memory per group
	// (the newest entries; those not applied yet stay up to 32 × CacheBytes,
	// see SetApplied); default DefaultCacheBytes, negative disables it.
	CacheBytes int
	Logger     *slog.Logger
	Knobs      Knobs
	// OnCommit, if set, is called by the committer after each batch with the
	// time its write took, its fdatasync took (0: a NoSync batch) and its
	// size: the hook for latency histograms. It must be quick.
	OnCommit func(write, sync time.Duration, bytes int)
}

// Update is what one Raft group hands to Save from one Ready.
type Update struct {
	Group uint64
	// HardState is written unless raft.IsEmptyHardState.
	HardState *pb.HardState
	// Entries must have consecutive indexes. An entry at an index <= the
	// group's last replaces the log from there (Raft truncation).
	Entries []*pb.Entry
	// Snapshot, unless raft.IsEmptySnap, is a snapshot received from the
	// leader: the group's log restarts after its index. It is applied
	// before Entries.
	Snapshot *pb.Snapshot
	// NoSync: the update need not be durable when Save returns (raft.MustSync
	// is false: no entries, no snapshot, only the commit index of HardState
	// changed). It is written, and becomes durable with the next synced batch
	// or segment checkpoint; a batch of nothing but NoSync updates skips the
	// fdatasync. A crash may lose it: the commit index then restarts lower,
	// which raft tolerates (etcd does the same).
	NoSync bool
}

// WAL is the shared segmented Raft log. See doc.go.
type WAL struct {
	cfg   Config
	dir   string
	log   *slog.Logger
	knobs Knobs

	kick    chan struct{} // wakes the committer (cap 1)
	quit    chan struct{} // closed by Close
	stopped chan struct{} // closed when the committer exits
	// unsynced: the active segment holds a NoSync batch not yet covered by
	// an fdatasync. Owned by the committer.
	unsynced bool
	// synced: the offset of the active segment up to which it is known
	// durable (fdatasynced), written as the next batch's mark. Owned by the
	// committer (and Open before it starts).
	synced int64

	// mu guards everything below. The committer does its write and sync
	// without it. Lock order: mu is a leaf lock.
	mu       sync.Mutex
	closed   bool
	err      error // sticky failure
	groups   map[uint64]*group
	segs     []*segment // oldest first; the last one is active
	writeOff int64      // next write offset in the active segment
	// tailPage: the active segment's bytes from the page boundary before
	// writeOff up to it (commit rewrites them). The committer's alone (and
	// Open's before it starts).
	tailPage []byte
	direct   *directWriter // large batches (the committer's alone)
	iov      [][]byte      // writePages' scratch (the committer's alone)
	preBuf   []byte        // a batch's pad record (the committer's alone)
	// tailSpare is the previous tailPage's buffer, reused (the committer's alone).
	tailSpare []byte
	pending   *batch
	spare     *batch
	// committing: the batch the committer is writing and syncing (nil
	// between batches).
	committing *batch
	stats      Stats
	// spareFile is the prepared next segment (nil if none); preparing is
	// set while a prepareSpare goroutine runs (prepWG counts it).
	spareFile *spareFile
	preparing bool
	prepWG    sync.WaitGroup
	// recycled: files of removed segments kept for prepareSpare to reuse
	// (at most maxRecycled), oldest first.
	recycled []string
	// lastScratch: per group, the last index as the updates of the Save
	// being validated leave it; empty between Saves.
	lastScratch map[uint64]uint64
}

// Open opens (or creates) the WAL in cfg.Dir: it reads every segment in
// order, verifies every record, cuts a torn tail off the last segment and
// rebuilds each group's index. It starts the committer goroutine.
func Open(cfg Config) (*WAL, error) {
	if cfg.SegmentSize <= 0 {
		cfg.SegmentSize = DefaultSegmentSize
	}
	cfg.SegmentSize = roundUp(cfg.SegmentSize) // whole pages (writePages, O_DIRECT)
	if cfg.CacheBytes == 0 {
		cfg.CacheBytes = DefaultCacheBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The directory (and any parent it needs) durable before a segment is
	// synced in it.
	if err := fsdir.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	w := &WAL{
		cfg:         cfg,
		dir:         cfg.Dir,
		log:         cfg.Logger.With("subsystem", "wal"),
		knobs:       cfg.Knobs,
		kick:        make(chan struct{}, 1),
		quit:        make(chan struct{}),
		stopped:     make(chan struct{}),
		groups:      make(map[uint64]*group),
		lastScratch: make(map[uint64]uint64),
		pending:     &batch{res: newResult()},
		spare:       &batch{},
		direct:      newDirectWriter(),
	}
	if err := w.recover(); err != nil {
		for _, s := range w.segs {
			s.f.Close()
		}
		return nil, err
	}
	go w.committer()
	return w, nil
}

// Save makes updates durable: every record is written and fdatasynced
// before Save returns. Concurrent Saves share one write and one fdatasync.
// Saves for the same group must not run concurrently (their order is the
// log's order); within one Save, updates apply in slice order. If any update
// is invalid (ErrGap, ErrNonContiguous) nothing of the Save is written.
func (w *WAL) Save(updates []Update) error {
	return w.enqueue(w.encodeUpdates(updates), nil)
}

// SaveAsync is Save without the wait: the updates take their place in the log
// before SaveAsync returns (so a group may have several SaveAsyncs in flight,
// their order the call order), and done is called exactly once with Save's
// outcome: by the committer once they are durable, in call order, or at once
// for an invalid update or a closed or failed WAL. done runs on the
// committer's goroutine and must not block.
func (w *WAL) SaveAsync(updates []Update, done func(error)) {
	if err := w.enqueue(w.encodeUpdates(updates), done); err != nil {
		done(err)
	}
}

// RemoveGroup durably forgets a group: its state and entries are dropped and
// it no longer keeps any segment alive.
func (w *WAL) RemoveGroup(group uint64) error {
	return w.enqueue(func(b *batch) error {
		b.ops = append(b.ops, op{kind: recGroupRemoved, group: group, start: len(b.buf)})
		b.buf = appendGroupRemoved(b.buf, group)
		b.sync = true
		return nil
	}, nil)
}

// SetApplied records that the group applied its entries up to index. The
// entry cache keeps entries not applied yet beyond Config.CacheBytes (see
// trimCache): a host that never calls it gets a cache of up to
// 32 × CacheBytes per group.
func (w *WAL) SetApplied(group, index uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g := w.groups[group]; g != nil && index > g.applied {
		g.applied = index
		g.trimCache(w.cfg.CacheBytes)
	}
}

// Groups returns the ids of the groups the WAL holds, sorted.
func (w *WAL) Groups() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]uint64, 0, len(w.groups))
	for id := range w.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Stalled returns how long the oldest call not yet durable (a Save, a
// SaveAsync, ...) has been waiting for its write and fdatasync: 0 when none
// waits. On a healthy disk it stays below a sync's latency plus a batch's;
// a disk whose fdatasync hangs makes it grow without bound, while every
// other goroutine (and the process's sockets) goes on — the host watches it
// (internal/chunkserver, --wal-stall-timeout).
func (w *WAL) Stalled() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.committing // older than the pending batch
	if b == nil {
		b = w.pending
	}
	if b.since.IsZero() {
		return 0
	}
	return time.Since(b.since)
}

// SegmentCount returns the number of segment files.
func (w *WAL) SegmentCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.segs)
}

// Close stops the committer, fails Saves still waiting with ErrClosed and
// closes the files. Everything whose Save returned nil is durable.
func (w *WAL) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	w.closed = true
	w.mu.Unlock()
	close(w.quit)
	<-w.stopped
	w.direct.close()
	w.prepWG.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if sp := w.spareFile; sp != nil {
		sp.f.Close()
		os.Remove(sp.path)
		w.spareFile = nil
	}
	for _, path := range w.recycled {
		os.Remove(path)
	}
	w.recycled = nil
	var err error
	for _, s := range w.segs {
		err = errors.Join(err, s.f.Close())
	}
	return err
}

func (w *WAL) groupLocked(id uint64) *group {
	g := w.groups[id]
	if g == nil {
		g = newGroup(id)
		w.groups[id] = g
	}
	return g
}

func (w *WAL) dropGroupLocked(id uint64) {
	delete(w.groups, id)
	for _, s := range w.segs {
		delete(s.maxIdx, id)
	}
}
