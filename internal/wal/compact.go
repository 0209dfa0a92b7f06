package wal

import (
	"fmt"
	"os"
	"slices"

	pb "go.etcd.io/raft/v3/raftpb"
)

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

// pinnersLocked returns the groups that still need entries in s, sorted.
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

// maxRecycled bounds the removed segment files kept for reuse. Under
// sequential writes a compaction removes up to about as many segments as a
// chunkserver keeps before it forces one (8 by default); a file deleted then
// is a file zero-filled again later.
const maxRecycled = 8

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
