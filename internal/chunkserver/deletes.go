package chunkserver

import (
	"context"
	"time"
)

// deleteCheckInterval is how often a chunkserver looks, in the copysets it
// leads, for volumes the MDS no longer lists, besides every time its volume
// cache sees volumes go.
const deleteCheckInterval = 10 * time.Second

// deleteLoop runs a delete pass at every kick and every deleteCheckInterval
// until ctx ends. It runs on a goroutine of its own.
func (c *ChunkServer) deleteLoop(ctx context.Context, kick <-chan struct{}) {
	t := time.NewTicker(deleteCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-t.C:
		}
		c.proposeDeletes(ctx)
	}
}

// proposeDeletes proposes a delete-volume entry in each copyset this
// chunkserver leads for each volume the copyset has epochs or chunks of and
// the MDS does not list. Deletion is thus a raft entry: every replica applies
// it, in log order, including one that was down when the volume was deleted
// (it gets the entry, or a snapshot with the tombstone, when it is back).
//
// Why a missing volume is a deleted one: the copyset's volumes are read
// first, the MDS's list after. A volume with epochs or chunks here was
// created before a write to it was accepted, so before the first read; if a
// list read later lacks it, it was deleted (ids are never reused). A volume
// the cache still lists is skipped: its deletion reaches the cache with the
// next volumes revision, which runs another pass.
func (c *ChunkServer) proposeDeletes(ctx context.Context) {
	type candidate struct {
		r    *replica
		vols []uint64
	}
	// 1. What each led copyset holds, before the MDS is asked.
	var cands []candidate
	for _, g := range c.host.Groups() {
		if !g.IsLeader || !g.Healthy {
			continue
		}
		r := c.replica(g.ID)
		if r == nil {
			continue
		}
		vols, err := r.sm.liveVolumes()
		if err != nil {
			continue
		}
		var unknown []uint64
		for _, v := range vols {
			if _, ok := c.vols.lookup(v); !ok {
				unknown = append(unknown, v)
			}
		}
		if len(unknown) > 0 {
			cands = append(cands, candidate{r, unknown})
		}
	}
	if len(cands) == 0 {
		return
	}
	// 2. The MDS's list, read after step 1.
	listed, err := c.vols.refreshListed(ctx)
	if err != nil {
		c.log.Warn("volume list unavailable; deleted volumes are looked for again later", "err", err)
		return
	}
	// 3. Tombstone what it lacks. A proposal that fails (leadership moved)
	// is made again by a later pass, here or on the new leader.
	for _, cd := range cands {
		for _, v := range cd.vols {
			if listed[v] {
				continue
			}
			g, v := cd.r.group, v
			c.log.Info("proposing the deletion of a volume the MDS no longer lists", "copyset", g, "volume", v)
			propose(c.host, g, command{Op: cmdDeleteVolume, Volume: v}, nil, func(err error) {
				if err != nil {
					c.log.Info("delete-volume proposal failed; retried later", "copyset", g, "volume", v, "err", err)
				}
			})
		}
	}
}
