package chunkserver

import (
	"slices"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/raftstore"
)

// learnerCatchUp is how far (in entries) a learner may trail the leader's
// applied index and still be promoted to voter.
const learnerCatchUp = 64

// reconcileInterval: how often, between heartbeats, the leader of a moved
// copyset looks whether its next membership step can go (at most the
// heartbeat interval).
const reconcileInterval = 200 * time.Millisecond

// reconcileMembers moves a copyset's raft membership, one change at a time,
// toward the members the MDS lists for it. Only the leader acts:
//
//  1. a listed member that is not in the group joins as a learner;
//  2. a listed learner that caught up is promoted to voter;
//  3. a voter or learner that is no longer listed is removed (the leader
//     first hands leadership to a listed voter if it is the one to go).
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
	in := func(s []uint64, id uint64) bool { return slices.Contains(s, id) }
	for _, m := range want {
		if !in(st.Voters, m) && !in(st.Learners, m) {
			c.proposeConf(g, raftpb.ConfChangeAddLearnerNode, m)
			return
		}
	}
	for _, l := range st.Learners {
		if in(want, l) && st.Progress[l]+learnerCatchUp >= st.Applied {
			c.proposeConf(g, raftpb.ConfChangeAddNode, l)
			return
		}
	}
	for _, v := range append(slices.Clone(st.Voters), st.Learners...) {
		if in(want, v) {
			continue
		}
		if v == c.ID() {
			for _, to := range st.Voters {
				if to != v && in(want, to) {
					c.host.TransferLeader(g, to)
					return
				}
			}
			return
		}
		c.proposeConf(g, raftpb.ConfChangeRemoveNode, v)
		return
	}
}

func (c *ChunkServer) proposeConf(g uint64, typ raftpb.ConfChangeType, node uint64) {
	c.mu.Lock()
	c.confPending[g] = true
	c.mu.Unlock()
	c.log.Info("copyset membership change", "copyset", g, "change", typ.String(), "node", node)
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: &typ, NodeId: &node}}}
	c.host.ProposeConfChange(g, cc, func(err error) {
		if err != nil {
			c.log.Debug("membership change not applied", "copyset", g, "node", node, "err", err)
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
	member := len(st.Voters) == 0 || slices.Contains(st.Voters, self) || slices.Contains(st.Learners, self)
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
