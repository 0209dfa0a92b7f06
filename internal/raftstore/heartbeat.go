package raftstore

import (
	"encoding/binary"

	"go.etcd.io/raft/v3/raftpb"
)

// heartbeatRuns steps each run of MsgHeartbeat or MsgHeartbeatResp of one
// sender and term among a group's messages of one round once: only the last
// of the run is stepped, carrying the highest read-index context of those
// that passed the screen; the others are screened, then skipped.
//
// Why: a peer that was paused (SIGSTOP, a VM freeze, a long GC) keeps its
// sockets, so the leader's heartbeats to it queue up — ten a second per
// group — and reach it all at once when it resumes; it answers every one.
// For a follower in StateProbe raft sends a MsgApp of up to MaxSizePerMsg
// on each MsgHeartbeatResp, read from the log inside Step, so a hundred
// stale answers made the leader read and send the same entries a hundred
// times in one round, holding the worker (and every group of its batch) for
// seconds: the healthy chunkservers' leaders then stepped down for lack of
// quorum (docs/reliability.md, "Leader paused").
//
// Skipping them is safe: raft tolerates lost heartbeats, the last one is the
// newest (a leader's commit index only grows within a term), and raft's
// read-index acknowledgements are cumulative — the context is a counter and
// readOnly.recvAck keeps the highest per peer — so acknowledging the highest
// context acknowledges every earlier one. A run with a context that is no
// such counter (neither empty nor 8 bytes) is stepped message by message.
type heartbeatRuns struct {
	runs map[hbKey]*hbRun
}

type hbKey struct {
	t          raftpb.MessageType
	from, term uint64
}

type hbRun struct {
	last   int    // index of the run's last message
	n      int    // messages in the run
	odd    bool   // a context that is not a counter: no coalescing
	ctx    uint64 // highest context folded in so far
	hasCtx bool
}

func isHeartbeat(m *raftpb.Message) bool {
	t := m.GetType()
	return t == raftpb.MsgHeartbeat || t == raftpb.MsgHeartbeatResp
}

// newHeartbeatRuns returns the runs of msgs, or nil when no run has more
// than one message (the common case: nothing to do).
func newHeartbeatRuns(msgs []*raftpb.Message) *heartbeatRuns {
	n := 0
	for _, m := range msgs {
		if isHeartbeat(m) {
			n++
		}
	}
	if n < 2 { // a round has one heartbeat at most, usually: no map
		return nil
	}
	var runs map[hbKey]*hbRun
	multi := false
	for i, m := range msgs {
		if !isHeartbeat(m) {
			continue
		}
		if runs == nil {
			runs = make(map[hbKey]*hbRun)
		}
		k := hbKey{m.GetType(), m.GetFrom(), m.GetTerm()}
		r := runs[k]
		if r == nil {
			r = &hbRun{}
			runs[k] = r
		}
		r.last = i
		r.n++
		multi = multi || r.n > 1
		if c := m.GetContext(); len(c) != 0 && len(c) != 8 {
			r.odd = true
		}
	}
	if !multi {
		return nil
	}
	return &heartbeatRuns{runs: runs}
}

// skip reports whether msgs[i] (m), which passed the screen, is to be
// skipped; the last of a run gets the run's highest context instead.
func (h *heartbeatRuns) skip(i int, m *raftpb.Message) bool {
	if h == nil || !isHeartbeat(m) {
		return false
	}
	r := h.runs[hbKey{m.GetType(), m.GetFrom(), m.GetTerm()}]
	if r == nil || r.n < 2 || r.odd {
		return false
	}
	if c := m.GetContext(); len(c) == 8 {
		r.ctx = max(r.ctx, binary.LittleEndian.Uint64(c))
		r.hasCtx = true
	}
	if i != r.last {
		return true
	}
	if r.hasCtx {
		m.Context = binary.LittleEndian.AppendUint64(nil, r.ctx)
	}
	return false
}
