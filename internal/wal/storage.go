package wal

import (
	"errors"
	"fmt"
	"io"
	"os"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// groupStorage is the raft.Storage of one group. It looks the group up on
// every call, so it stays valid across RemoveGroup (then it reads as empty).
type groupStorage struct {
	w  *WAL
	id uint64
}

var _ raft.Storage = groupStorage{}

// Storage returns the raft.Storage view of a group, creating an empty group
// (in memory only, until something is saved for it) if it is unknown.
func (w *WAL) Storage(group uint64) raft.Storage {
	w.mu.Lock()
	w.groupLocked(group)
	w.mu.Unlock()
	return groupStorage{w: w, id: group}
}

// emptyGroup stands in for a group that was removed after its Storage was
// handed out.
var emptyGroup = newGroup(0)

func (s groupStorage) lock() *group {
	s.w.mu.Lock()
	if g := s.w.groups[s.id]; g != nil {
		return g
	}
	return emptyGroup
}

func (s groupStorage) unlock() { s.w.mu.Unlock() }

// InitialState implements raft.Storage: the latest HardState (nil if none was
// saved) and the ConfState of the latest snapshot.
func (s groupStorage) InitialState() (*pb.HardState, *pb.ConfState, error) {
	g := s.lock()
	defer s.unlock()
	var hs *pb.HardState
	if g.hsSet {
		hs = &pb.HardState{Term: new(g.hs.term), Vote: new(g.hs.vote), Commit: new(g.hs.commit)}
	}
	cs := proto.Clone(pb.EnsureConfState(g.snap.GetMetadata().GetConfState())).(*pb.ConfState)
	return hs, pb.EnsureConfState(cs), nil
}

// FirstIndex implements raft.Storage.
func (s groupStorage) FirstIndex() (uint64, error) {
	g := s.lock()
	defer s.unlock()
	return g.firstIndex(), nil
}

// LastIndex implements raft.Storage.
func (s groupStorage) LastIndex() (uint64, error) {
	g := s.lock()
	defer s.unlock()
	return g.lastIndex(), nil
}

// Term implements raft.Storage.
func (s groupStorage) Term(i uint64) (uint64, error) {
	g := s.lock()
	defer s.unlock()
	switch {
	case i < g.compactIndex:
		return 0, raft.ErrCompacted
	case i > g.lastIndex():
		return 0, raft.ErrUnavailable
	}
	return g.term(i), nil
}

// Snapshot implements raft.Storage: the latest snapshot, metadata and Data.
func (s groupStorage) Snapshot() (*pb.Snapshot, error) {
	g := s.lock()
	defer s.unlock()
	return proto.Clone(g.snap).(*pb.Snapshot), nil
}

// Entries implements raft.Storage. Entries still in the cache are returned
// as they were saved (shared, never to be mutated); older ones are read back
// from their segment with pread.
func (s groupStorage) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	g := s.lock()
	switch {
	case lo <= g.compactIndex:
		s.unlock()
		return nil, raft.ErrCompacted
	case hi > g.lastIndex()+1 || len(g.ents) == 0:
		s.unlock()
		return nil, raft.ErrUnavailable
	}
	if hi <= lo {
		s.unlock()
		return nil, nil
	}
	// Collect under the lock: cached entries, and the locations of the rest.
	// Entries are immutable once written, so a location stays readable
	// until its segment is removed (after compaction past it).
	out := make([]*pb.Entry, 0, min(hi-lo, 1024))
	var locs []entryLoc // parallel to out where out[i] == nil
	var size uint64
	for i := lo; i < hi; i++ {
		e := g.cached(i)
		loc := g.ents[i-g.compactIndex-1]
		var n uint64
		if e != nil {
			n = uint64(proto.Size(e))
		} else {
			n = entrySize(i, loc)
		}
		if len(out) > 0 && size+n > maxSize {
			break
		}
		size += n
		out = append(out, e)
		if e == nil {
			if locs == nil {
				locs = make([]entryLoc, len(out)-1, cap(out))
			}
			locs = append(locs, loc)
		} else if locs != nil {
			locs = append(locs, entryLoc{})
		}
	}
	// Elements of w.segs are never changed in place, so a copy of the
	// slice header stays valid after the lock is released.
	segs := s.w.segs
	s.unlock()
	if locs == nil {
		return out, nil
	}
	for i := range out {
		if out[i] != nil {
			continue
		}
		e, err := readEntry(segs, lo+uint64(i), locs[i])
		if err != nil {
			// The segment may have been removed after a compaction
			// that raced with this read.
			g := s.lock()
			compacted := lo+uint64(i) <= g.compactIndex
			s.unlock()
			if compacted {
				return nil, raft.ErrCompacted
			}
			return nil, err
		}
		out[i] = e
	}
	return out, nil
}

// entrySize is proto.Size of the entry that readEntry builds from loc.
func entrySize(index uint64, loc entryLoc) uint64 {
	n := 1 + varintLen(loc.term) + 1 + varintLen(index) + 1 + varintLen(uint64(loc.typ))
	if loc.hasData {
		n += 1 + varintLen(uint64(loc.size)) + uint64(loc.size)
	}
	return n
}

func varintLen(v uint64) uint64 {
	n := uint64(1)
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func readEntry(segs []*segment, index uint64, loc entryLoc) (*pb.Entry, error) {
	var seg *segment
	if len(segs) > 0 && loc.seg >= segs[0].seq && loc.seg-segs[0].seq < uint64(len(segs)) {
		seg = segs[loc.seg-segs[0].seq]
	}
	if seg == nil {
		return nil, fmt.Errorf("wal: entry %d: segment %d gone", index, loc.seg)
	}
	e := &pb.Entry{Term: new(loc.term), Index: new(index), Type: new(loc.typ)}
	if loc.hasData {
		e.Data = make([]byte, loc.size)
	}
	if loc.size > 0 {
		if _, err := seg.f.ReadAt(e.Data, loc.off); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
				return nil, fmt.Errorf("wal: entry %d: %w", index, err)
			}
			return nil, fmt.Errorf("wal: read entry %d: %w", index, err)
		}
	}
	return e, nil
}
