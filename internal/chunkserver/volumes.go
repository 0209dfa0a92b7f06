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
// heartbeat reports a new volumes_revision, and before a request is answered
// NO_SUCH_VOLUME: a volume created a moment ago is never refused because the
// cache had not heard of it yet.
//
// Goroutines: any; refreshes are serialized by refreshMu, and the refreshes
// that misses ask for run on one goroutine at a time (runMisses). Lock order:
// refreshMu before mu; missMu is a leaf.
type volumeCache struct {
	mds api.MDSClient
	log *slog.Logger
	// onDeleted is told the volumes that vanished from the MDS's list.
	onDeleted func(ids []uint64)

	refreshMu sync.Mutex

	// missMu guards next and missRunning.
	// INVARIANT: a miss waits for a refresh that starts after the miss joined
	// it (next is not started yet), so the list it reads is newer than the
	// request; concurrent misses share one refresh.
	missMu      sync.Mutex
	next        *missFlight // the refresh misses join; started once the running one ends
	missRunning bool        // runMisses is running

	mu       sync.RWMutex
	vols     map[uint64]volumeInfo
	pools    map[uint32]uint64 // chunk size by pool id
	copysets map[uint32]uint32 // copyset count by pool id
	deleted  map[uint64]bool   // volumes seen once, then gone: deleted (ids are never reused)
	revision uint64
	loaded   bool
}

// missFlight is one refresh that misses wait for.
type missFlight struct {
	done    chan struct{} // closed when the refresh ended
	err     error         // set before done is closed
	waiters int           // misses waiting on it (guarded by missMu; for tests)
}

func newVolumeCache(mds api.MDSClient, log *slog.Logger, onDeleted func([]uint64)) *volumeCache {
	if onDeleted == nil {
		onDeleted = func([]uint64) {}
	}
	return &volumeCache{
		mds:       mds,
		log:       log,
		onDeleted: onDeleted,
		vols:      make(map[uint64]volumeInfo),
		deleted:   make(map[uint64]bool),
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
	if vc.copysets == nil {
		vc.copysets = make(map[uint32]uint32)
	}
	for _, p := range pools {
		if p.GetChunkSize() > 0 {
			vc.pools[p.GetId()] = p.GetChunkSize()
		}
		if p.GetCopysetCount() > 0 {
			vc.copysets[p.GetId()] = p.GetCopysetCount()
		}
	}
}

// poolCopysets returns the copyset count of a pool (fixed when it is made).
func (vc *volumeCache) poolCopysets(pool uint32) (uint32, bool) {
	vc.mu.RLock()
	defer vc.mu.RUnlock()
	n, ok := vc.copysets[pool]
	return n, ok && n > 0
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
	_, err := vc.refreshListed(ctx)
	return err
}

// refreshListed refreshes and returns the ids of every volume the MDS listed
// (volumes of pools the cache cannot use included): a list read after
// refreshListed was called.
func (vc *volumeCache) refreshListed(ctx context.Context) (map[uint64]bool, error) {
	vc.refreshMu.Lock()
	defer vc.refreshMu.Unlock()
	return vc.refreshLocked(ctx)
}

// refreshMiss refreshes the cache for an unknown volume id, with a list read
// after it was called; concurrent misses share one refresh. It reports
// whether id is known afterwards; err is the refresh's error (the MDS could
// not be asked), nil when id was found or the MDS does not list it.
func (vc *volumeCache) refreshMiss(ctx context.Context, id uint64) (bool, error) {
	if _, ok := vc.lookup(id); ok {
		return true, nil
	}
	vc.missMu.Lock()
	f := vc.next
	if f == nil {
		f = &missFlight{done: make(chan struct{})}
		vc.next = f
		if !vc.missRunning {
			vc.missRunning = true
			go vc.runMisses(ctx)
		}
	}
	f.waiters++
	vc.missMu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if _, ok := vc.lookup(id); ok {
		return true, nil
	}
	return false, f.err
}

// runMisses runs the refreshes misses wait for, one after another, until
// none is wanted.
func (vc *volumeCache) runMisses(ctx context.Context) {
	for {
		vc.missMu.Lock()
		f := vc.next
		vc.next = nil
		if f == nil {
			vc.missRunning = false
			vc.missMu.Unlock()
			return
		}
		vc.missMu.Unlock()
		f.err = vc.refresh(ctx)
		if f.err != nil {
			vc.log.Warn("volume cache refresh failed", "err", f.err)
		}
		close(f.done)
	}
}

func (vc *volumeCache) refreshLocked(ctx context.Context) (map[uint64]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pr, err := vc.mds.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil {
		return nil, err
	}
	vr, err := vc.mds.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil {
		return nil, err
	}
	listed := make(map[uint64]bool, len(vr.GetVolumes()))
	pools := make(map[uint32]*api.Pool, len(pr.GetPools()))
	for _, p := range pr.GetPools() {
		pools[p.GetId()] = p
	}
	vols := make(map[uint64]volumeInfo, len(vr.GetVolumes()))
	for _, v := range vr.GetVolumes() {
		listed[v.GetId()] = true
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
	if vc.copysets == nil {
		vc.copysets = make(map[uint32]uint32, len(pools))
	}
	for id, p := range pools {
		vc.pools[id] = p.GetChunkSize()
		if p.GetCopysetCount() > 0 {
			vc.copysets[id] = p.GetCopysetCount()
		}
	}
	vc.revision = vr.GetRevision()
	vc.loaded = true
	vc.mu.Unlock()
	if len(gone) > 0 {
		vc.log.Info("volumes deleted", "volumes", gone)
		vc.onDeleted(gone)
	}
	return listed, nil
}
