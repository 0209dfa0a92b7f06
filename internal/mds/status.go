package mds

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/basalt-storage/basalt/pkg/api"
)

// Copyset health, as ClusterStatus counts it:
//   - healthy: every member online (and its replica healthy), a leader
//     known among them, and the leader's Raft configuration equal to the
//     listed members (no move in flight);
//   - unavailable: no majority of members online and healthy;
//   - degraded: the rest — a majority is up but a member is down, or no
//     leader has been reported yet.
type health int

const (
	healthy health = iota
	degraded
	unavailable
)

// copysetHealth classifies one copyset. Caller holds s.mu.
func (s *Server) copysetHealth(pool uint32, c copysetRecord, leader uint64, now time.Time) health {
	g := api.GroupID(pool, c.ID)
	up, leaderUp := 0, false
	for _, m := range c.Members {
		if !s.isOnline(m, now) {
			continue
		}
		if st, ok := s.live[m].copysets[g]; ok && !st.Healthy {
			continue // the replica reported itself stopped
		}
		up++
		leaderUp = leaderUp || m == leader
	}
	switch {
	case up*2 <= len(c.Members):
		return unavailable
	case up == len(c.Members) && leaderUp && !s.changing(pool, c, now):
		return healthy
	}
	return degraded
}

// ClusterStatus summarizes the cluster for `basalt status`.
func (h *handler) ClusterStatus(ctx context.Context, _ *api.ClusterStatusRequest) (*api.ClusterStatusResponse, error) {
	s := h.s
	t, err := s.readTopology(ctx)
	if err != nil {
		return nil, err
	}
	vols, err := s.cli.Get(ctx, volumePrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, err
	}
	mds, err := s.allMDS(ctx)
	if err != nil {
		return nil, err
	}
	resp := &api.ClusterStatusResponse{
		ActiveMds:             s.advertise,
		Mds:                   mds,
		Volumes:               uint32(vols.Count),
		LeadersPerChunkserver: map[uint64]uint32{},
	}
	for _, id := range sortedPools(t.pools) {
		resp.Pools = append(resp.Pools, t.pools[id].proto())
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := map[uint64]bool{}
	for id := range t.chunkservers {
		ids[id] = true
	}
	for _, id := range sortedIDs(ids) {
		resp.Chunkservers = append(resp.Chunkservers, s.chunkserverProto(t.chunkservers[id], now))
		resp.LeadersPerChunkserver[id] = 0
	}
	hints := s.leaderHints(now)
	for _, pool := range sortedPools(t.copysets) {
		for _, c := range t.copysets[pool] {
			cp := copysetProto(pool, c, hints)
			resp.Copysets = append(resp.Copysets, cp)
			switch s.copysetHealth(pool, c, cp.LeaderHint, now) {
			case healthy:
				resp.CopysetsHealthy++
			case degraded:
				resp.CopysetsDegraded++
			default:
				resp.CopysetsUnavailable++
			}
			if c.Move != nil {
				resp.MovesInFlight++
			}
			if cp.LeaderHint != 0 {
				resp.LeadersPerChunkserver[cp.LeaderHint]++
			}
		}
	}
	return resp, nil
}
