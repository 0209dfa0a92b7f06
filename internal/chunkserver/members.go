package chunkserver

import (
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/raftstore"
)

// learnerCatchUp is how far (in entries) a learner may trail the leader's
// last index, once it installed any snapshot it needed, and still be
// promoted to voter (raftstore.GroupStatus.CaughtUp).
const learnerCatchUp = 64

// reconcileInterval: how often, between heartbeats, the leader of a moved
// copyset looks whether its next membership step can go (at most the
// heartbeat interval).
const reconcileInterval = 200 * time.Millisecond

// reconcileMembers moves a copyset's raft membership toward the members the
// MDS lists for it, one step at a time (raftstore.NextMoveStep; only the
// leader acts):
//
//  1. a listed member that is not in the group joins as a learner;
//  2. a learner no longer listed is removed;
//  3. once the listed learners caught up (snapshot installed, log within
//     learnerCatchUp entries of the leader's), one joint change promotes them
//     and removes the voters no longer listed; raft leaves the joint
//     configuration by itself as soon as the leader applied it (auto-leave).
//     The leader first hands leadership to a listed voter if it is the one
//     to go.
//
// So the copyset never runs on fewer voters than the pool's replica count
// while a replica moves (docs/reliability.md, "Moving a replica").
//
// Runs on Run's goroutine (every heartbeat, and every reconcileInterval in
// between); the change's callback only clears the pending mark.
func (c *ChunkServer) reconcileMembers(g uint64, want []uint64) {
	if len(want) == 0 {
		return
	}
	st, ok := c.host.Status(g)
	if !ok || !st.IsLeader || !st.Healthy {
		return
	}
	c.mu.Lock()
	if c.confPending[g] {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	step := raftstore.NextMoveStep(st, c.ID(), want, learnerCatchUp)
	switch step.Kind {
	case raftstore.MoveWait:
		return
	case raftstore.MoveTransferLeader:
		c.log.Info("copyset leadership handed over: this member is to be removed", "copyset", g, "to", step.Node)
		c.host.TransferLeader(g, step.Node)
		return
	}
	c.mu.Lock()
	c.confPending[g] = true
	c.mu.Unlock()
	c.log.Info("copyset membership change", "copyset", g, "step", step.String(),
		"voters", st.Voters, "learners", st.Learners, "want", want)
	c.host.ProposeConfChange(g, step.ConfChange(), func(err error) {
		if err != nil {
			c.log.Debug("membership change not applied", "copyset", g, "step", step.String(), "err", err)
		} else if f := c.cfg.Knobs.AfterMoveStep; f != nil {
			f(g, step)
		}
		c.mu.Lock()
		delete(c.confPending, g)
		c.mu.Unlock()
	})
}

// handOver makes a leader the MDS no longer lists as a member give up
// leadership to the most caught-up other voter: only a listed member's leader
// learns the new member list and carries out the change (including this
// replica's removal).
func (c *ChunkServer) handOver(st raftstore.GroupStatus) {
	if !st.IsLeader || !st.Healthy {
		return
	}
	var to, best uint64
	for _, v := range st.Voters {
		if v != c.ID() && (to == 0 || st.Progress[v] > best) {
			to, best = v, st.Progress[v]
		}
	}
	if to != 0 {
		c.log.Info("copyset leadership handed over: no longer listed as a member", "copyset", st.ID, "to", to)
		c.host.TransferLeader(st.ID, to)
	}
}

// removeIfGone handles a copyset the MDS no longer lists for this
// chunkserver. It stops hosting it and deletes its data once the group's own
// configuration no longer includes this chunkserver (the removal reached this
// replica), once it went unlisted for OrphanTimeout without knowing a
// leader (a replica removed while it was down never hears of the removal; the
// remaining members do not talk to it), or at once if a disk error stopped
// it (it serves nothing and never hears of its removal: the MDS moved it
// away because it stopped). Until then, nothing is deleted.
func (c *ChunkServer) removeIfGone(st raftstore.GroupStatus, unlistedFor time.Duration) {
	self := c.ID()
	// A voter of a joint configuration's outgoing half still counts for
	// quorum until the group leaves it.
	member := len(st.Voters) == 0 || slices.Contains(st.Voters, self) || slices.Contains(st.Learners, self) ||
		slices.Contains(st.VotersOutgoing, self)
	orphan := st.Leader == 0 && unlistedFor >= c.cfg.OrphanTimeout
	if member && !orphan && st.Healthy {
		return
	}
	c.mu.Lock()
	r := c.replicas[st.ID]
	delete(c.replicas, st.ID)
	c.mu.Unlock()
	if r == nil {
		return
	}
	if err := c.host.RemoveGroup(st.ID); err != nil {
		c.log.Warn("removing copyset group", "copyset", st.ID, "err", err)
	}
	if err := c.store.RemoveCopyset(st.ID); err != nil {
		c.log.Warn("removing copyset data", "copyset", st.ID, "err", err)
	}
	c.log.Info("copyset removed: no longer a member", "copyset", st.ID, "orphan", orphan, "stopped", !st.Healthy)
}
