package wal

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	pb "go.etcd.io/raft/v3/raftpb"
)

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
		w.writeOff, w.synced = segHeaderSize, segHeaderSize
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
			// What was read may still be only in the page cache (a process
			// crash keeps it there): sync it before the next batch's mark
			// says it is durable.
			if err := f.Sync(); err != nil {
				return fmt.Errorf("wal: %w", err)
			}
			w.synced = end
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
	// Batches go to segments of the current format only: an older release's
	// last segment is closed with a rollover before anything is appended.
	if s := w.segs[len(w.segs)-1]; s.version < segVersion {
		s2, off, err := w.rollover(s, 0)
		if err != nil {
			return err
		}
		w.synced = off
		w.log.Info("wal: continuing in a new segment of the current format",
			"segment", s2.path, "old_version", s.version, "version", segVersion)
	}
	w.log.Info("wal: opened", "dir", w.dir, "segments", len(w.segs), "groups", len(w.groups))
	return nil
}

// replaySegment reads one segment and applies its records. It returns the
// offset after the last good record. Where the records end before the
// segment does, it decides between a torn tail and corruption (see doc.go,
// Open and repair): a torn tail of the last segment is cut off; damage to
// data that was durable is ErrCorrupt, and the file is left as it is.
func (w *WAL) replaySegment(s *segment, last bool) (int64, error) {
	b, err := os.ReadFile(s.path)
	if err != nil {
		return 0, fmt.Errorf("wal: %w", err)
	}
	if len(b) < segHeaderSize || string(b[:4]) != segMagic || le.Uint64(b[8:]) != s.seq {
		return 0, fmt.Errorf("%w: %s: bad segment header", ErrCorrupt, s.path)
	}
	s.version = le.Uint32(b[4:])
	if s.version < minSegVersion || s.version > segVersion {
		return 0, fmt.Errorf("%w: %s: segment format version %d, this build reads versions %d to %d "+
			"(written by another basalt release: start that release, or move the data directory aside)",
			ErrVersion, s.path, s.version, minSegVersion, segVersion)
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
		bad := st == recBad && len(b)-off >= recHeaderSize
		if s.version >= markSegVersion && (bad || !allZero(b[off:])) {
			// A record (or its length or tag) damaged at off reads as the end
			// of the records too; a later batch proves off was durable.
			if at, mark, ok := durableMarkAfter(b, off, tag); ok {
				return 0, fmt.Errorf("%w: %s: bad record at offset %d, but the batch at offset %d "+
					"was written when the segment was durable up to offset %d: data that was "+
					"fdatasynced (acknowledged) is damaged", ErrCorrupt, s.path, off, at, mark)
			}
		}
		if bad {
			if !last {
				return 0, fmt.Errorf("%w: %s: bad record at offset %d", ErrCorrupt, s.path, off)
			}
			w.log.Warn("wal: torn tail cut off: a batch that was never fdatasynced, lost in a crash",
				"segment", s.path, "offset", off, "dropped_bytes", len(b)-off)
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

// durableMarkAfter looks for a readable batch record of the segment (tag)
// after offset from whose mark is beyond from: proof that the segment was
// durable past from when that batch was written. It returns the record's
// offset and its mark. Records after damage cannot be walked (a length may be
// what is damaged), so it searches for the tag and type bytes a batch record
// starts its payload with and checks each candidate's length and CRC.
func durableMarkAfter(b []byte, from int, tag uint32) (at int, mark int64, ok bool) {
	var pat [5]byte
	le.PutUint32(pat[:], tag)
	pat[4] = recBatch
	for i := from + 1; i < len(b); {
		j := bytes.Index(b[i:], pat[:])
		if j < 0 {
			break
		}
		start := i + j - 8 // the record starts 8 bytes before its tag
		i += j + 1
		if start <= from {
			continue
		}
		if n, st := checkRecord(b[start:], tag); st != recOK || n != batchRecordSize-recHeaderSize {
			continue
		}
		if m := int64(le.Uint64(b[start+recHeaderSize+1:])); m > int64(from) {
			return start, m, true
		}
	}
	return 0, 0, false
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
			if et&entryPadded != 0 {
				d.bytes(int(d.u16()))
			}
			dataOff := off + recHeaderSize + d.off
			d.bytes(int(size))
			if d.err != nil {
				return d.err
			}
			if i < skip {
				continue
			}
			loc := entryLoc{term: term, seg: s.seq, off: int64(dataOff), size: size,
				typ: pb.EntryType(et &^ (entryHasData | entryPadded)), hasData: et&entryHasData != 0}
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
	case recPad:
		d.off = len(d.b)
	case recBatch:
		d.u64() // the mark matters only after damage (durableMarkAfter)
	default:
		return fmt.Errorf("%w: unknown record type %d", ErrCorrupt, typ)
	}
	if d.err == nil && d.off != len(d.b) {
		return fmt.Errorf("%w: %d trailing bytes in record", ErrCorrupt, len(d.b)-d.off)
	}
	return d.err
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
