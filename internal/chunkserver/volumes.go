package chunkserver

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// volumeInfo is what the data plane checks a request against.
type volumeInfo struct {
	Size         uint64
	Pool         uint32
	ChunkSize    uint64
	CopysetCount uint32
}

// volumeCache mirrors the MDS's volumes and pools. It is refreshed when a
// heartbeat reports a new volumes_revision, and (at most once per missInterval)
// when a request names a volume it does not know.
//
// Goroutines: any; refreshes are serialized by refreshMu. Lock order: refreshMu
// before mu.
type volumeCache struct {
	mds          api.MDSClient
	log          *slog.Logger
	missInterval time.Duration // guarded by refreshMu
	// onDeleted is told the volumes that vanished from the MDS's list.
	onDeleted func(ids []uint64)

	refreshMu sync.Mutex
	lastMiss  time.Time // guarded by refreshMu

	mu       sync.RWMutex
	vols     map[uint64]volumeInfo
	pools    map[uint32]uint64 // chunk size by pool id
	deleted  map[uint64]bool   // volumes seen once, then gone: deleted (ids are never reused)
	revision uint64
	loaded   bool
}

func newVolumeCache(mds api.MDSClient, log *slog.Logger, onDeleted func([]uint64)) *volumeCache {
	if onDeleted == nil {
		onDeleted = func([]uint64) {}
	}
	return &volumeCache{
		mds:          mds,
		log:          log,
		missInterval: time.Second,
		onDeleted:    onDeleted,
		vols:         make(map[uint64]volumeInfo),
		deleted:      make(map[uint64]bool),
	}
}

// lookup returns the volume's geometry.
func (vc *volumeCache) lookup(id uint64) (volumeInfo, bool) {
	vc.mu.RLock()
	defer vc.mu.RUnlock()
	v, ok := vc.vols[id]
	return v, ok
}

// addPools records the chunk sizes of pools a heartbeat response names.
func (vc *volumeCache) addPools(pools []*api.Pool) {
	if len(pools) == 0 {
		return
	}
	vc.mu.Lock()
	defer vc.mu.Unlock()
	if vc.pools == nil {
		vc.pools = make(map[uint32]uint64)
	}
	for _, p := range pools {
		if p.GetChunkSize() > 0 {
			vc.pools[p.GetId()] = p.GetChunkSize()
		}
	}
}

// poolChunkSize returns the chunk size of a pool.
func (vc *volumeCache) poolChunkSize(pool uint32) (uint64, bool) {
	vc.mu.RLock()
	defer vc.mu.RUnlock()
	cs, ok := vc.pools[pool]
	return cs, ok && cs > 0
}

// isDeleted reports whether the volume was seen and then deleted.
func (vc *volumeCache) isDeleted(id uint64) bool {
	vc.mu.RLock()
	defer vc.mu.RUnlock()
	return vc.deleted[id]
}

// stale reports whether the cache is older than the MDS's revision.
func (vc *volumeCache) stale(revision uint64) bool {
	vc.mu.RLock()
	defer vc.mu.RUnlock()
	return !vc.loaded || vc.revision != revision
}

// refresh reloads volumes and pools from the MDS.
func (vc *volumeCache) refresh(ctx context.Context) error {
	vc.refreshMu.Lock()
	defer vc.refreshMu.Unlock()
	return vc.refreshLocked(ctx)
}

// refreshMiss refreshes for an unknown volume id, at most once per
// missInterval. It reports whether id is known afterwards.
func (vc *volumeCache) refreshMiss(ctx context.Context, id uint64) bool {
	vc.refreshMu.Lock()
	defer vc.refreshMu.Unlock()
	if _, ok := vc.lookup(id); ok {
		return true // another refresh found it meanwhile
	}
	if time.Since(vc.lastMiss) < vc.missInterval {
		return false
	}
	vc.lastMiss = time.Now()
	if err := vc.refreshLocked(ctx); err != nil {
		vc.log.Warn("volume cache refresh failed", "err", err)
		return false
	}
	_, ok := vc.lookup(id)
	return ok
}

func (vc *volumeCache) refreshLocked(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pr, err := vc.mds.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil {
		return err
	}
	vr, err := vc.mds.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil {
		return err
	}
	pools := make(map[uint32]*api.Pool, len(pr.GetPools()))
	for _, p := range pr.GetPools() {
		pools[p.GetId()] = p
	}
	vols := make(map[uint64]volumeInfo, len(vr.GetVolumes()))
	for _, v := range vr.GetVolumes() {
		p := pools[v.GetPoolId()]
		if p == nil || p.GetChunkSize() == 0 || p.GetCopysetCount() == 0 {
			vc.log.Warn("volume in an unknown pool", "volume", v.GetId(), "pool", v.GetPoolId())
			continue
		}
		vols[v.GetId()] = volumeInfo{Size: v.GetSize(), Pool: v.GetPoolId(),
			ChunkSize: p.GetChunkSize(), CopysetCount: p.GetCopysetCount()}
	}
	var gone []uint64
	vc.mu.Lock()
	for id := range vc.vols {
		if _, ok := vols[id]; !ok {
			vc.deleted[id] = true
			gone = append(gone, id)
		}
	}
	vc.vols = vols
	vc.pools = make(map[uint32]uint64, len(pools))
	for id, p := range pools {
		vc.pools[id] = p.GetChunkSize()
	}
	vc.revision = vr.GetRevision()
	vc.loaded = true
	vc.mu.Unlock()
	if len(gone) > 0 {
		vc.log.Info("volumes deleted", "volumes", gone)
		vc.onDeleted(gone)
	}
	return nil
}
