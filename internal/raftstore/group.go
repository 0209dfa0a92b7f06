package raftstore

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/wal"
)

// group is one raft group (copyset) on this host.
type group struct {
	id  uint64
	h   *Host
	sm  StateMachine
	log *slog.Logger
	in  inbox
	bg  sync.WaitGroup // snapshot creation goroutines (not used in manual mode)
	// gone is set once the group was removed or the host stopped; background tasks
	// check it before touching the state machine or the log.
	gone atomic.Bool

	// persistMu serializes a background Persist+CreateSnapshot with the worker
	// installing a received snapshot; installed is the last installed index.
	// INVARIANT: Persist never runs with an index below an installed snapshot's, so
	// Recover's index never goes back behind the log's snapshot.
	persistMu sync.Mutex
	installed atomic.Uint64

	// Scheduler state, guarded by Host.sched.mu (see scheduler).
	queued, processing, requeue bool

	statusMu sync.Mutex
	status   GroupStatus

	// procMu is held by the worker running a round over the group, and by shutdown.
	// Everything below is owned by its holder.
	procMu sync.Mutex
	rn     *raft.RawNode
	st     raft.Storage

	failed  error // non-nil: the group stopped (disk failure, raft panic); it never runs again
	removed bool

	// Screening of network messages (guard.go), with lastIndex below. hint:
	// the members the control plane lists (CreateGroup's peers, then
	// Host.SetMembers). applying: the proposal whose entry is being applied
	// (out of pending).
	applying    *proposal
	hint        []uint64
	lastDropLog time.Time
	dropsQuiet  int

	confState *raftpb.ConfState
	// savedTerm, savedVote: the HardState's term and vote as last handed to the log;
	// an append whose HardState changes neither (and has no entries or snapshot)
	// only moves the commit index and is saved without an fdatasync
	// (wal.Update.NoSync).
	savedTerm, savedVote uint64
	applied              uint64
	appliedTerm          uint64
	lastIndex            uint64 // of the last entry raft handed over to persist
	// skipApplyTo: after a restart, entries up to here already reached the state
	// machine durably (Recover); they are replayed for their conf changes only.
	skipApplyTo uint64

	leader, term uint64
	isLeader     bool
	// voteBlock counts ticks left during which vote requests are dropped: a restarted
	// node must not help elect a new leader while an old leader's lease may still run.
	voteBlock int

	// INVARIANT: every proposal accepted by raft is in exactly one of unindexed
	// (accepted this round, before the Ready told its index) or pending (by index),
	// until its done ran. Both are emptied with ErrNotLeader when leadership is lost.
	unindexed []*proposal
	pending   map[uint64]*proposal

	// Reads. INVARIANT: a read is in exactly one of readIdx (waiting for a quorum to
	// confirm leadership) or waiting (waiting for applied >= index) until done ran.
	readIdx    map[uint64]*readIndexReq
	waiting    []*readReq
	leaseUntil time.Duration // host clock; reads before it are served locally
	renewAt    time.Duration // start of the lease renewal in flight (0: none)
	lastReadAt time.Duration
	readSeen   bool          // lastReadAt is set
	transferAt time.Duration // last time a leadership transfer was seen
	// timeoutNow: this node campaigns because the leader handed leadership to
	// it (MsgTimeoutNow), so winning is a transfer, not an election. Cleared
	// once it is leader or follower again.
	timeoutNow bool

	// fastLease (host clock, nanoseconds; 0 = none) lets ReadBarrier complete a read
	// on the caller's goroutine, without a round on a worker: published at the end
	// of a round by a leader whose lease is valid and that has applied everything it
	// knows committed, cleared before anything can hand leadership away (a transfer)
	// or when leadership is lost. fastReadAt is the host time of the last such read
	// (for lease renewal). Both are atomics: ReadBarrier runs on any goroutine.
	// INVARIANT: fastLease <= leaseUntil whenever it is nonzero.
	fastLease  atomic.Int64
	fastReadAt atomic.Int64
	// fastTerm is the leader term of the last fastLease published: stored
	// before it, and never changed while it is nonzero (a new term clears
	// fastLease first: loseLeadership).
	fastTerm atomic.Uint64

	lastSnap uint64            // index of the last snapshot created or installed
	snapping bool              // a snapshot is being created off the worker
	sending  map[uint64]uint64 // follower → index of the snapshot streamed to it
	// compactMu orders a compaction (snapshot goroutine) against the start
	// of a snapshot stream (sender goroutine), which may send an older
	// snapshot than the one being written: either the compaction sees the
	// stream in streams and keeps the log after its index, or the stream
	// sees the compaction and gives up (holdLog). Guards streams (follower →
	// index of the snapshot its stream under way sends).
	compactMu sync.Mutex
	streams   map[uint64]uint64
	// unhold: streams ended while a snapshot was being written, whose holds
	// end when it is done (endStream).
	unhold []streamHold
	// heard: when (host clock) each peer was last heard from. A leader's
	// compaction keeps what a follower heard from lately still needs
	// (catchUpFloor).
	heard map[uint64]time.Duration
	// streamedAt: when (host clock) each follower took a snapshot this
	// leader streamed to it. For releaseGrace after that even the WAL's
	// release keeps what the follower still needs (catchUpFloor).
	streamedAt map[uint64]time.Duration
	// nextAtRound: each follower's Next as raft had it when this leader's
	// round began, for the log line of a snapshot send (sending one resets it).
	nextAtRound map[uint64]uint64
	// releasePending: Host.Snapshot asked for a snapshot that compacts the whole
	// applied log (to free WAL segments); noopProposed: this leader proposed an
	// empty entry for it, the group having applied nothing since its last snapshot.
	releasePending, noopProposed bool

	statusDirty  bool
	soloCampaign bool // campaign at once: this node is the only voter
}

type readIndexReq struct {
	start time.Duration // host clock when the ReadIndex was issued
	term  uint64
	reads []*readReq
}

func newGroup(h *Host, id uint64, peers []uint64, sm StateMachine, join bool) (*group, error) {
	g := &group{
		id: id, h: h, sm: sm,
		log:        h.log.With("group", id),
		pending:    make(map[uint64]*proposal),
		readIdx:    make(map[uint64]*readIndexReq),
		sending:    make(map[uint64]uint64),
		heard:      make(map[uint64]time.Duration),
		streamedAt: make(map[uint64]time.Duration),
		streams:    make(map[uint64]uint64),
		confState:  &raftpb.ConfState{},
		voteBlock:  h.cfg.ElectionTicks,
		transferAt: -1,
		hint:       slices.Clone(peers),
	}
	st := h.cfg.Log.Storage(id)
	g.st = st
	hs, cs, err := st.InitialState()
	if err != nil {
		return nil, fmt.Errorf("raftstore: group %d: initial state: %w", id, err)
	}
	snap, err := st.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftstore: group %d: snapshot: %w", id, err)
	}
	last, err := st.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("raftstore: group %d: last index: %w", id, err)
	}
	smIndex, _, err := sm.Recover()
	if err != nil {
		return nil, fmt.Errorf("raftstore: group %d: recover: %w", id, err)
	}
	snapIndex := snap.GetMetadata().GetIndex()
	g.savedTerm, g.savedVote = hs.GetTerm(), hs.GetVote()
	existing := !raft.IsEmptyHardState(hs) || last > 0 || snapIndex > 0
	if existing {
		if snapIndex > smIndex {
			// The log holds a snapshot received from the leader whose install did
			// not complete before a crash: its data is still staged; install it.
			g.log.Info("raftstore: installing a snapshot left staged before restart", "index", snapIndex, "recovered", smIndex)
			if err := sm.InstallSnapshot(snapIndex, snap.GetData()); err != nil {
				return nil, fmt.Errorf("raftstore: group %d: install staged snapshot %d: %w", id, snapIndex, err)
			}
			smIndex = snapIndex
		}
		g.applied = snapIndex
		g.appliedTerm = snap.GetMetadata().GetTerm()
		g.lastIndex = max(last, snapIndex)
		g.lastSnap = snapIndex
		g.skipApplyTo = min(smIndex, hs.GetCommit())
		// A restarted member may have acknowledged a leader's lease before it went
		// down; it must not vote for another leader before that lease ran out.
		g.voteBlock = h.cfg.ElectionTicks
		if cs != nil {
			g.confState = proto.Clone(cs).(*raftpb.ConfState)
		}
	}
	rc := &raft.Config{
		ID:                        h.cfg.NodeID,
		ElectionTick:              h.cfg.ElectionTicks,
		HeartbeatTick:             h.cfg.HeartbeatTicks,
		Storage:                   st,
		Applied:                   g.applied,
		MaxSizePerMsg:             h.cfg.MaxSizePerMsg,
		MaxCommittedSizePerReady:  64 << 20,
		MaxUncommittedEntriesSize: 256 << 20,
		MaxInflightMsgs:           h.cfg.MaxInflightMsgs,
		MaxInflightBytes:          h.cfg.MaxInflightBytes,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		AsyncStorageWrites:        true,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{g.log},
	}
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return nil, fmt.Errorf("raftstore: group %d: %w", id, err)
	}
	if !existing && !join {
		if len(peers) == 0 {
			return nil, fmt.Errorf("%w: group %d", ErrNoPeers, id)
		}
		ps := make([]raft.Peer, len(peers))
		for i, p := range peers {
			ps[i] = raft.Peer{ID: p}
		}
		if err := rn.Bootstrap(ps); err != nil {
			return nil, fmt.Errorf("raftstore: group %d: bootstrap: %w", id, err)
		}
	}
	// A group of one voter (a local pool's) need not wait an election timeout: it
	// campaigns as soon as its configuration is applied (see finishRound).
	if ids := rn.Status().Config.Voters.IDs(); len(ids) == 1 {
		_, g.soloCampaign = ids[h.cfg.NodeID]
	}
	g.rn = rn
	g.statusDirty = true
	g.publish()
	return g, nil
}

// tick advances raft's clock by n ticks.
func (g *group) tick(n int) {
	for range n {
		g.rn.Tick()
		if g.voteBlock > 0 {
			g.voteBlock--
		}
	}
}

// stepMessages screens a drained batch of peer messages and steps them into raft.
func (g *group) stepMessages(msgs []*raftpb.Message) {
	// A backlog of heartbeats (answers) from one peer is stepped once
	// (heartbeat.go): each answer can make raft read and send a MsgApp.
	hb := newHeartbeatRuns(msgs)
	now := g.h.now()
	for i, m := range msgs {
		if why := g.screen(m); why != "" && !g.h.noScreen {
			g.dropped(m, why)
			continue
		}
		g.heard[m.GetFrom()] = now
		if g.voteBlock > 0 && (m.GetType() == raftpb.MsgVote || m.GetType() == raftpb.MsgPreVote) {
			continue
		}
		if hb.skip(i, m) {
			continue
		}
		if m.GetType() == raftpb.MsgTimeoutNow {
			if g.h.draining.Load() {
				continue // handing leaderships away: take none (Host.SetDraining)
			}
			g.timeoutNow = true
		}
		// Errors here are messages from peers raft no longer knows; dropping them
		// is what raft wants.
		_ = g.rn.Step(m)
	}
}

// prepare drains the inbox into raft and returns the Ready to handle, if any.
func (g *group) prepare() (rd raft.Ready, ok bool) {
	if g.failed != nil || g.removed {
		return raft.Ready{}, false
	}
	ev := g.in.drain()
	// A panic (raft refusing an input) stops this group only; the callbacks
	// still in ev are failed (those handed to raft already are in pending,
	// unindexed, waiting or readIdx, which halt fails).
	defer func() {
		if r := recover(); r != nil {
			g.halt(r)
			failEvents(ev, g.failed)
			rd, ok = raft.Ready{}, false
		}
	}()
	if ev.members != nil {
		g.hint = ev.members
	}
	if g.isLeader {
		g.noteNext()
	}
	for _, r := range ev.appended {
		if !g.appendDone(r) {
			failEvents(ev, g.failed)
			return raft.Ready{}, false
		}
	}
	// Both the ticks and the messages may have piled up while this worker was
	// busy (a catch-up read of the WAL can hold it ~1 s). A leader steps the
	// messages first: taking a second of ticks first, it reached its quorum
	// check before the answers waiting beside them and stepped down for lack
	// of a quorum it had (TestTicksAfterMessages; docs/reliability.md,
	// "Leader paused"). Any other role ticks first: a leader's heartbeat
	// among the messages then still finds it following, or brings a
	// (pre-)candidate back, instead of the ticks timing out after it.
	if g.rn.BasicStatus().RaftState == raft.StateLeader {
		g.stepMessages(ev.msgs)
		g.tick(ev.ticks)
	} else {
		g.tick(ev.ticks)
		g.stepMessages(ev.msgs)
	}
	for _, r := range ev.snapReports {
		st := raft.SnapshotFinish
		if r.failed {
			st = raft.SnapshotFailure
		}
		g.rn.ReportSnapshot(r.to, st)
		g.endStream(r.to)
		if !r.failed {
			g.streamedAt[r.to] = g.h.now()
		}
	}
	for _, r := range ev.snapDone {
		g.snapshotDone(r)
	}
	g.refresh()
	for _, to := range ev.transfers {
		if g.isLeader && to != g.h.cfg.NodeID {
			g.transferAt = g.h.now()
			g.dropLease()
			g.rn.TransferLeader(to)
		}
	}
	if ev.forceSnap {
		// Before this round's proposals: a no-op proposed here must not come after
		// them in the log (see indexProposals).
		g.releasePending = true
		g.noopProposed = false
		g.maybeSnapshot(snapRelease)
	}
	for i, p := range ev.props {
		ev.props[i] = nil // raft's now (for the deferred failEvents)
		g.propose(p)
	}
	if reads := ev.reads; len(reads) > 0 {
		ev.reads = nil
		g.read(reads)
	}
	if ev.ticks > 0 {
		g.statusDirty = true
		g.maybeRenewLease()
	}
	if !g.rn.HasReady() {
		return raft.Ready{}, false
	}
	rd = g.rn.Ready()
	g.indexProposals(rd.Entries)
	if n := len(rd.Entries); n > 0 {
		// Appended entries replace any suffix from their first index on.
		g.lastIndex = rd.Entries[n-1].GetIndex()
	} else if !raft.IsEmptySnap(rd.Snapshot) {
		g.lastIndex = rd.Snapshot.GetMetadata().GetIndex()
	}
	if rd.SoftState != nil {
		g.statusDirty = true
	}
	return rd, true
}

// refresh follows raft's leadership; losing it (or a new term) fails what waited on it.
func (g *group) refresh() {
	bs := g.rn.BasicStatus()
	isLeader := bs.RaftState == raft.StateLeader
	term := bs.GetTerm()
	if g.isLeader && (!isLeader || term != g.term) {
		g.loseLeadership(bs.Lead)
	}
	if bs.Lead != g.leader || term != g.term || isLeader != g.isLeader {
		g.statusDirty = true
	}
	if isLeader && !g.isLeader {
		// One line per leadership gained, telling elections (a leader was lost:
		// IO to the group stalled) from transfers (a planned hand-over).
		via := "election"
		if g.timeoutNow {
			via = "transfer"
		}
		g.log.Info("raftstore: became leader", "term", term, "via", via)
	}
	if isLeader || bs.RaftState == raft.StateFollower {
		g.timeoutNow = false
	}
	g.leader, g.term, g.isLeader = bs.Lead, term, isLeader
	if bs.LeadTransferee != raft.None {
		g.transferAt = g.h.now()
		g.dropLease()
	}
}

func (g *group) notLeader() error { return g.notLeaderHint(g.leader) }

// notLeaderHint is the ErrNotLeader naming leader (none if it is this node).
func (g *group) notLeaderHint(leader uint64) error {
	if leader == g.h.cfg.NodeID {
		leader = 0
	}
	return &NotLeaderError{Leader: leader}
}

func (g *group) loseLeadership(newLeader uint64) {
	g.failAll(g.notLeaderHint(newLeader))
	g.dropLease()
	g.renewAt = 0
}

// dropLease ends the leader lease, and with it the fast read path, at once.
func (g *group) dropLease() {
	g.leaseUntil = 0
	g.fastLease.Store(0)
}

// publishFastLease lets ReadBarrier serve reads without a round while this leader's
// lease is valid and nothing committed is left to apply.
func (g *group) publishFastLease() {
	if g.failed == nil && !g.removed && g.isLeader && g.leaseUntil > g.h.now() &&
		g.applied >= g.rn.BasicStatus().GetCommit() {
		// fastTerm before fastLease: ReadBarrierTerm loads them in the
		// other order (see there).
		g.fastTerm.Store(g.term)
		g.fastLease.Store(int64(g.leaseUntil))
		return
	}
	g.fastLease.Store(0)
}

// failAll ends every pending proposal and read with err.
func (g *group) failAll(err error) {
	// Answer in a fixed order (log index, request id) so tests replay exactly.
	var ps []*proposal
	for _, idx := range slices.Sorted(maps.Keys(g.pending)) {
		ps = append(ps, g.pending[idx])
	}
	ps = append(ps, g.unindexed...)
	g.unindexed = nil
	clear(g.pending)
	rs := g.waiting
	g.waiting = nil
	for _, key := range slices.Sorted(maps.Keys(g.readIdx)) {
		rs = append(rs, g.readIdx[key].reads...)
	}
	clear(g.readIdx)
	for _, p := range ps {
		p.done(err)
	}
	for _, r := range rs {
		r.finish(err)
	}
}

// fail stops the group for good after a disk failure: from now on every
// callback gets g.failed (ErrDiskFull or ErrIO, and err).
func (g *group) fail(err error) {
	if g.failed != nil {
		return
	}
	err = DiskFailure(err)
	g.log.Error("raftstore: group stopped by a disk error", "err", err)
	g.stopWith(err)
}

// stopWith stops the group for good: every callback, queued or later, gets err.
func (g *group) stopWith(err error) {
	g.failed = err
	g.dropLease()
	g.statusDirty = true
	ev := g.in.close(g.failed)
	failEvents(ev, g.failed)
	g.failAll(g.failed)
}

// shutdown ends the group on this host (RemoveGroup, Stop): callbacks get err.
func (g *group) shutdown(err error) {
	g.procMu.Lock()
	defer g.procMu.Unlock()
	g.gone.Store(true)
	g.removed = true
	g.dropLease()
	ev := g.in.close(err)
	failEvents(ev, err)
	g.failAll(err)
}

func failEvents(ev events, err error) {
	for _, p := range ev.props {
		if p != nil {
			p.done(err)
		}
	}
	for _, r := range ev.reads {
		r.finish(err)
	}
}

// propose hands p to raft. The entry's data is an 8-byte big-endian proposal id and
// then the caller's data; the id lets the apply side check that the entry at the
// proposal's index is the proposal (see doc.go).
func (g *group) propose(p *proposal) {
	if !g.isLeader || p.inTerm != 0 && p.inTerm != g.term {
		// ProposeInTerm after the term moved: another leader may have
		// written since the caller's read.
		p.done(g.notLeader())
		return
	}
	p.term = g.term
	p.seq = g.h.propSeq.Add(1)
	var err error
	if p.cc != nil {
		cc := proto.Clone(p.cc).(*raftpb.ConfChangeV2)
		cc.Context = encodeSeq(p.seq)
		err = g.rn.ProposeConfChange(cc)
	} else {
		buf := p.data
		binary.BigEndian.PutUint64(buf, p.seq) // the room Propose's caller left
		p.data = nil
		err = g.rn.Propose(buf)
	}
	if err != nil { // raft.ErrProposalDropped: transferring leadership, or too much uncommitted
		p.done(g.notLeader())
		return
	}
	g.unindexed = append(g.unindexed, p)
}

// indexProposals learns the log index of this round's proposals: they are, in order,
// the last entries the Ready asks to persist (raft appends nothing after them within a
// round: ticks, messages and the election's empty entry come before, an auto-leave
// entry only when an apply is acknowledged, after the Ready was taken).
func (g *group) indexProposals(ents []*raftpb.Entry) {
	if len(g.unindexed) == 0 {
		return
	}
	ps := g.unindexed
	g.unindexed = nil
	if len(ents) < len(ps) {
		g.log.Error("raftstore: fewer new entries than proposals", "entries", len(ents), "proposals", len(ps))
		for _, p := range ps {
			p.done(g.notLeader())
		}
		return
	}
	tail := ents[len(ents)-len(ps):]
	for i, p := range ps {
		e := tail[i]
		if e.GetTerm() != p.term || !entryHasSeq(e, p) {
			g.log.Error("raftstore: proposal does not match its entry", "index", e.GetIndex(), "term", e.GetTerm(), "proposal_term", p.term)
			p.done(g.notLeader())
			continue
		}
		p.index = e.GetIndex()
		g.pending[p.index] = p
	}
}

// entryHasSeq reports whether e carries p's proposal id (a conf change that raft
// refused became an empty normal entry, which matches too: applying it tells p so).
func entryHasSeq(e *raftpb.Entry, p *proposal) bool {
	switch {
	case p.cc != nil && e.GetType() == raftpb.EntryNormal:
		return len(e.GetData()) == 0
	case p.cc != nil:
		return true // checked against the decoded Context at apply
	default:
		d := e.GetData()
		return len(d) >= 8 && binary.BigEndian.Uint64(d) == p.seq
	}
}

// applySnapshot installs a snapshot received from the leader, now durable in the log.
func (g *group) applySnapshot(snap *raftpb.Snapshot) bool {
	if raft.IsEmptySnap(snap) {
		return true
	}
	md := snap.GetMetadata()
	// Wait for a snapshot being persisted (rare: a follower that compacts receives
	// a snapshot); a later one sees installed and skips.
	g.persistMu.Lock()
	g.installed.Store(md.GetIndex())
	err := g.sm.InstallSnapshot(md.GetIndex(), snap.GetData())
	g.persistMu.Unlock()
	if err != nil {
		g.fail(fmt.Errorf("raftstore: install snapshot %d: %w", md.GetIndex(), err))
		return false
	}
	g.log.Info("raftstore: installed snapshot", "index", md.GetIndex(), "term", md.GetTerm())
	g.applied, g.appliedTerm = md.GetIndex(), md.GetTerm()
	g.lastSnap = md.GetIndex()
	g.skipApplyTo = 0
	if cs := md.GetConfState(); cs != nil {
		g.confState = proto.Clone(cs).(*raftpb.ConfState)
	}
	g.statusDirty = true
	return true
}

// applyEntries applies committed entries in order and answers their proposers. It
// returns false when the group failed (then raft is not advanced).
func (g *group) applyEntries(ents []*raftpb.Entry) bool {
	h := g.h
	for _, e := range ents {
		idx := e.GetIndex()
		p := g.pending[idx]
		if p != nil {
			g.applying = p // a panic from here on answers p (halt)
			delete(g.pending, idx)
			if p.term == e.GetTerm() {
				h.stats.proposeCommit.Observe(time.Since(p.start))
			}
		}
		var res error
		switch e.GetType() {
		case raftpb.EntryNormal:
			d := e.GetData()
			if len(d) == 0 || idx <= g.skipApplyTo {
				break // the new leader's empty entry, or already applied before a restart
			}
			if len(d) < 8 {
				g.restore(p)
				g.fail(fmt.Errorf("raftstore: entry %d has %d bytes, no proposal id", idx, len(d)))
				return false
			}
			t := time.Now()
			if fa, ok := g.sm.(FollowerApplier); ok && !g.isLeader {
				res = fa.ApplyFollower(idx, d[8:])
			} else {
				res = g.sm.Apply(idx, d[8:])
			}
			h.stats.apply.Observe(time.Since(t))
			if !isAPIError(res) {
				g.restore(p)
				g.fail(fmt.Errorf("raftstore: apply %d: %w", idx, res))
				return false
			}
		case raftpb.EntryConfChange:
			cc := &raftpb.ConfChange{}
			if err := proto.Unmarshal(e.GetData(), cc); err != nil {
				g.restore(p)
				g.fail(fmt.Errorf("raftstore: conf change %d: %w", idx, err))
				return false
			}
			g.confState = g.rn.ApplyConfChange(cc)
			g.statusDirty = true
		case raftpb.EntryConfChangeV2:
			cc := &raftpb.ConfChangeV2{}
			if err := proto.Unmarshal(e.GetData(), cc); err != nil {
				g.restore(p)
				g.fail(fmt.Errorf("raftstore: conf change %d: %w", idx, err))
				return false
			}
			g.confState = g.rn.ApplyConfChange(cc)
			g.statusDirty = true
			if p != nil && p.cc != nil && len(cc.GetContext()) == 8 && binary.BigEndian.Uint64(cc.GetContext()) != p.seq {
				res = g.notLeader() // not ours after all
			}
			g.log.Info("raftstore: membership changed", "index", idx, "voters", g.confState.GetVoters(),
				"voters_outgoing", g.confState.GetVotersOutgoing(), "learners", g.confState.GetLearners())
		}
		g.applied, g.appliedTerm = idx, e.GetTerm()
		g.applying = nil
		if p != nil {
			switch {
			case p.term != e.GetTerm():
				p.done(g.notLeader()) // another leader's entry replaced ours
			case p.cc != nil && e.GetType() == raftpb.EntryNormal:
				p.done(ErrConfChangeRejected)
			default:
				p.done(res)
			}
		}
	}
	return true
}

// restore puts p back so that fail answers it (with the disk error).
func (g *group) restore(p *proposal) {
	if p != nil {
		g.pending[p.index] = p
	}
}

// finishRound runs after a group's round, handled or not.
func (g *group) finishRound() {
	if g.failed == nil && !g.removed {
		if g.soloCampaign {
			if g.isLeader {
				g.soloCampaign = false
			} else if bs := g.rn.BasicStatus(); bs.RaftState == raft.StateFollower && bs.Applied >= bs.GetCommit() {
				_ = g.rn.Campaign()
			}
		}
		g.refresh()
		g.serveReads()
		if g.releasePending {
			g.maybeSnapshot(snapRelease)
		} else {
			g.maybeSnapshot(snapAuto)
		}
		if g.rn.HasReady() {
			g.h.sched.signal(g)
		}
	}
	if g.rn != nil {
		g.publishFastLease()
	}
	g.publish()
}

// publish copies the group's state for Status readers.
func (g *group) publish() {
	if g.rn == nil {
		return
	}
	commit := g.rn.BasicStatus().GetCommit()
	if !g.statusDirty {
		g.statusMu.Lock()
		g.status.Commit, g.status.Applied, g.status.LastIndex = commit, g.applied, g.lastIndex
		g.statusMu.Unlock()
		return
	}
	g.statusDirty = false
	st := GroupStatus{
		ID: g.id, Leader: g.leader, Term: g.term, Commit: commit, Applied: g.applied,
		Voters:         slices.Clone(g.confState.GetVoters()),
		Learners:       slices.Clone(g.confState.GetLearners()),
		VotersOutgoing: slices.Clone(g.confState.GetVotersOutgoing()),
		AutoLeave:      g.confState.GetAutoLeave(),
		LastIndex:      g.lastIndex,
		IsLeader:       g.isLeader && g.failed == nil,
		Healthy:        g.failed == nil,
		Err:            g.failed,
		Snapshot:       g.lastSnap,
	}
	if g.isLeader && g.failed == nil {
		st.Progress = make(map[uint64]uint64)
		st.Replicating = make(map[uint64]bool)
		st.Active = make(map[uint64]bool)
		g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			st.Progress[id] = pr.Match
			st.Replicating[id] = pr.State == tracker.StateReplicate
			st.Active[id] = pr.RecentActive
		})
	}
	g.statusMu.Lock()
	g.status = st
	g.statusMu.Unlock()
}

func (g *group) getStatus() GroupStatus {
	g.statusMu.Lock()
	defer g.statusMu.Unlock()
	st := g.status
	st.Voters = slices.Clone(st.Voters)
	st.Learners = slices.Clone(st.Learners)
	st.VotersOutgoing = slices.Clone(st.VotersOutgoing)
	st.Progress = maps.Clone(st.Progress)
	st.Replicating = maps.Clone(st.Replicating)
	st.Active = maps.Clone(st.Active)
	return st
}

// appendJob is one group's part of a LogStore.Save: its updates, and the messages
// raft gave to deliver once they are durable (MsgStorageAppend's responses).
type appendJob struct {
	g         *group
	updates   []wal.Update
	responses []*raftpb.Message
	snap      *raftpb.Snapshot // a received snapshot among the updates (the last), to install once durable
}

// appendResult is the outcome of an appendJob, back in the group's inbox.
type appendResult struct {
	local []*raftpb.Message // responses to this node, to step
	snap  *raftpb.Snapshot
	err   error
}

// newAppend turns a Ready's MsgStorageAppend m into an append job. The jobs of a
// group reach the log in round order (LogStore.SaveAsync), however many are in
// flight.
func (g *group) newAppend(rd raft.Ready, m *raftpb.Message) *appendJob {
	u := wal.Update{Group: g.id, HardState: rd.HardState, Entries: rd.Entries, Snapshot: rd.Snapshot}
	if !raft.IsEmptyHardState(u.HardState) || len(u.Entries) > 0 || !raft.IsEmptySnap(u.Snapshot) {
		// raft.MustSync: only entries, a snapshot or a new term or vote must be
		// durable before their responses go; a commit-index change is written
		// unsynced (appends of one group are saved in order, so everything before
		// it is durable by then).
		u.NoSync = len(u.Entries) == 0 && raft.IsEmptySnap(u.Snapshot) &&
			u.HardState.GetTerm() == g.savedTerm && u.HardState.GetVote() == g.savedVote
		if !raft.IsEmptyHardState(u.HardState) {
			g.savedTerm, g.savedVote = u.HardState.GetTerm(), u.HardState.GetVote()
		}
	}
	job := &appendJob{g: g, updates: []wal.Update{u}, responses: m.GetResponses()}
	if !raft.IsEmptySnap(rd.Snapshot) {
		job.snap = rd.Snapshot
	}
	return job
}

// appendDone takes the outcome of the group's append: a received snapshot is
// installed before raft hears it is durable (raft then counts it applied), then
// the responses to this node are stepped. False if the group failed.
func (g *group) appendDone(r appendResult) bool {
	if r.err != nil {
		g.fail(fmt.Errorf("raftstore: log save: %w", r.err))
		return false
	}
	if r.snap != nil && !g.applySnapshot(r.snap) {
		return false
	}
	for _, m := range r.local {
		_ = g.rn.Step(m)
	}
	return true
}
