package wal

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
)

// Errors returned by the WAL.
var (
	// ErrCorrupt means a record failed its CRC or did not decode somewhere
	// other than the tail of the last segment, a segment is missing from the
	// sequence, or the rebuilt log of a group has a hole. Open refuses to
	// guess: an operator must look.
	ErrCorrupt = errors.New("wal: corrupt")
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

// maxKeptBuffer bounds the batch buffer capacity kept for reuse.
const maxKeptBuffer = 4 << 20

// errIgnore tells enqueue that there is nothing to write and nothing wrong.
var errIgnore = errors.New("wal: nothing to do")

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

// segment is one log file. seq, path and f are immutable; maxIdx is guarded
// by WAL.mu.
type segment struct {
	seq  uint64
	path string
	f    *os.File
	// maxIdx: per group, the highest entry index written to this segment.
	maxIdx map[uint64]uint64
}

func segmentName(seq uint64) string { return fmt.Sprintf("%016x.wal", seq) }

// op is one in-memory effect of a batch, applied once the batch is durable.
type op struct {
	kind  byte // a record type
	group uint64
	start int // offset of the record within the batch buffer
	ents  []*pb.Entry
	hs    hardState
	snap  *snapRecord
}

// batch collects everything handed to Save (and friends) while the previous
// batch is being written and synced.
type batch struct {
	buf   []byte
	refs  []dataRef // entry data written from the entries (gaps in buf)
	ops   []op
	saves int
	sync  bool          // some record of the batch must be durable before its waiters return
	res   *result       // fresh for every batch: waiters keep it after buf is reused
	dones []func(error) // SaveAsync callbacks, in call order
}

// result is how a batch's waiters learn its outcome: err is written before
// done is closed.
type result struct {
	done chan struct{}
	err  error
}

func newResult() *result { return &result{done: make(chan struct{})} }

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
	pending  *batch
	spare    *batch
	stats    Stats
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
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
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

// listSegments returns the sequence numbers of the segment files in dir,
// sorted, and removes leftover temporary files.
func (w *WAL) listSegments() ([]uint64, error) {
	des, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	var seqs []uint64
	for _, de := range des {
		name := de.Name()
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(w.dir, name))
			continue
		}
		base, ok := strings.CutSuffix(name, ".wal")
		if !ok {
			continue
		}
		seq, err := strconv.ParseUint(base, 16, 64)
		if err != nil || len(base) != 16 {
			continue
		}
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			return nil, fmt.Errorf("%w: segment %s missing", ErrCorrupt, segmentName(seqs[i-1]+1))
		}
	}
	return seqs, nil
}

func (w *WAL) recover() error {
	seqs, err := w.listSegments()
	if err != nil {
		return err
	}
	if len(seqs) == 0 {
		s, err := w.createSegment(1, nil, 0)
		if err != nil {
			return err
		}
		w.segs = []*segment{s}
		w.writeOff = segHeaderSize
		return nil
	}
	for i, seq := range seqs {
		last := i == len(seqs)-1
		path := filepath.Join(w.dir, segmentName(seq))
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		s := &segment{seq: seq, path: path, f: f, maxIdx: make(map[uint64]uint64)}
		w.segs = append(w.segs, s)
		end, err := w.replaySegment(s, last)
		if err != nil {
			return err
		}
		if last {
			w.writeOff = end
			// A clean end may have left the file shorter than a segment
			// (a crash before preallocation, a copied file); make room so
			// that appends do not change the file size.
			if err := preallocate(f, w.cfg.SegmentSize); err != nil {
				return err
			}
			if err := w.loadTail(s, end); err != nil {
				return err
			}
		}
	}
	for id, g := range w.groups {
		if g.gap {
			return fmt.Errorf("%w: group %d: entries before %d missing", ErrCorrupt, id, g.firstIndex())
		}
	}
	w.log.Info("wal: opened", "dir", w.dir, "segments", len(w.segs), "groups", len(w.groups))
	return nil
}

// replaySegment reads one segment and applies its records. For the last
// segment a torn or corrupt tail is cut off; elsewhere it is ErrCorrupt. It
// returns the offset after the last good record.
func (w *WAL) replaySegment(s *segment, last bool) (int64, error) {
	b, err := os.ReadFile(s.path)
	if err != nil {
		return 0, fmt.Errorf("wal: %w", err)
	}
	if len(b) < segHeaderSize || string(b[:4]) != segMagic || le.Uint64(b[8:]) != s.seq {
		return 0, fmt.Errorf("%w: %s: bad segment header", ErrCorrupt, s.path)
	}
	if v := le.Uint32(b[4:]); v != segVersion {
		return 0, fmt.Errorf("%w: %s: segment format version %d, this build reads version %d only "+
			"(written by another basalt release: start that release, or move the data directory aside)",
			ErrCorrupt, s.path, v, segVersion)
	}
	tag := segTag(s.seq)
	off := segHeaderSize
	for {
		n, st := checkRecord(b[off:], tag)
		if st == recOK {
			if err := w.replayRecord(s, b, off, n); err != nil {
				return 0, fmt.Errorf("%s offset %d: %w", s.path, off, err)
			}
			off += recHeaderSize + n
			continue
		}
		if st == recBad && len(b)-off >= recHeaderSize {
			if !last {
				return 0, fmt.Errorf("%w: %s: bad record at offset %d", ErrCorrupt, s.path, off)
			}
			w.log.Warn("wal: torn tail cut off", "segment", s.path, "offset", off, "dropped_bytes", len(b)-off)
			if err := w.cutTail(s, int64(off)); err != nil {
				return 0, err
			}
			break
		}
		// The end of the records. In the last segment, appends continue here,
		// so whatever follows must go: records of an older segment (a
		// recycled file) are harmless, but a crash may have left records of
		// this one after a torn header, and a later append ending exactly
		// where one starts would bring it back.
		if last && !allZero(b[off:]) {
			w.log.Debug("wal: clearing the tail after the last record", "segment", s.path, "offset", off, "bytes", len(b)-off)
			if err := w.cutTail(s, int64(off)); err != nil {
				return 0, err
			}
		}
		break
	}
	return int64(off), nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// cutTail truncates the last segment after its last good record and
// preallocates it again (zeros), durably.
func (w *WAL) cutTail(s *segment, off int64) error {
	if err := s.f.Truncate(off); err != nil {
		return fmt.Errorf("wal: cut tail: %w", err)
	}
	if err := preallocate(s.f, w.cfg.SegmentSize); err != nil {
		return err
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("wal: cut tail: %w", err)
	}
	return nil
}

// preallocate extends f to size bytes of zeros by writing them, not with
// fallocate(2): blocks fallocate reserves are "unwritten", and the first write
// into each makes fdatasync commit the file system's journal to convert the
// extent (ext4, XFS) — a second, file-system-wide flush that every chunkserver
// on the disk queues behind. Over written blocks fdatasync is a data flush only:
// three concurrent 4 KiB fdatasync writers on this machine's disk took 340 µs per
// sync on fallocated files and 150 µs on zero-filled ones (docs/performance.md).
// The zeros are written once per segment, off the write path (prepareSpare),
// with O_DIRECT where the file system allows it: through the page cache they
// cost a core's worth of copying under sequential writes. That leaves the
// pages uncached, which appends do not mind: they write whole pages (commit).
func preallocate(f *os.File, size int64) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("wal: preallocate: %w", err)
	}
	off := fi.Size()
	if off >= size {
		return nil
	}
	// Up to the next page boundary through the page cache (the bytes before
	// off in that page are records), the rest direct if possible.
	if head := min(roundUp(off)-off, size-off); head > 0 {
		if _, err := f.WriteAt(zeroPage[:head], off); err != nil {
			return fmt.Errorf("wal: preallocate: %w", err)
		}
		off += head
	}
	if off < size {
		if err := writeZerosDirect(f.Name(), off, roundUp(size)); err != nil {
			return fmt.Errorf("wal: preallocate: %w", err)
		}
	}
	return nil
}

// writeZerosDirect writes zeros to the file at path over [off, size), both
// page-aligned, with O_DIRECT; through the page cache if O_DIRECT is refused.
func writeZerosDirect(path string, off, size int64) error {
	if zeros := directZeros(); zeros != nil {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err == nil {
			off, err = pwriteZeros(fd, zeros, off, size)
			unix.Close(fd)
			if !errors.Is(err, unix.EINVAL) {
				return err
			}
		}
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// 16 KiB writes: the page cache makes folios as large as each write, and
	// every later append into a folio costs time in proportion to its size
	// (ext4 walks all its blocks; see datastore's writePiece).
	_, err = pwriteZeros(fd, make([]byte, 16<<10), off, size)
	return err
}

// pwriteZeros writes zeros over [off, size) and returns how far it got.
func pwriteZeros(fd int, zeros []byte, off, size int64) (int64, error) {
	for off < size {
		n, err := unix.Pwrite(fd, zeros[:min(int64(len(zeros)), size-off)], off)
		if err != nil {
			return off, err
		}
		if n == 0 {
			return off, io.ErrShortWrite
		}
		off += int64(n)
	}
	return off, nil
}

const pageSize = 4096

func roundUp(n int64) int64   { return (n + pageSize - 1) &^ (pageSize - 1) }
func roundDown(n int64) int64 { return n &^ (pageSize - 1) }

var zeroPage = make([]byte, pageSize)

// directZeros returns 1 MiB of zeros aligned for O_DIRECT (anonymous mmap:
// page-aligned, never written), or nil if the mapping failed.
var directZeros = sync.OnceValue(func() []byte {
	b, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	return b
})

func (w *WAL) groupLocked(id uint64) *group {
	g := w.groups[id]
	if g == nil {
		g = newGroup(id)
		w.groups[id] = g
	}
	return g
}

// replayRecord applies the record at b[off:] (payload length n).
func (w *WAL) replayRecord(s *segment, b []byte, off, n int) error {
	d := &decoder{b: b[off+recHeaderSize : off+recHeaderSize+n]}
	switch typ := d.u8(); typ {
	case recEntries:
		id, first, count := d.u64(), d.u64(), d.u32()
		if d.err != nil {
			return d.err
		}
		if first == 0 || count == 0 || first > math.MaxUint64/2 {
			return fmt.Errorf("%w: entries record for group %d: first %d count %d", ErrCorrupt, id, first, count)
		}
		g := w.groupLocked(id)
		skip := g.prepareAppend(first)
		for i := uint64(0); i < uint64(count); i++ {
			term, et, size := d.u64(), d.u8(), d.u32()
			dataOff := off + recHeaderSize + d.off
			d.bytes(int(size))
			if d.err != nil {
				return d.err
			}
			if i < skip {
				continue
			}
			loc := entryLoc{term: term, seg: s.seq, off: int64(dataOff), size: size,
				typ: pb.EntryType(et &^ entryHasData), hasData: et&entryHasData != 0}
			g.appendLoc(loc, nil, 0)
		}
		if last := first + uint64(count) - 1; last > s.maxIdx[id] {
			s.maxIdx[id] = last
		}
	case recHardState:
		id := d.u64()
		hs := hardState{term: d.u64(), vote: d.u64(), commit: d.u64()}
		if d.err != nil {
			return d.err
		}
		g := w.groupLocked(id)
		g.hs, g.hsSet = hs, true
	case recSnapshot:
		sr := decodeSnapshot(d)
		if d.err != nil {
			return d.err
		}
		w.groupLocked(sr.group).applySnapshot(sr)
	case recGroupRemoved:
		id := d.u64()
		if d.err != nil {
			return d.err
		}
		w.dropGroupLocked(id)
	default:
		return fmt.Errorf("%w: unknown record type %d", ErrCorrupt, typ)
	}
	if d.err == nil && d.off != len(d.b) {
		return fmt.Errorf("%w: %d trailing bytes in record", ErrCorrupt, len(d.b)-d.off)
	}
	return d.err
}

func (w *WAL) dropGroupLocked(id uint64) {
	delete(w.groups, id)
	for _, s := range w.segs {
		delete(s.maxIdx, id)
	}
}

// spareFile is a segment file prepared ahead of need by prepareSpare:
// created under a temporary name, preallocated and fsynced, so that a
// rollover only writes the header and checkpoint, renames and syncs.
type spareFile struct {
	seq  uint64
	path string
	f    *os.File
	size int64
}

// createSegment creates segment seq holding a header and ckpt, preallocated
// to at least size bytes: written under a temporary name, synced, renamed,
// and the directory synced, so a segment file exists only complete. It uses
// the prepared spare file when there is one for seq.
func (w *WAL) createSegment(seq uint64, ckpt []byte, size int64) (*segment, error) {
	size = max(size, w.cfg.SegmentSize)
	path := filepath.Join(w.dir, segmentName(seq))
	w.mu.Lock()
	spare := w.spareFile
	w.spareFile = nil
	w.mu.Unlock()
	var f *os.File
	var tmp string
	prepared := false
	if sp := spare; sp != nil {
		if sp.seq == seq && sp.size >= size {
			f, tmp, prepared = sp.f, sp.path, true
		} else {
			sp.f.Close()
			os.Remove(sp.path)
		}
	}
	if f == nil {
		tmp = path + ".tmp"
		var err error
		if f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644); err != nil {
			return nil, fmt.Errorf("wal: create segment: %w", err)
		}
	}
	fail := func(err error) (*segment, error) {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("wal: create segment: %w", err)
	}
	if !prepared {
		if err := preallocate(f, size); err != nil {
			return fail(err)
		}
	}
	hdr := appendSegmentHeader(make([]byte, 0, roundUp(int64(segHeaderSize+len(ckpt)))), seq)
	hdr = append(hdr, ckpt...)
	sealRecords(hdr[segHeaderSize:], seq)
	n := len(hdr)
	if _, err := f.WriteAt(hdr[:roundUp(int64(n))], 0); err != nil { // whole pages: see writePages
		return fail(err)
	}
	// A prepared file's size and allocation are durable already.
	sync := f.Sync
	if prepared {
		sync = func() error { return unix.Fdatasync(int(f.Fd())) }
	}
	if err := sync(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	if err := syncDir(w.dir); err != nil {
		f.Close()
		return nil, err
	}
	if prepared {
		w.mu.Lock()
		w.stats.PreparedSegments++
		w.mu.Unlock()
	}
	w.tailPage = append(w.tailPage[:0], hdr[roundDown(int64(n)):n]...)
	return &segment{seq: seq, path: path, f: f, maxIdx: make(map[uint64]uint64)}, nil
}

// maybePrepareSpare starts preparing the next segment file in the
// background once the active segment is half full. Called by the committer.
func (w *WAL) maybePrepareSpare() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.preparing || w.spareFile != nil || w.writeOff < w.cfg.SegmentSize/2 {
		return
	}
	seq := w.segs[len(w.segs)-1].seq + 1
	w.preparing = true
	w.prepWG.Add(1)
	go w.prepareSpare(seq)
}

// prepareSpare is the short-lived goroutine that creates the spare file for
// segment seq. It owns the file until it hands it over under w.mu.
func (w *WAL) prepareSpare(seq uint64) {
	defer w.prepWG.Done()
	path := filepath.Join(w.dir, segmentName(seq)+".prep.tmp")
	sp, err := func() (*spareFile, error) {
		if f, rpath := w.reuseRecycled(); f != nil {
			// Written and synced in full when it was a segment: nothing to do.
			w.mu.Lock()
			w.stats.RecycledSegments++
			w.mu.Unlock()
			return &spareFile{seq: seq, path: rpath, f: f, size: w.cfg.SegmentSize}, nil
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, err
		}
		if err := preallocate(f, w.cfg.SegmentSize); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		return &spareFile{seq: seq, path: path, f: f, size: w.cfg.SegmentSize}, nil
	}()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.preparing = false
	if err != nil {
		os.Remove(path)
		w.log.Warn("wal: preparing the next segment failed; will create it on demand", "err", err)
		return
	}
	if w.closed || w.segs[len(w.segs)-1].seq >= seq {
		sp.f.Close()
		os.Remove(sp.path)
		return
	}
	w.spareFile = sp
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("wal: sync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("wal: sync dir: %w", err)
	}
	return nil
}

// enqueue adds records to the pending batch through encode (which appends
// to buf and ops). With done nil it waits until the batch is durable;
// otherwise it returns at once and the committer calls done, in call order.
// An error (closed or failed WAL, invalid input) is returned, not handed to
// done.
func (w *WAL) enqueue(encode func(b *batch) error, done func(error)) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	b := w.pending
	mark, nops, nrefs := len(b.buf), len(b.ops), len(b.refs)
	if err := encode(b); err != nil {
		b.buf, b.ops, b.refs = b.buf[:mark], b.ops[:nops], b.refs[:nrefs]
		if err != errIgnore || done == nil {
			w.mu.Unlock()
			if err == errIgnore {
				err = nil
			}
			return err
		}
	}
	if len(b.ops) == nops && done == nil {
		// Nothing to write (a Ready with no HardState, entries or
		// snapshot): nothing to wait for. (An async caller still queues its
		// callback: it must come after those of its earlier Saves.)
		w.mu.Unlock()
		return nil
	}
	b.saves++
	res := b.res
	if done != nil {
		b.dones = append(b.dones, done)
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if done != nil {
		return nil
	}
	<-res.done
	return res.err
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

// encodeUpdates returns the encoder of Save and SaveAsync.
func (w *WAL) encodeUpdates(updates []Update) func(b *batch) error {
	return func(b *batch) error {
		defer clear(w.lastScratch)
		for i := range updates {
			if err := w.validateLocked(&updates[i]); err != nil {
				return err
			}
		}
		for id, last := range w.lastScratch {
			g := w.groupLocked(id)
			g.queuedLast, g.queued = last, true
		}
		for i := range updates {
			u := &updates[i]
			if !u.NoSync || len(u.Entries) > 0 || !raft.IsEmptySnap(u.Snapshot) {
				b.sync = true
			}
			if newerSnapshot(w.groupLocked(u.Group), u.Snapshot) {
				md := u.Snapshot.GetMetadata()
				sr := &snapRecord{
					group: u.Group, flags: snapFlagReset,
					index: md.GetIndex(), term: md.GetTerm(),
					compactIndex: md.GetIndex(), compactTerm: md.GetTerm(),
					conf: md.GetConfState(), data: u.Snapshot.GetData(),
				}
				b.ops = append(b.ops, op{kind: recSnapshot, group: u.Group, start: len(b.buf), snap: sr})
				b.buf = appendSnapshot(b.buf, sr)
			}
			// Entries go into records of at most entriesRecordMax bytes.
			for ents := u.Entries; len(ents) > 0; {
				n, size := 0, entriesHeadSize
				for n < len(ents) && (n == 0 || size+entryHeadSize+len(ents[n].Data) <= entriesRecordMax) {
					size += entryHeadSize + len(ents[n].Data)
					n++
				}
				b.ops = append(b.ops, op{kind: recEntries, group: u.Group, start: len(b.buf), ents: ents[:n]})
				b.buf = appendEntries(b.buf, u.Group, ents[:n], &b.refs)
				ents = ents[n:]
			}
			if !raft.IsEmptyHardState(u.HardState) {
				hs := hardState{u.HardState.GetTerm(), u.HardState.GetVote(), u.HardState.GetCommit()}
				b.ops = append(b.ops, op{kind: recHardState, group: u.Group, start: len(b.buf), hs: hs})
				b.buf = appendHardState(b.buf, u.Group, hs)
			}
		}
		return nil
	}
}

// newerSnapshot reports whether snap is a snapshot newer than g's. An older
// one (raft never sends one, but a host may race with CreateSnapshot) is
// ignored, as raft.MemoryStorage.ApplySnapshot refuses it.
func newerSnapshot(g *group, snap *pb.Snapshot) bool {
	return !raft.IsEmptySnap(snap) && snap.GetMetadata().GetIndex() > g.snapIndex()
}

// validateLocked checks one update against the group's log as the earlier
// updates of the same Save leave it (w.lastScratch).
func (w *WAL) validateLocked(u *Update) error {
	g := w.groupLocked(u.Group)
	last, ok := w.lastScratch[u.Group]
	if !ok {
		last = g.nextAfter()
	}
	if newerSnapshot(g, u.Snapshot) {
		last = u.Snapshot.GetMetadata().GetIndex()
	}
	if len(u.Entries) > 0 {
		w.lastScratch[u.Group] = u.Entries[len(u.Entries)-1].GetIndex()
	} else {
		w.lastScratch[u.Group] = last
	}
	if len(u.Entries) == 0 {
		return nil
	}
	first := u.Entries[0].GetIndex()
	for i, e := range u.Entries {
		if e.GetIndex() != first+uint64(i) {
			return fmt.Errorf("%w: group %d: index %d after %d", ErrNonContiguous, u.Group, e.GetIndex(), first+uint64(i)-1)
		}
	}
	if first == 0 || first > last+1 {
		return fmt.Errorf("%w: group %d: first %d, last %d", ErrGap, u.Group, first, last)
	}
	for _, e := range u.Entries {
		if len(e.Data) > entriesRecordMax-entriesHeadSize-entryHeadSize {
			return fmt.Errorf("%w: group %d: entry %d has %d bytes", ErrTooLarge, u.Group, e.GetIndex(), len(e.Data))
		}
	}
	return nil
}

// CreateSnapshot durably records snap's metadata and Data as the group's
// latest snapshot and drops the entries <= compactTo (which must not exceed
// snap's index; 0 keeps the log). The snapshot's term is taken from the log.
// A snapshot not newer than the group's current one (e.g. a snapshot from the
// leader was saved meanwhile) is ignored: nil, nothing written.
func (w *WAL) CreateSnapshot(group uint64, snap *pb.Snapshot, compactTo uint64) error {
	return w.enqueue(func(b *batch) error {
		g := w.groups[group]
		if g == nil {
			return fmt.Errorf("%w: %d", ErrUnknownGroup, group)
		}
		md := snap.GetMetadata()
		idx := md.GetIndex()
		switch {
		case idx <= g.snapIndex() || idx < g.compactIndex:
			return errIgnore
		case idx > g.lastIndex():
			return fmt.Errorf("%w: group %d: %d > %d", ErrSnapshotBeyondLog, group, idx, g.lastIndex())
		case compactTo > idx:
			return fmt.Errorf("%w: group %d: %d > %d", ErrCompactBeyondSnapshot, group, compactTo, idx)
		}
		compactTo = max(compactTo, g.compactIndex)
		sr := &snapRecord{
			group: group, index: idx, term: g.term(idx),
			compactIndex: compactTo, compactTerm: g.term(compactTo),
			conf: md.GetConfState(), data: snap.GetData(),
		}
		b.ops = append(b.ops, op{kind: recSnapshot, group: group, start: len(b.buf), snap: sr})
		b.buf = appendSnapshot(b.buf, sr)
		b.sync = true
		return nil
	}, nil)
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

// committer is the one goroutine that writes and syncs. It owns the active
// segment's write offset between taking a batch and applying it.
func (w *WAL) committer() {
	defer close(w.stopped)
	for {
		select {
		case <-w.kick:
			w.commitPending()
		case <-w.quit:
			// Close set w.closed first, so nothing is enqueued any more;
			// finish what is queued, then fail nothing: no batch is left.
			w.commitPending()
			return
		}
	}
}

// commitPending takes the pending batch, if any, writes and syncs it, applies
// it to the in-memory state and releases its waiters.
func (w *WAL) commitPending() {
	w.mu.Lock()
	b := w.pending
	if len(b.ops) == 0 && len(b.dones) == 0 {
		w.mu.Unlock()
		return
	}
	next := w.spare
	next.buf, next.ops, next.saves, next.sync = next.buf[:0], next.ops[:0], 0, false
	next.refs = next.refs[:0]
	next.dones = next.dones[:0]
	next.res = newResult()
	w.pending = next
	failed := w.err
	w.mu.Unlock()

	err := failed
	if err == nil && len(b.ops) > 0 { // else only SaveAsync callbacks, to call in order
		err = w.commit(b)
	}

	var doomed []*segment
	w.mu.Lock()
	switch {
	case failed != nil:
		b.res.err = failed
	case err != nil:
		w.err = fmt.Errorf("%w: %w", ErrFailed, err)
		w.log.Error("wal: write failed; refusing further writes", "err", err)
		b.res.err = w.err
	default:
		w.applyLocked(b)
		doomed = w.detachSegmentsLocked()
	}
	w.mu.Unlock()
	close(b.res.done)
	for _, done := range b.dones {
		done(b.res.err)
	}
	clear(b.dones)
	if doomed != nil {
		w.deleteSegments(doomed)
	}
	if err == nil {
		w.maybePrepareSpare()
	}
	for i := range b.ops {
		b.ops[i] = op{} // drop references to the callers' entries
	}
	clear(b.refs)
	if cap(b.buf) > maxKeptBuffer {
		b.buf = nil // a huge batch: do not keep its buffer for ever
	}
	w.mu.Lock()
	w.spare = b
	w.mu.Unlock()
	if failed == nil && err != nil {
		// Waiters that queued meanwhile must not wait for a kick.
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// commit writes b into the active segment (rolling over first if it does not
// fit) and syncs it.
func (w *WAL) commit(b *batch) error {
	w.mu.Lock()
	active := w.segs[len(w.segs)-1]
	off := w.writeOff
	w.mu.Unlock()
	if off+int64(len(b.buf)) > w.cfg.SegmentSize && off > segHeaderSize {
		if w.unsynced {
			// A segment is complete and durable before the next one exists:
			// recovery reads a torn tail only in the last segment.
			if err := unix.Fdatasync(int(active.f.Fd())); err != nil {
				return err
			}
			w.unsynced = false
		}
		var err error
		if active, off, err = w.rollover(active, int64(len(b.buf))); err != nil {
			return err
		}
	}
	sealRecords(b.buf, active.seq)
	wstart := time.Now()
	if err := w.writePages(active, off, b.buf, b.refs); err != nil {
		return err
	}
	wdone := time.Now()
	if w.knobs.AfterWrite != nil {
		w.knobs.AfterWrite()
	}
	if !b.sync {
		// Only NoSync updates (commit-index HardStates): written, not synced.
		if w.cfg.OnCommit != nil {
			w.cfg.OnCommit(wdone.Sub(wstart), 0, len(b.buf))
		}
		w.unsynced = true
		w.mu.Lock()
		w.writeOff = off + int64(len(b.buf))
		w.stats.UnsyncedWrites++
		w.stats.Saves += uint64(b.saves)
		w.stats.Bytes += uint64(len(b.buf))
		w.mu.Unlock()
		return nil
	}
	if w.knobs.BeforeSync != nil {
		if err := w.knobs.BeforeSync(); err != nil {
			return err
		}
	}
	start := time.Now()
	if w.knobs.SyncDelay > 0 {
		time.Sleep(w.knobs.SyncDelay)
	}
	if err := unix.Fdatasync(int(active.f.Fd())); err != nil {
		return err
	}
	lat := time.Since(start)
	w.unsynced = false
	if w.knobs.AfterSync != nil {
		w.knobs.AfterSync()
	}
	if w.cfg.OnCommit != nil {
		w.cfg.OnCommit(wdone.Sub(wstart), lat, len(b.buf))
	}
	w.mu.Lock()
	w.writeOff = off + int64(len(b.buf))
	w.stats.Syncs++
	w.stats.Saves += uint64(b.saves)
	w.stats.Bytes += uint64(len(b.buf))
	w.stats.SyncTime += lat
	w.stats.MaxSyncTime = max(w.stats.MaxSyncTime, lat)
	w.stats.MaxBatchSaves = max(w.stats.MaxBatchSaves, b.saves)
	w.mu.Unlock()
	return nil
}

// writePages writes buf (its gaps filled from refs) at off in s as whole
// pages: it writes the start of off's page again (the same bytes, so a torn
// write cannot damage them) and pads the end with zeros. A write of whole
// pages never makes the kernel read a page in first, which every append into
// an uncached page would cost (the pages of a preallocated or recycled segment
// are not in the page cache).
func (w *WAL) writePages(s *segment, off int64, buf []byte, refs []dataRef) error {
	head := w.tailPage
	if int64(len(head)) != off-roundDown(off) {
		panic(fmt.Sprintf("wal: tail page holds %d bytes at offset %d", len(head), off))
	}
	end := off + int64(len(buf))
	tn := int(end - roundDown(end))
	if tn <= len(buf) {
		fillRefs(buf, refs, len(buf)-tn) // the next write's head comes from buf
	}
	iov := append(w.iov[:0], head)
	if len(refs) < maxIOV/2-2 {
		iov = batchIOV(iov, buf, refs)
	} else {
		fillRefs(buf, refs, 0)
		iov = append(iov, buf)
	}
	iov = append(iov, zeroPage[:roundUp(end)-end])
	w.iov = iov
	defer clear(iov) // keep no references to the entries
	written := false
	var err error
	if len(buf) >= directMinBytes {
		written, err = w.direct.write(s, off-int64(len(head)), iov)
	}
	if !written {
		err = pwritevFull(int(s.f.Fd()), iov, off-int64(len(head)))
	}
	if err != nil {
		return err
	}
	if tn <= len(buf) {
		w.tailPage = append(head[:0], buf[len(buf)-tn:]...)
	} else {
		w.tailPage = append(head, buf...)
	}
	return nil
}

// maxIOV is the most pieces one pwritev takes (IOV_MAX).
const maxIOV = 1024

// pwritevFull writes all of iov at off.
func pwritevFull(fd int, iov [][]byte, off int64) error {
	for len(iov) > 0 {
		n, err := unix.Pwritev(fd, iov, off)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		for len(iov) > 0 && n >= len(iov[0]) {
			n -= len(iov[0])
			iov = iov[1:]
		}
		if len(iov) > 0 {
			iov[0] = iov[0][n:]
		}
	}
	return nil
}

// loadTail reads s's bytes from the page boundary before off up to off into
// tailPage (Open; createSegment sets it for a new segment).
func (w *WAL) loadTail(s *segment, off int64) error {
	start := roundDown(off)
	w.tailPage = append(w.tailPage[:0], make([]byte, off-start)...)
	if _, err := s.f.ReadAt(w.tailPage, start); err != nil {
		return fmt.Errorf("wal: read the last page of %s: %w", s.path, err)
	}
	return nil
}

// rollover creates the next segment. It starts with a checkpoint: the
// HardState and snapshot record of every group with state, as of the batches
// applied so far (the committer is the only writer, so that is the durable
// state), so that older segments hold nothing but entries once compacted.
func (w *WAL) rollover(active *segment, need int64) (*segment, int64, error) {
	w.mu.Lock()
	var ckpt []byte
	ids := make([]uint64, 0, len(w.groups))
	for id, g := range w.groups {
		if g.hasState() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		g := w.groups[id]
		ckpt = appendSnapshot(ckpt, g.snapRecord())
		if g.hsSet {
			ckpt = appendHardState(ckpt, id, g.hs)
		}
	}
	w.mu.Unlock()
	s, err := w.createSegment(active.seq+1, ckpt, segHeaderSize+int64(len(ckpt))+need)
	if err != nil {
		return nil, 0, err
	}
	w.direct.closeFd() // the old segment's: do not keep a removed file's blocks

	off := int64(segHeaderSize + len(ckpt))
	w.mu.Lock()
	w.segs = append(w.segs, s)
	w.writeOff = off
	w.stats.Rollovers++
	w.mu.Unlock()
	w.log.Debug("wal: new segment", "segment", s.path, "checkpoint_groups", len(ids))
	return s, off, nil
}

// applyLocked applies a durable batch to the in-memory state.
func (w *WAL) applyLocked(b *batch) {
	s := w.segs[len(w.segs)-1]
	base := w.writeOff - int64(len(b.buf))
	cache := w.cfg.CacheBytes
	for i := range b.ops {
		o := &b.ops[i]
		switch o.kind {
		case recEntries:
			g := w.groupLocked(o.group)
			first := o.ents[0].GetIndex()
			skip := g.prepareAppend(first)
			off := base + int64(o.start) + recHeaderSize + entriesHeadSize
			for j, e := range o.ents {
				off += entryHeadSize
				if uint64(j) >= skip {
					loc := entryLoc{term: e.GetTerm(), seg: s.seq, off: off, size: uint32(len(e.Data)),
						typ: e.GetType(), hasData: e.Data != nil}
					g.appendLoc(loc, e, cache)
				}
				off += int64(len(e.Data))
			}
			if last := first + uint64(len(o.ents)) - 1; last > s.maxIdx[o.group] {
				s.maxIdx[o.group] = last
			}
			w.stats.Entries += uint64(len(o.ents))
		case recHardState:
			g := w.groupLocked(o.group)
			g.hs, g.hsSet = o.hs, true
		case recSnapshot:
			w.groupLocked(o.snap.group).applySnapshot(o.snap)
		case recGroupRemoved:
			w.dropGroupLocked(o.group)
		}
	}
}

// segmentLiveLocked reports whether some group still needs entries in s.
func (w *WAL) pinnersLocked(s *segment) []uint64 {
	var ids []uint64
	for id, maxIdx := range s.maxIdx {
		if g := w.groups[id]; g != nil && g.compactIndex < maxIdx {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// pinnedLocked is len(pinnersLocked(s)) > 0 without the allocation and sort:
// the committer asks it after every batch.
func (w *WAL) pinnedLocked(s *segment) bool {
	for id, maxIdx := range s.maxIdx {
		if g := w.groups[id]; g != nil && g.compactIndex < maxIdx {
			return true
		}
	}
	return false
}

// detachSegmentsLocked takes the oldest segments whose entries every group
// has compacted out of w.segs and returns them for deleteSegments. The
// active segment is never detached.
//
// INVARIANT: every segment starts with a checkpoint of each group's latest
// HardState and snapshot record as of its creation, and every later change
// is in it or a newer segment; so a segment whose entries are all compacted
// holds nothing that replay of the newer segments needs.
func (w *WAL) detachSegmentsLocked() []*segment {
	n := 0
	for n < len(w.segs)-1 && !w.pinnedLocked(w.segs[n]) {
		n++
	}
	if n == 0 {
		return nil
	}
	doomed := slices.Clone(w.segs[:n])
	w.segs = w.segs[n:]
	w.stats.SegmentsRemoved += uint64(n)
	return doomed
}

// maxRecycled bounds the removed segment files kept for reuse.
const maxRecycled = 4

// deleteSegments unlinks detached segments, oldest first, then syncs the
// directory. It runs without w.mu: a reader that still holds a location in
// one of them gets a read error and finds the entry compacted. A segment
// that cannot be unlinked is only logged: replaying it again is harmless.
//
// Up to maxRecycled full-size files are renamed to "<name>.recycle.tmp"
// instead and reused for a later segment (prepareSpare): their blocks are
// written already, so the new segment needs no zero-fill — which would
// double the WAL's disk writes and cost a core's worth of copying under
// sequential writes. Their old records carry another segment's tag and
// read as the end of the log. Open deletes leftovers (.tmp).
func (w *WAL) deleteSegments(doomed []*segment) {
	for _, s := range doomed {
		s.f.Close()
		if w.recycle(s) {
			continue
		}
		if err := os.Remove(s.path); err != nil {
			w.log.Error("wal: remove segment", "segment", s.path, "err", err)
		}
	}
	if err := syncDir(w.dir); err != nil {
		w.log.Error("wal: sync dir after removing segments", "err", err)
	}
	w.log.Debug("wal: segments removed", "count", len(doomed), "first", doomed[0].path)
}

// recycle keeps the removed segment s for reuse if there is room.
func (w *WAL) recycle(s *segment) bool {
	w.mu.Lock()
	room := !w.closed && len(w.recycled) < maxRecycled
	w.mu.Unlock()
	if fi, err := os.Stat(s.path); !room || err != nil || fi.Size() != w.cfg.SegmentSize {
		return false
	}
	path := s.path + ".recycle.tmp"
	if err := os.Rename(s.path, path); err != nil {
		return false
	}
	w.mu.Lock()
	w.recycled = append(w.recycled, path)
	w.mu.Unlock()
	return true
}

// reuseRecycled returns a recycled file opened for writing, or nil if
// there is none (or it cannot be used; it is then removed).
func (w *WAL) reuseRecycled() (*os.File, string) {
	w.mu.Lock()
	if len(w.recycled) == 0 {
		w.mu.Unlock()
		return nil, ""
	}
	path := w.recycled[0]
	w.recycled = w.recycled[1:]
	w.mu.Unlock()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err == nil {
		if fi, serr := f.Stat(); serr == nil && fi.Size() == w.cfg.SegmentSize {
			return f, path
		}
		f.Close()
	}
	os.Remove(path)
	return nil, ""
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

// PinningGroups returns the groups whose uncompacted entries keep the oldest
// segment alive (none while only the active segment exists). The host makes
// them snapshot.
func (w *WAL) PinningGroups() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.segs) < 2 {
		return nil
	}
	return w.pinnersLocked(w.segs[0])
}

// PinningIndexes returns, for each group that keeps the oldest segment
// alive, the index it must compact to (CreateSnapshot's compactTo) to release
// it. A host whose snapshot policy keeps a tail of entries for slow followers
// uses this to compact an idle group far enough.
func (w *WAL) PinningIndexes() map[uint64]uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	pins := make(map[uint64]uint64)
	if len(w.segs) < 2 {
		return pins
	}
	oldest := w.segs[0]
	for _, id := range w.pinnersLocked(oldest) {
		pins[id] = oldest.maxIdx[id]
	}
	return pins
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
