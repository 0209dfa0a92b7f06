package chunkserver

import (
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/capability"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// heartbeatLoop heartbeats until ctx is done or the server fails.
func (c *ChunkServer) heartbeatLoop(ctx context.Context, srvDone <-chan error) error {
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	rt := time.NewTicker(min(reconcileInterval, c.cfg.HeartbeatInterval))
	defer rt.Stop()
	failures := 0
	for {
		if err := c.heartbeat(ctx); err != nil {
			failures++
			if failures == 1 || failures%30 == 0 {
				c.log.Warn("heartbeat failed", "err", err, "failures", failures)
			}
		} else {
			if failures > 0 {
				c.log.Info("heartbeat succeeded again", "after_failures", failures)
			}
			failures = 0
		}
		c.compactWAL()
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return nil
			case err := <-srvDone:
				if errors.Is(err, transport.ErrServerClosed) {
					return nil
				}
				return err
			case <-rt.C:
				// A membership change steps on as soon as the last one is
				// applied (or the learner caught up), not a heartbeat later.
				for g, members := range c.want {
					c.reconcileMembers(g, members)
				}
			case <-t.C:
				waiting = false
			}
		}
	}
}

// heartbeat sends one heartbeat and acts on the answer: the MDS's view of
// this chunkserver's copysets (members, leaders) is carried out here.
func (c *ChunkServer) heartbeat(ctx context.Context) error {
	resp, err := c.sendHeartbeat(ctx)
	if err != nil || resp == nil {
		return err
	}
	c.learn(ctx, resp)
	if err := c.startListed(ctx, resp.GetCopysets()); err != nil {
		return err
	}
	c.reconcileListed(resp.GetCopysets())
	c.transferLeaders(resp.GetCopysets(), resp.GetTransferLeaders())
	c.dropUnlisted(resp.GetCopysets())
	return nil
}

// sendHeartbeat reports this chunkserver's disk, IO counters and copysets
// and returns the MDS's answer; nil without an error when the MDS had
// forgotten this chunkserver and it registered again.
func (c *ChunkServer) sendHeartbeat(ctx context.Context) (*api.HeartbeatResponse, error) {
	capacity, used, err := c.store.Usage()
	if err != nil {
		c.log.Warn("disk usage unavailable", "err", err)
	}
	req := &api.HeartbeatRequest{
		Id: c.ID(), Addr: c.addr, CapacityBytes: capacity, UsedBytes: used, DiskState: c.diskState(),
		ReadOps: c.stats.readOps.Load(), WriteOps: c.stats.writeOps.Load(),
		ReadBytes: c.stats.readBytes.Load(), WriteBytes: c.stats.writeBytes.Load(),
	}
	for _, gs := range c.host.Groups() {
		pool, id := api.SplitGroupID(gs.ID)
		req.Copysets = append(req.Copysets, &api.CopysetStatus{
			PoolId: pool, CopysetId: id, Leader: gs.IsLeader, Term: gs.Term,
			AppliedIndex: gs.Applied, CommitIndex: gs.Commit, Voters: gs.Voters,
			Learners: gs.Learners, Healthy: gs.Healthy, LeaderId: gs.Leader, VotersOutgoing: gs.VotersOutgoing,
		})
	}
	hctx, cancel := context.WithTimeout(ctx, max(c.cfg.HeartbeatInterval, time.Second))
	defer cancel()
	resp, err := c.mds.Heartbeat(hctx, req)
	if status.Code(err) == codes.NotFound {
		// The MDS does not know this chunkserver (its metadata was reset):
		// register again, with the id this data directory holds.
		c.log.Warn("MDS forgot this chunkserver; registering again", "err", err)
		return nil, c.register(ctx)
	}
	return resp, err
}

// learn takes the peers' addresses, the pools and the volumes revision from
// a heartbeat answer.
func (c *ChunkServer) learn(ctx context.Context, resp *api.HeartbeatResponse) {
	addrs := make(map[uint64]string, len(resp.GetPeers()))
	for _, p := range resp.GetPeers() {
		addrs[p.GetId()] = p.GetAddr()
	}
	c.peers.SetPeers(addrs)
	if ks := resp.GetCapabilityKeys(); len(ks) > 0 {
		keys := make([]capability.Key, 0, len(ks))
		for _, k := range ks {
			keys = append(keys, capability.Key{ID: k.GetId(), Public: k.GetPublicKey()})
		}
		c.capKeys.Set(keys)
	}
	c.vols.addPools(resp.GetPools())
	if c.vols.stale(resp.GetVolumesRevision()) {
		if err := c.vols.refresh(ctx); err != nil {
			c.log.Warn("volume list refresh failed", "err", err)
		}
	}
}

// startListed starts the listed copysets this chunkserver does not host yet:
// a copyset with epoch 0 is bootstrapped with its members, a later one is
// joined empty and filled by its leader.
func (c *ChunkServer) startListed(ctx context.Context, listed []*api.Copyset) error {
	for _, cs := range listed {
		g := api.GroupID(cs.GetPoolId(), cs.GetId())
		if c.replica(g) != nil {
			continue
		}
		chunkSize, ok := c.vols.poolChunkSize(cs.GetPoolId())
		if !ok {
			if err := c.vols.refresh(ctx); err != nil {
				return err
			}
			if chunkSize, ok = c.vols.poolChunkSize(cs.GetPoolId()); !ok {
				c.log.Warn("copyset of an unknown pool", "copyset", g)
				continue
			}
		}
		join := cs.GetEpoch() != 0
		if err := c.startGroup(g, int64(chunkSize), cs.GetMembers(), join); err != nil {
			c.log.Error("cannot start copyset", "copyset", g, "err", err)
		}
	}
	return nil
}

// reconcileListed remembers the members the MDS lists for each copyset it
// moved (epoch != 0) and steps each toward them (members.go); Run's loop
// keeps stepping between heartbeats.
func (c *ChunkServer) reconcileListed(listed []*api.Copyset) {
	c.want = make(map[uint64][]uint64)
	for _, cs := range listed {
		// Raft messages from the listed members are accepted even before this
		// replica applied the conf change that added them (raftstore guard).
		c.host.SetMembers(api.GroupID(cs.GetPoolId(), cs.GetId()), cs.GetMembers())
		if cs.GetEpoch() != 0 {
			g := api.GroupID(cs.GetPoolId(), cs.GetId())
			c.want[g] = cs.GetMembers()
			c.reconcileMembers(g, cs.GetMembers())
		}
	}
}

// transferLeaders balances leadership: each copyset named in transfers
// hands it to the member the MDS names, if that is a listed member and a
// voter here that is caught up (a dead one soon is not). Raft refuses every
// proposal while a transfer runs (until it succeeds or times out after an
// election timeout), so a copyset starts one at most once per transferBackoff.
func (c *ChunkServer) transferLeaders(listed []*api.Copyset, transfers []*api.LeaderTransfer) {
	if len(transfers) == 0 {
		return
	}
	members := make(map[uint64][]uint64, len(listed))
	for _, cs := range listed {
		members[api.GroupID(cs.GetPoolId(), cs.GetId())] = cs.GetMembers()
	}
	now := time.Now()
	for _, tl := range transfers {
		g, to := api.GroupID(tl.GetPoolId(), tl.GetCopysetId()), tl.GetTo()
		st, ok := c.host.Status(g)
		if !ok || !st.IsLeader || to == c.ID() || !slices.Contains(st.Voters, to) ||
			!slices.Contains(members[g], to) || st.Progress[to]+learnerCatchUp < st.Applied ||
			now.Sub(c.transferAt[g]) < transferBackoff {
			continue
		}
		c.transferAt[g] = now
		c.host.TransferLeader(g, to)
	}
}

// dropUnlisted deals with the hosted copysets the MDS no longer lists for
// this chunkserver: a leader hands leadership over, and the replica is
// removed once it is gone from the group (members.go).
func (c *ChunkServer) dropUnlisted(listed []*api.Copyset) {
	isListed := make(map[uint64]bool, len(listed))
	for _, cs := range listed {
		isListed[api.GroupID(cs.GetPoolId(), cs.GetId())] = true
	}
	now := time.Now()
	for _, st := range c.host.Groups() {
		if isListed[st.ID] {
			delete(c.unlisted, st.ID)
			continue
		}
		since, ok := c.unlisted[st.ID]
		if !ok {
			since = now
			c.unlisted[st.ID] = now
		}
		c.handOver(st)
		c.removeIfGone(st, now.Sub(since))
		if c.replica(st.ID) == nil {
			delete(c.unlisted, st.ID)
		}
	}
}

// diskState is the heartbeat's disk state: OK, or why this chunkserver
// cannot serve (a replica stopped by a disk error, a stalled WAL).
func (c *ChunkServer) diskState() api.DiskState {
	c.mu.RLock()
	err := c.diskErr
	c.mu.RUnlock()
	if err == nil && c.host != nil {
		// A group the raft host stopped because the WAL failed (ENOSPC, EIO)
		// never reached an Apply: record its error too.
		for _, st := range c.host.Groups() {
			// A group stopped by a raft panic (ErrRaftPanic) is not a disk
			// failure: the heartbeat reports that replica unhealthy, and only it.
			if !st.Healthy && st.Err != nil && !errors.Is(st.Err, raftstore.ErrRaftPanic) {
				c.mu.Lock()
				if c.diskErr == nil {
					c.diskErr = st.Err
					c.log.Error("copyset replica stopped by a WAL error", "copyset", st.ID, "err", st.Err)
				}
				err = c.diskErr
				c.mu.Unlock()
				break
			}
		}
	}
	if err == nil && c.walStalled.Load() {
		return api.DiskState_DISK_STATE_IO_ERROR
	}
	return diskStateOf(err)
}

// compactWAL makes the groups that pin the oldest WAL segment snapshot when
// the WAL holds more segments than it should.
func (c *ChunkServer) compactWAL() {
	if c.wal.SegmentCount() <= c.cfg.MaxWALSegments {
		return
	}
	for _, g := range c.wal.PinningGroups() {
		c.host.Snapshot(g)
	}
}
