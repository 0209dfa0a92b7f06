package raftstore

import (
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// ErrRaftPanic: raft (or the state machine) panicked while handling this
// group — most likely on a message from a peer that contradicts the log. The
// group stopped on this host (GroupStatus.Err wraps it, with the panic); the
// process and the other groups go on. It is not a disk failure: the
// chunkserver does not report its disk broken for it.
var ErrRaftPanic = errors.New("raftstore: raft panicked; group stopped on this host")

// peerTypes are the raft message types a peer may send. Everything else is
// either local to a node (raft.IsLocalMsg: MsgHup, MsgBeat, the storage
// threads' MsgStorageAppend/Apply and their responses, MsgUnreachable,
// MsgSnapStatus, MsgCheckQuorum) or something this host never sends to a
// peer: MsgProp and MsgReadIndex (proposal forwarding is off, reads go to
// the leader), MsgTransferLeader and MsgForgetLeader (leadership transfers
// start on the leader itself), MsgReadIndexResp (the answer to a forwarded
// MsgReadIndex). MsgSnap arrives only with its data (ReceiveSnapshot).
var peerTypes = [...]bool{
	raftpb.MsgApp:           true,
	raftpb.MsgAppResp:       true,
	raftpb.MsgVote:          true,
	raftpb.MsgVoteResp:      true,
	raftpb.MsgPreVote:       true,
	raftpb.MsgPreVoteResp:   true,
	raftpb.MsgHeartbeat:     true,
	raftpb.MsgHeartbeatResp: true,
	raftpb.MsgTimeoutNow:    true,
	raftpb.MsgSnap:          true,
}

// screen returns why m, a message from the network for this group, must not
// reach raft ("" when it may). It runs on the worker holding the group, with
// the group's applied configuration and raft's last index as of its last
// Ready. Raft trusts its input: a message that breaks these rules makes it
// panic (a heartbeat committing past the log, a storage thread's response)
// or lets a stranger take part in the group.
//
// From must be a member of the applied configuration (voter, learner, either
// side of a joint one) or one the control plane lists for the group
// (Host.SetMembers; a replica that missed the conf changes adding its new
// leader still hears from it). A group with neither — a new replica joined
// empty, waiting for its leader's first snapshot — accepts any sender; the
// transport authenticates chunkservers before anything gets here.
func (g *group) screen(m *raftpb.Message) string {
	t := m.GetType()
	self := g.h.cfg.NodeID
	switch {
	case int(t) < 0 || int(t) >= len(peerTypes) || !peerTypes[t]:
		return "message type not accepted from the network"
	case m.GetTo() != self:
		return "not addressed to this node"
	case m.GetFrom() == 0 || m.GetFrom() == self || raft.IsLocalMsgTarget(m.GetFrom()):
		return "sender id invalid"
	case m.GetTerm() == 0:
		// raft steps a term-0 message as a local one, skipping every term check.
		return "no term"
	case !g.knownSender(m.GetFrom()):
		return "sender not a member of the group"
	}
	switch t {
	case raftpb.MsgHeartbeat:
		// A leader's heartbeat commits at most what this node acknowledged;
		// raft panics on a commit index past its log.
		if m.GetCommit() > g.lastIndex {
			return "heartbeat commits past the log"
		}
	case raftpb.MsgAppResp:
		// A follower acknowledges only what this leader sent it.
		if !m.GetReject() && m.GetIndex() > g.lastIndex {
			return "acknowledges entries past the log"
		}
	case raftpb.MsgApp:
		// The entries follow the previous index one by one, in the sender's
		// terms at most.
		for i, e := range m.GetEntries() {
			if e.GetIndex() != m.GetIndex()+1+uint64(i) || e.GetTerm() > m.GetTerm() || e.GetTerm() < m.GetLogTerm() {
				return "entries out of sequence"
			}
		}
	}
	return ""
}

// ErrSnapshotRefused: a snapshot stream that is not its group's leader's
// (ReceiveSnapshot); nothing of it was staged.
var ErrSnapshotRefused = errors.New("raftstore: snapshot stream refused")

// snapshotRefusal returns why a snapshot stream carrying m must not be
// received by node self ("" when it may), from the group's status as of its
// last round. It runs before any of the stream is staged; screen still
// checks the MsgSnap (membership included) when it is stepped after the
// stream, before raft installs anything. Only a leader sends
// MsgSnap, to a replica it leads: a stream from an older term, or from
// anyone but the leader this replica knows for the current term, is forged
// or stale (a deposed leader's). One from a later term may be a leader this
// replica has not heard of yet; raft follows it.
func snapshotRefusal(st GroupStatus, m *raftpb.Message, self uint64) string {
	from, term := m.GetFrom(), m.GetTerm()
	switch {
	case !st.Healthy:
		return "group stopped"
	case m.GetTo() != self:
		return "not addressed to this node"
	case from == 0 || from == self || term == 0:
		return "sender id or term invalid"
	case st.IsLeader && term <= st.Term:
		return "this replica leads the term"
	case term < st.Term:
		return "snapshot from an older term"
	case term == st.Term && st.Leader != 0 && st.Leader != from:
		return "snapshot not from the term's leader"
	}
	return ""
}

// knownSender reports whether id may send to this group (see screen).
func (g *group) knownSender(id uint64) bool {
	cs := g.confState
	if inConfState(cs, id) || slices.Contains(g.hint, id) {
		return true
	}
	return len(g.hint) == 0 && len(cs.GetVoters()) == 0 && len(cs.GetLearners()) == 0 &&
		len(cs.GetVotersOutgoing()) == 0 && len(cs.GetLearnersNext()) == 0
}

// dropped logs a message screen refused, at most every 10 s per group.
func (g *group) dropped(m *raftpb.Message, why string) {
	g.h.stats.msgsDropped.Add(1)
	now := time.Now()
	if now.Sub(g.lastDropLog) < 10*time.Second {
		g.dropsQuiet++
		return
	}
	g.log.Warn("raftstore: raft message from the network dropped", "why", why,
		"type", m.GetType().String(), "from", m.GetFrom(), "to", m.GetTo(), "term", m.GetTerm(),
		"index", m.GetIndex(), "commit", m.GetCommit(), "dropped_quietly", g.dropsQuiet)
	g.lastDropLog, g.dropsQuiet = now, 0
}

// contain runs f, part of a round over the group; a panic in it stops this
// group only (halt) instead of the process. A raft panic leaves the RawNode
// in no known state, so the group never runs again on this host; the control
// plane sees it unhealthy and replaces the replica.
func (g *group) contain(f func()) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			g.halt(r)
			ok = false
		}
	}()
	f()
	return true
}

// halt stops the group after a panic: like a disk failure, every callback
// from now on gets the error, but it is ErrRaftPanic.
func (g *group) halt(r any) {
	if g.failed != nil {
		return
	}
	err := fmt.Errorf("%w: %v", ErrRaftPanic, r)
	stack := debug.Stack()
	if len(stack) > 8<<10 {
		stack = stack[:8<<10]
	}
	g.log.Error("raftstore: group stopped: raft panicked (the process and other groups go on; "+
		"the control plane will replace this replica)", "err", err, "stack", string(stack))
	if p := g.applying; p != nil {
		g.applying = nil
		g.restore(p)
	}
	g.stopWith(err)
}
