package wal

import (
	"google.golang.org/protobuf/proto"

	pb "go.etcd.io/raft/v3/raftpb"
)

// entryLoc is the in-memory index record of one log entry: its term and type,
// and where its data lies on disk.
type entryLoc struct {
	term uint64
	seg  uint64 // segment sequence number
	off  int64  // file offset of the entry's data
	size uint32 // data length
	typ  pb.EntryType
	// hasData: Data was non-nil (possibly empty).
	hasData bool
}

// group is the in-memory state of one Raft group. All fields are guarded by
// WAL.mu.
//
// INVARIANT: ents[i] is the entry at index compactIndex+1+i; the log is
// (compactIndex, compactIndex+len(ents)].
// INVARIANT: if len(cache) > 0, cache[i] is the entry at cacheFirst+i and the
// cache ends at the last index (it is a suffix of the log).
// INVARIANT: cacheBytes is the sum of len(Data) over cache.
type group struct {
	id uint64

	hs    hardState
	hsSet bool

	snap *pb.Snapshot // latest snapshot (metadata + Data); never nil

	compactIndex uint64
	compactTerm  uint64
	ents         []entryLoc

	// gap is set only while replaying: entries before compactIndex+1 were
	// seen missing; a later compaction must cover them or Open fails.
	gap bool

	cache      []*pb.Entry
	cacheFirst uint64
	cacheBytes int
	// applied is the host's applied index (SetApplied): cached entries after
	// it stay beyond the cache limit.
	applied uint64

	// queuedLast is the last index once the records encoded for the group
	// and not yet durable are (SaveAsync lets a group have several batches in
	// flight); set by the first Save, it is what the next Save must follow.
	queuedLast uint64
	queued     bool
}

func newGroup(id uint64) *group {
	return &group{id: id, snap: pb.EnsureSnapshot(nil)}
}

func (g *group) firstIndex() uint64 { return g.compactIndex + 1 }
func (g *group) lastIndex() uint64  { return g.compactIndex + uint64(len(g.ents)) }
func (g *group) snapIndex() uint64  { return g.snap.GetMetadata().GetIndex() }

// nextAfter is the index the group's next Save appends after: the durable
// last index, or the last one queued before it.
func (g *group) nextAfter() uint64 {
	if g.queued {
		return g.queuedLast
	}
	return g.lastIndex()
}

// hasState reports whether the group has anything durable to restate in a
// segment checkpoint.
func (g *group) hasState() bool { return g.hsSet || g.snapIndex() > 0 || g.compactIndex > 0 }

// term returns the term of entry i, which must be in [compactIndex, last].
func (g *group) term(i uint64) uint64 {
	if i == g.compactIndex {
		return g.compactTerm
	}
	return g.ents[i-g.compactIndex-1].term
}

// prepareAppend makes room for entries starting at first: it truncates the
// suffix from first on, or (replay only) opens a gap. It returns how many of
// the new entries to skip because they are already compacted.
func (g *group) prepareAppend(first uint64) (skip uint64) {
	if first <= g.compactIndex {
		skip = g.compactIndex + 1 - first
		first = g.compactIndex + 1
	}
	last := g.lastIndex()
	switch {
	case first <= last:
		g.ents = g.ents[:first-g.compactIndex-1]
		g.truncateCache(first)
	case first > last+1:
		// Replay only (Save validates): older records of this group were in
		// segments removed after compaction. Restart the log at first; a
		// later snapshot record must cover the hole.
		g.ents = g.ents[:0]
		g.compactIndex = first - 1
		g.compactTerm = 0
		g.gap = true
		g.dropCache()
	}
	return skip
}

// appendLoc appends one entry's index record; e (may be nil) is the entry
// itself, kept in the cache.
func (g *group) appendLoc(loc entryLoc, e *pb.Entry, cacheLimit int) {
	g.ents = append(g.ents, loc)
	if e == nil || cacheLimit <= 0 {
		g.dropCache()
		return
	}
	if len(g.cache) == 0 {
		g.cacheFirst = g.lastIndex()
	}
	g.cache = append(g.cache, e)
	g.cacheBytes += len(e.Data)
	g.trimCache(cacheLimit)
}

// unappliedCacheFactor: entries not applied yet are cached up to this many
// times the cache limit (an apply far behind must not hold memory for ever).
const unappliedCacheFactor = 32

// trimCache drops the oldest cached entries while the cache holds more than
// limit bytes of applied entries, or more than unappliedCacheFactor × limit in
// all. Raft reads each entry back once more to apply it (and a leader to send
// it to a follower whose append lags), so keeping the entries in flight saves
// a pread and an allocation of each, which at 256 KiB per entry counts.
func (g *group) trimCache(limit int) {
	for len(g.cache) > 1 && (g.cacheBytes > limit && g.cacheFirst <= g.applied ||
		g.cacheBytes > unappliedCacheFactor*limit) {
		g.popCache()
	}
}

func (g *group) popCache() {
	g.cacheBytes -= len(g.cache[0].Data)
	g.cache[0] = nil
	g.cache = g.cache[1:]
	g.cacheFirst++
	if len(g.cache) < cap(g.cache)/4 && cap(g.cache) > 256 {
		g.cache = append([]*pb.Entry(nil), g.cache...)
	}
}

func (g *group) dropCache() {
	g.cache = nil
	g.cacheBytes = 0
}

// truncateCache drops cached entries at index >= i.
func (g *group) truncateCache(i uint64) {
	if len(g.cache) == 0 {
		return
	}
	if i <= g.cacheFirst {
		g.dropCache()
		return
	}
	for j := i - g.cacheFirst; j < uint64(len(g.cache)); j++ {
		g.cacheBytes -= len(g.cache[j].Data)
		g.cache[j] = nil
	}
	if n := i - g.cacheFirst; n < uint64(len(g.cache)) {
		g.cache = g.cache[:n]
	}
}

// cached returns entry i from the cache, or nil.
func (g *group) cached(i uint64) *pb.Entry {
	if len(g.cache) == 0 || i < g.cacheFirst || i >= g.cacheFirst+uint64(len(g.cache)) {
		return nil
	}
	return g.cache[i-g.cacheFirst]
}

// compact drops entries <= to; to must be <= lastIndex, or the log becomes
// empty at to (replay of a compaction past entries in removed segments).
func (g *group) compact(to, toTerm uint64) {
	if to <= g.compactIndex && !g.gap {
		return
	}
	if to < g.compactIndex {
		return // a gap that this compaction does not cover
	}
	if to >= g.lastIndex() {
		g.ents = g.ents[:0]
		if cap(g.ents) > 1024 {
			g.ents = nil
		}
		g.dropCache()
	} else {
		n := to - g.compactIndex
		g.ents = g.ents[n:]
		if len(g.ents) < cap(g.ents)/4 && cap(g.ents) > 1024 {
			g.ents = append([]entryLoc(nil), g.ents...)
		}
		for len(g.cache) > 0 && g.cacheFirst <= to {
			g.popCache()
		}
	}
	g.compactIndex = to
	g.compactTerm = toTerm
	g.gap = false
}

// applySnapshot applies a snapshot record (live or replayed).
func (g *group) applySnapshot(s *snapRecord) {
	if s.index >= g.snapIndex() {
		g.snap = &pb.Snapshot{
			Data: s.data,
			Metadata: &pb.SnapshotMetadata{
				ConfState: pb.EnsureConfState(proto.Clone(pb.EnsureConfState(s.conf)).(*pb.ConfState)),
				Index:     new(s.index),
				Term:      new(s.term),
			},
		}
	}
	if s.flags&snapFlagReset != 0 {
		g.ents = g.ents[:0]
		g.dropCache()
		g.compactIndex = s.compactIndex
		g.compactTerm = s.compactTerm
		g.gap = false
		return
	}
	g.compact(s.compactIndex, s.compactTerm)
}

// snapRecord returns the record that restates the group's snapshot and
// compaction point (never a reset: entries after it stay).
func (g *group) snapRecord() *snapRecord {
	md := g.snap.GetMetadata()
	return &snapRecord{
		group:        g.id,
		index:        md.GetIndex(),
		term:         md.GetTerm(),
		compactIndex: g.compactIndex,
		compactTerm:  g.compactTerm,
		conf:         md.GetConfState(),
		data:         g.snap.GetData(),
	}
}
