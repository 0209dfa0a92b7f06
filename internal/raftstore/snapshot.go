package raftstore

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// errSuperseded: a snapshot from the leader was installed while ours was pending.
var errSuperseded = errors.New("raftstore: snapshot superseded by an installed one")

// snapMode says why a snapshot is taken and how far it compacts.
type snapMode int

const (
	snapAuto    snapMode = iota // SnapshotEntries applied since the last: keep CatchUpEntries
	snapForPeer                 // a peer needs a snapshot that includes it: keep CatchUpEntries
	snapRelease                 // Host.Snapshot: compact every applied entry (free WAL segments)
)

// maybeSnapshot starts a snapshot at the applied index S when SnapshotEntries entries
// applied since the last one, or when mode asks for one. Capture runs here, on the
// worker, so the state is exactly as of S; Persist (the chunk syncs) and the log
// compaction run off the worker while applies go on.
func (g *group) maybeSnapshot(mode snapMode) {
	h := g.h
	if g.snapping || g.failed != nil || g.removed {
		return
	}
	if g.applied <= g.lastSnap {
		// Nothing applied since the last snapshot, whose compaction kept
		// CatchUpEntries: a release needs a newer index. The leader makes one
		// with an empty entry (a follower waits for the leader's next entry).
		if mode == snapRelease && g.isLeader && !g.noopProposed {
			g.noopProposed = g.rn.Propose(nil) == nil
		}
		return
	}
	if mode == snapAuto && g.applied-g.lastSnap < h.cfg.SnapshotEntries {
		return
	}
	s, term := g.applied, g.appliedTerm
	if term == 0 {
		t, err := g.st.Term(s)
		if err != nil {
			g.log.Warn("raftstore: snapshot: term of applied index unknown", "index", s, "err", err)
			return
		}
		term = t
	}
	cs := proto.Clone(g.confState).(*raftpb.ConfState)
	state := g.sm.Capture()
	// Keep CatchUpEntries below S for slow followers, and everything after a
	// snapshot still being streamed: its receiver continues from its index + 1.
	var compactTo uint64
	switch {
	case mode == snapRelease:
		compactTo = s
		g.releasePending = false
	case s > h.cfg.CatchUpEntries:
		compactTo = s - h.cfg.CatchUpEntries
	}
	for _, idx := range g.sending {
		compactTo = min(compactTo, idx)
	}
	// A follower that has just installed a long snapshot is behind by every
	// write made while it streamed: compacting past it sent it another
	// snapshot, and under steady writes another (a learner never caught up,
	// TestFollowerCatchesUpAfterSnapshot).
	compactTo = min(compactTo, g.catchUpFloor(mode == snapRelease))
	g.snapping = true
	snap := &raftpb.Snapshot{
		Data:     state,
		Metadata: &raftpb.SnapshotMetadata{Index: &s, Term: &term, ConfState: cs},
	}
	if !h.cfg.Manual {
		g.bg.Add(1)
	}
	h.goBackground(func() {
		if !h.cfg.Manual {
			defer g.bg.Done()
		}
		if g.gone.Load() {
			return
		}
		// Durability order: the chunks hold every effect up to S (Persist) before the
		// log below S may go.
		g.persistMu.Lock()
		var err error
		if g.installed.Load() >= s {
			err = errSuperseded
		} else if err = g.sm.Persist(s, state); err == nil {
			err = g.compact(snap, compactTo)
		}
		g.persistMu.Unlock()
		if g.in.add(func(in *events) { in.snapDone = append(in.snapDone, snapResult{index: s, term: term, err: err}) }) == nil {
			h.sched.signal(g)
		}
	})
}

// errStaleSnapshot: the log was compacted past a snapshot before its stream
// began; raft retries with the newer snapshot.
var errStaleSnapshot = errors.New("raftstore: the log was compacted past this snapshot before its stream began")

// compact writes snap to the log and compacts it to compactTo, but never past
// the snapshot of a stream under way: compactTo was chosen on the worker, and
// a stream may have started since, sending the snapshot before this one (its
// follower continues from that snapshot's index + 1).
func (g *group) compact(snap *raftpb.Snapshot, compactTo uint64) error {
	g.compactMu.Lock()
	defer g.compactMu.Unlock()
	for _, idx := range g.streams {
		compactTo = min(compactTo, idx)
	}
	return g.h.cfg.Log.CreateSnapshot(g.id, snap, compactTo)
}

// holdLog keeps the log after idx while the stream to follower to is under
// way (compact), or fails with errStaleSnapshot if a compaction that did not
// know of the stream already dropped idx+1: the follower would need another
// snapshot as soon as this one was installed — under steady writes with a
// snapshot always being written, every time (a learner never caught up).
func (g *group) holdLog(to, idx uint64) error {
	g.compactMu.Lock()
	defer g.compactMu.Unlock()
	first, err := g.st.FirstIndex()
	if err != nil {
		return err
	}
	if first > idx+1 {
		return errStaleSnapshot
	}
	g.streams[to] = idx
	return nil
}

// streamHold is a stream's hold on the log: its follower and snapshot index.
type streamHold struct{ to, idx uint64 }

// endStream forgets the stream to follower to, its report taken: from now
// on catchUpFloor keeps what the follower needs. Its hold on the log
// (holdLog) ends now or, while a snapshot is being written — its compaction
// may have been chosen before the stream began — once that one is done.
func (g *group) endStream(to uint64) {
	idx, ok := g.sending[to]
	if !ok {
		return
	}
	delete(g.sending, to)
	if g.snapping {
		g.unhold = append(g.unhold, streamHold{to, idx})
		return
	}
	g.releaseLog(streamHold{to, idx})
}

// releaseLog ends a stream's hold on the log (unless a newer stream to the
// same follower holds it now).
func (g *group) releaseLog(s streamHold) {
	g.compactMu.Lock()
	if g.streams[s.to] == s.idx {
		delete(g.streams, s.to)
	}
	g.compactMu.Unlock()
}

// snapshotDone runs on the worker when a snapshot started by maybeSnapshot ended.
func (g *group) snapshotDone(r snapResult) {
	g.snapping = false
	for _, u := range g.unhold {
		g.releaseLog(u)
	}
	g.unhold = nil
	if r.err == errSuperseded {
		return
	}
	if r.err != nil {
		// A disk error like a failed Apply's: the group stops. Never retried: a
		// second fsync may succeed after the kernel dropped the dirty pages the
		// first one could not write, and the log would then be compacted.
		g.h.stats.snapsFailed.Add(1)
		g.fail(fmt.Errorf("raftstore: snapshot %d: %w", r.index, r.err))
		return
	}
	g.h.stats.snapsCreated.Add(1)
	if r.index > g.lastSnap {
		g.lastSnap = r.index
	}
	g.statusDirty = true
	g.log.Debug("raftstore: snapshot created", "index", r.index, "term", r.term)
}

// outgoing appends msgs for the transport to dst. MsgSnap does not go through Send:
// its snapshot is streamed on its own goroutine (see sendSnapshot).
func (g *group) outgoing(dst []Message, msgs []*raftpb.Message) []Message {
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			g.sendSnapshot(m)
			continue
		}
		dst = append(dst, Message{Group: g.id, Msg: m})
	}
	return dst
}

// snapBusyBackoff is how long a stream the follower refused as busy waits
// before raft hears of it (and sends another).
const snapBusyBackoff = time.Second

// sendSnapshot streams the state machine's data with m to a follower and reports the
// outcome to raft. Until then the log after the snapshot's index is kept.
func (g *group) sendSnapshot(m *raftpb.Message) {
	h := g.h
	to := m.GetTo()
	md := m.GetSnapshot().GetMetadata()
	idx := md.GetIndex()
	if !inConfState(md.GetConfState(), to) {
		// The last snapshot predates the peer joining (a new learner): raft on the
		// peer would refuse it. Take a new one, which includes the peer (it joined
		// by an applied conf change), and let raft retry.
		g.log.Info("raftstore: snapshot predates peer; taking a new one", "to", to, "index", idx)
		g.maybeSnapshot(snapForPeer)
		if g.in.add(func(in *events) { in.snapReports = append(in.snapReports, snapReport{to: to, failed: true}) }) == nil {
			h.sched.signal(g)
		}
		return
	}
	g.sending[to] = idx
	// Why the peer needs one: the log no longer holds what follows what the
	// peer has (peer_match; peer_next as raft had it when the round began,
	// before sending a snapshot reset it).
	var match uint64
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == to {
			match = pr.Match
		}
	})
	first, _ := g.st.FirstIndex()
	g.log.Info("raftstore: streaming snapshot", "to", to, "index", idx,
		"peer_match", match, "peer_next", g.nextAtRound[to], "log_first", first)
	h.goBackground(func() {
		var err error
		if g.gone.Load() {
			err = ErrNoGroup
		} else if err = g.holdLog(to, idx); err == nil {
			err = h.cfg.Transport.SendSnapshot(Message{Group: g.id, Msg: m}, g.sm.WriteSnapshot)
		}
		switch {
		case errors.Is(err, ErrPeerBusy):
			// Raft would send the next MsgSnap at once, and be told so
			// again ten times a second while the follower receives another
			// (a former leader's) stream. Report after a pause.
			h.stats.snapsFailed.Add(1)
			g.log.Info("raftstore: snapshot stream refused: the follower is busy receiving another; retrying",
				"to", to, "index", idx, "after", snapBusyBackoff)
			if !h.cfg.Manual {
				select {
				case <-time.After(snapBusyBackoff):
				case <-h.stopc:
				}
			}
		case err != nil:
			h.stats.snapsFailed.Add(1)
			g.log.Warn("raftstore: snapshot stream failed", "to", to, "index", idx, "err", err)
		default:
			h.stats.snapsSent.Add(1)
		}
		if g.in.add(func(in *events) { in.snapReports = append(in.snapReports, snapReport{to: to, failed: err != nil}) }) == nil {
			h.sched.signal(g)
		}
	})
}

// releaseGrace is how long after a follower took a streamed snapshot the
// WAL's release still keeps what it needs, in election timeouts. The WAL asks
// for its space back while the stream holds the log; compacting everything
// the moment the snapshot was in, it left the follower needing another, and
// under steady writes and a throttled stream every time: a returning member
// never caught up (TestFollowerCatchesUpUnderRelease). The grace bounds how
// long the WAL stays over its size for one follower.
const releaseGrace = 30

// catchUpFloor is the highest index a leader may compact its log to without
// taking from a live follower (heard from within two election timeouts) the
// entries it still needs: those after its Match. A follower the log cannot
// catch up anyway (it needs entries already compacted: a snapshot will
// follow) holds nothing back, and neither does one not heard from lately —
// a dead or paused member must not pin the log. For a release (the WAL wants
// its space back) only a follower that took a snapshot in the last
// releaseGrace holds anything back.
func (g *group) catchUpFloor(release bool) uint64 {
	floor := uint64(math.MaxUint64)
	if !g.isLeader {
		return floor
	}
	first, err := g.st.FirstIndex()
	if err != nil {
		return floor
	}
	h := g.h
	election := time.Duration(h.cfg.ElectionTicks) * h.cfg.TickInterval
	now := h.now()
	for id, at := range g.streamedAt {
		if now-at > releaseGrace*election {
			delete(g.streamedAt, id)
		}
	}
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		at, ok := g.heard[id]
		if id == h.cfg.NodeID || !ok || now-at > 2*election {
			return
		}
		if _, recent := g.streamedAt[id]; release && !recent {
			return
		}
		has := pr.Match
		if pr.State == tracker.StateProbe && has+1 < first {
			// Probing from just after a snapshot it was sent, before its
			// answer told the leader so (raft sets Next past the snapshot).
			has = pr.Next - 1
		}
		if has+1 >= first {
			floor = min(floor, has)
		}
	})
	return floor
}

// noteNext records each follower's Next at the start of a leader's round
// (nextAtRound).
func (g *group) noteNext() {
	if g.nextAtRound == nil {
		g.nextAtRound = make(map[uint64]uint64)
	}
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		g.nextAtRound[id] = pr.Next
	})
}

func inConfState(cs *raftpb.ConfState, id uint64) bool {
	for _, set := range [][]uint64{cs.GetVoters(), cs.GetLearners(), cs.GetVotersOutgoing(), cs.GetLearnersNext()} {
		if slices.Contains(set, id) {
			return true
		}
	}
	return false
}
