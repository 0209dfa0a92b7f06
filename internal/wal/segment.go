package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/basalt-storage/basalt/internal/fsdir"
	"golang.org/x/sys/unix"
)

// segment is one log file. seq, path and f are immutable; maxIdx is guarded
// by WAL.mu.
type segment struct {
	seq     uint64
	version uint32 // its format version (segVersion unless an older release wrote it)
	path    string
	f       *os.File
	// maxIdx: per group, the highest entry index written to this segment.
	maxIdx map[uint64]uint64
}

func segmentName(seq uint64) string { return fmt.Sprintf("%016x.wal", seq) }

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
	sealRecords(hdr[segHeaderSize:], nil, seq)
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
	return &segment{seq: seq, version: segVersion, path: path, f: f, maxIdx: make(map[uint64]uint64)}, nil
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

// syncDir makes the WAL directory's entries (segments created, renamed or
// removed) durable.
func syncDir(dir string) error {
	if err := fsdir.Sync(dir); err != nil {
		return fmt.Errorf("wal: %w", err)
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
