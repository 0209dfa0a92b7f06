package mds

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/internal/placement"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Pool limits.
const (
	DefaultReplicas    = 3
	MaxReplicas        = 5
	DefaultChunkSize   = 16 << 20
	MinChunkSize       = 1 << 20
	MaxChunkSize       = 1 << 30
	MaxCopysetsPerPool = 16384 // keeps a pool's copyset record well under etcd's value limit
)

// nameRE is the rule for pool and volume names.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func checkName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: %s name %q: use 1 to 128 characters from A-Z a-z 0-9 . _ -", ErrInvalidArgument, kind, name)
	}
	return nil
}

// CreatePool creates a pool and places its copysets on the chunkservers
// online now.
func (h *handler) CreatePool(ctx context.Context, req *api.CreatePoolRequest) (*api.CreatePoolResponse, error) {
	s := h.s
	if err := checkName("pool", req.Name); err != nil {
		return nil, err
	}
	rec := poolRecord{Name: req.Name, Replicas: req.Replicas, ChunkSize: req.ChunkSize,
		CopysetCount: req.CopysetCount, CreatedMs: time.Now().UnixMilli()}
	if rec.Replicas == 0 {
		rec.Replicas = DefaultReplicas
	}
	if rec.Replicas > MaxReplicas {
		return nil, fmt.Errorf("%w: replicas %d: must be 1 to %d", ErrInvalidArgument, rec.Replicas, MaxReplicas)
	}
	if rec.ChunkSize == 0 {
		rec.ChunkSize = DefaultChunkSize
	}
	if rec.ChunkSize < MinChunkSize || rec.ChunkSize > MaxChunkSize || rec.ChunkSize&(rec.ChunkSize-1) != 0 {
		return nil, fmt.Errorf("%w: chunk size %d: must be a power of two from 1 MiB to 1 GiB", ErrInvalidArgument, rec.ChunkSize)
	}
	if rec.CopysetCount > MaxCopysetsPerPool {
		return nil, fmt.Errorf("%w: copyset count %d: at most %d", ErrInvalidArgument, rec.CopysetCount, MaxCopysetsPerPool)
	}

	t, err := s.readTopology(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var nodes []placement.Node
	s.mu.Lock()
	for _, r := range t.chunkservers {
		if s.isOnline(r.ID, now) {
			nodes = append(nodes, placement.Node{ID: r.ID, Zone: r.Zone, Server: r.Server})
		}
	}
	s.mu.Unlock()
	if rec.CopysetCount == 0 {
		rec.CopysetCount = uint32(min(MaxCopysetsPerPool, placement.DefaultCopysets(len(nodes), int(rec.Replicas))))
	}
	members, err := placement.Place(nodes, int(rec.CopysetCount), int(rec.Replicas))
	if errors.Is(err, placement.ErrNotEnoughDomains) {
		return nil, fmt.Errorf("%w: pool %q needs %d replicas in distinct zones (or servers); %d chunkservers online: %v",
			ErrFailedPrecondition, req.Name, rec.Replicas, len(nodes), err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	copysets := make([]copysetRecord, len(members))
	for i, m := range members {
		copysets[i] = copysetRecord{ID: uint32(i), Members: m}
	}
	err = s.txn(ctx, func(stm concurrency.STM) error {
		if stm.Get(poolNameKey(rec.Name)) != "" {
			return fmt.Errorf("%w: pool %q exists", ErrAlreadyExists, rec.Name)
		}
		id, err := nextID(stm, idPool)
		if err != nil {
			return err
		}
		if id > 1<<32-1 {
			return fmt.Errorf("%w: pool ids exhausted", ErrFailedPrecondition)
		}
		rec.ID = uint32(id)
		stm.Put(poolKey(rec.ID), encode(rec))
		stm.Put(poolNameKey(rec.Name), fmt.Sprint(rec.ID))
		stm.Put(copysetKey(rec.ID), encode(copysets))
		bumpTopologyRevision(stm)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("pool created", "pool", rec.ID, "name", rec.Name, "replicas", rec.Replicas,
		"chunk_size", rec.ChunkSize, "copysets", rec.CopysetCount, "chunkservers", len(nodes))
	return &api.CreatePoolResponse{Pool: rec.proto()}, nil
}

// ListPools lists every pool, by id.
func (h *handler) ListPools(ctx context.Context, _ *api.ListPoolsRequest) (*api.ListPoolsResponse, error) {
	pools, err := getPrefix[poolRecord](ctx, h.s.cli, poolPrefix)
	if err != nil {
		return nil, err
	}
	resp := &api.ListPoolsResponse{}
	for _, p := range pools {
		resp.Pools = append(resp.Pools, p.proto())
	}
	return resp, nil
}

// GetCopysets returns a pool's copysets with leader hints, and the
// chunkservers that are their members.
func (h *handler) GetCopysets(ctx context.Context, req *api.GetCopysetsRequest) (*api.GetCopysetsResponse, error) {
	cs, servers, err := h.s.poolCopysets(ctx, req.PoolId)
	if err != nil {
		return nil, err
	}
	return &api.GetCopysetsResponse{Copysets: cs, Chunkservers: servers}, nil
}

// poolCopysets returns the copysets of pool and their member chunkservers.
func (s *Server) poolCopysets(ctx context.Context, pool uint32) ([]*api.Copyset, []*api.ChunkServer, error) {
	t, err := s.readTopology(ctx)
	if err != nil {
		return nil, nil, err
	}
	recs, ok := t.copysets[pool]
	if !ok {
		return nil, nil, fmt.Errorf("%w: pool %d does not exist", ErrNotFound, pool)
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	hints := s.leaderHints(now)
	members := map[uint64]bool{}
	out := make([]*api.Copyset, 0, len(recs))
	for _, c := range recs {
		out = append(out, copysetProto(pool, c, hints))
		for _, m := range c.Members {
			members[m] = true
		}
	}
	var servers []*api.ChunkServer
	for _, id := range sortedIDs(members) {
		if r, ok := t.chunkservers[id]; ok {
			servers = append(servers, s.chunkserverProto(r, now))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out, servers, nil
}
