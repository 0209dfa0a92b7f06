package mds

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/pkg/api"
)

// liveCS is what the active MDS knows about a chunkserver from its
// heartbeats. It lives only in memory (Server.live, under Server.mu).
type liveCS struct {
	last     time.Time
	online   bool // as last logged by monitor
	capacity uint64
	used     uint64
	disk     api.DiskState // from the last heartbeat; UNKNOWN before the first
	// copysets: the replica statuses of its last heartbeat, by group id.
	copysets map[uint64]*api.CopysetStatus
}

// isOnline reports whether a heartbeat (or registration) arrived within
// HeartbeatTimeout. Caller holds s.mu.
func (s *Server) isOnline(id uint64, now time.Time) bool {
	l := s.live[id]
	return l != nil && now.Sub(l.last) <= s.cfg.HeartbeatTimeout
}

// monitor logs chunkservers going offline and coming back and keeps the
// chunkserver gauges current. It runs for the life of Run.
func (s *Server) monitor(ctx context.Context) {
	t := time.NewTicker(max(s.cfg.HeartbeatTimeout/4, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.crashed:
			return
		case <-t.C:
		}
		if !s.active.Load() {
			continue
		}
		now := time.Now()
		on, off := 0, 0
		s.mu.Lock()
		for id, l := range s.live {
			online := s.isOnline(id, now)
			if online != l.online {
				l.online = online
				if online {
					s.log.Info("chunkserver online", "chunkserver", id)
				} else {
					s.log.Warn("chunkserver offline", "chunkserver", id,
						"last_heartbeat", l.last.Format(time.RFC3339), "timeout", s.cfg.HeartbeatTimeout)
				}
			}
			if online {
				on++
			} else {
				off++
			}
		}
		s.mu.Unlock()
		s.m.chunkservers.WithLabelValues("online").Set(float64(on))
		s.m.chunkservers.WithLabelValues("offline").Set(float64(off))
	}
}

// touch records a sign of life of chunkserver id. Caller holds s.mu.
func (s *Server) touch(id uint64, now time.Time) *liveCS {
	l := s.live[id]
	if l == nil {
		l = &liveCS{copysets: map[uint64]*api.CopysetStatus{}}
		s.live[id] = l
	}
	if !l.online {
		l.online = true
		s.log.Info("chunkserver online", "chunkserver", id)
	}
	l.last = now
	return l
}

// RegisterChunkServer gives a new chunkserver its id, or updates the
// address and domains of a known one re-registering with its id.
func (h *handler) RegisterChunkServer(ctx context.Context, req *api.RegisterChunkServerRequest) (*api.RegisterChunkServerResponse, error) {
	s := h.s
	if req.Addr == "" {
		return nil, fmt.Errorf("%w: addr (the chunkserver's data-plane host:port) is required", ErrInvalidArgument)
	}
	// With TLS, the certificate names the id: a chunkserver registers as
	// that id or not at all.
	certID, err := checkChunkserver(ctx, req.Id, "register")
	if err != nil {
		return nil, err
	}
	rec := chunkserverRecord{
		Zone: req.Zone, Server: req.Server, Addr: req.Addr, DataDir: req.DataDir,
		Capacity: req.CapacityBytes, RegisteredMs: time.Now().UnixMilli(),
	}
	if rec.Zone == "" {
		rec.Zone = "default"
	}
	if rec.Server == "" {
		rec.Server = req.Addr
	}
	var old chunkserverRecord
	err = s.txn(ctx, func(stm concurrency.STM) error {
		old = chunkserverRecord{}
		rec.ID = req.Id
		if rec.ID == 0 && certID != 0 {
			// A first registration under a certificate: the id is the
			// certificate's. If that id is registered already, this is a
			// new (or wiped) data directory: taking the id would make a
			// member with no data look like one that has it. It needs a
			// certificate for a new id.
			if v := stm.Get(chunkserverKey(certID)); v != "" {
				o, err := decode[chunkserverRecord](v)
				if err != nil {
					return err
				}
				return fmt.Errorf("%w: chunkserver %d is registered (data directory %s on %s), and this is a new data directory; "+
					"a new data directory needs a certificate for a new id (basalt cert issue --role chunkserver --name N)",
					ErrAlreadyExists, certID, o.DataDir, o.Server)
			}
			rec.ID = certID
			// Keep the counter above every certificate id, so an id handed
			// out by number never collides with one.
			cur, err := counter(stm, idChunkserver)
			if err != nil {
				return err
			}
			if cur < certID {
				stm.Put(idsPrefix+idChunkserver, strconv.FormatUint(certID, 10))
			}
		} else if rec.ID == 0 {
			id, err := nextID(stm, idChunkserver)
			if err != nil {
				return err
			}
			rec.ID = id
		} else {
			v := stm.Get(chunkserverKey(rec.ID))
			if v == "" {
				return fmt.Errorf("%w: chunkserver %d is not registered (was the MDS's etcd data lost?); register with id 0 for a new id", ErrNotFound, rec.ID)
			}
			o, err := decode[chunkserverRecord](v)
			if err != nil {
				return err
			}
			old = o
		}
		stm.Put(chunkserverKey(rec.ID), encode(rec))
		bumpTopologyRevision(stm)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	l := s.touch(rec.ID, time.Now())
	l.capacity = req.CapacityBytes
	s.mu.Unlock()
	if req.Id == 0 {
		s.log.Info("chunkserver registered", "chunkserver", rec.ID, "addr", rec.Addr, "zone", rec.Zone, "server", rec.Server)
	} else if old.Addr != rec.Addr || old.Zone != rec.Zone || old.Server != rec.Server {
		s.log.Info("chunkserver re-registered", "chunkserver", rec.ID, "addr", rec.Addr, "old_addr", old.Addr,
			"zone", rec.Zone, "server", rec.Server)
	}
	return &api.RegisterChunkServerResponse{Id: rec.ID}, nil
}

// topology is one consistent read of chunkservers, pools, copysets and the
// volumes revision. A *topology is shared (cached) and never modified.
type topology struct {
	rev          int64 // ModRevision of topologyRevKey when read
	chunkservers map[uint64]chunkserverRecord
	copysets     map[uint32][]copysetRecord // by pool id
	pools        map[uint32]poolRecord
	volumesRev   uint64
}

// readTopology returns the current topology. Heartbeats call it every
// second per chunkserver, so the decoded chunkservers, pools and copysets
// are cached and re-read only when topologyRevKey moved (every write to
// them bumps it); each call costs one small read otherwise.
func (s *Server) readTopology(ctx context.Context) (*topology, error) {
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(topologyRevKey), clientv3.OpGet(volumesRevKey)).Commit()
	if err != nil {
		return nil, err
	}
	rev := modRev(resp.Responses[0].GetResponseRange().Kvs)
	vrev := uint64(modRev(resp.Responses[1].GetResponseRange().Kvs))
	s.topoMu.Lock()
	cached := s.topo
	s.topoMu.Unlock()
	if cached != nil && cached.rev == rev {
		if cached.volumesRev == vrev {
			return cached, nil
		}
		t := *cached // the maps are shared, read-only
		t.volumesRev = vrev
		return &t, nil
	}
	t, err := s.loadTopology(ctx)
	if err != nil {
		return nil, err
	}
	s.topoMu.Lock()
	if s.topo == nil || s.topo.rev < t.rev {
		s.topo = t
	}
	s.topoMu.Unlock()
	return t, nil
}

func modRev(kvs []*mvccpb.KeyValue) int64 {
	if len(kvs) == 0 {
		return 0
	}
	return kvs[0].ModRevision
}

// loadTopology reads the whole topology in one transaction.
func (s *Server) loadTopology(ctx context.Context) (*topology, error) {
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(chunkserverPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(copysetPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(volumesRevKey),
		clientv3.OpGet(poolPrefix, clientv3.WithPrefix()),
		clientv3.OpGet(topologyRevKey),
	).Commit()
	if err != nil {
		return nil, err
	}
	t := &topology{chunkservers: map[uint64]chunkserverRecord{}, copysets: map[uint32][]copysetRecord{},
		pools: map[uint32]poolRecord{}}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		r, err := decode[chunkserverRecord](string(kv.Value))
		if err != nil {
			return nil, err
		}
		t.chunkservers[r.ID] = r
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		pool, err := poolIDFromCopysetKey(string(kv.Key))
		if err != nil {
			return nil, fmt.Errorf("mds: bad copyset key %q", kv.Key)
		}
		cs, err := decode[[]copysetRecord](string(kv.Value))
		if err != nil {
			return nil, err
		}
		t.copysets[pool] = cs
	}
	t.volumesRev = uint64(modRev(resp.Responses[2].GetResponseRange().Kvs))
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		p, err := decode[poolRecord](string(kv.Value))
		if err != nil {
			return nil, err
		}
		t.pools[p.ID] = p
	}
	t.rev = modRev(resp.Responses[4].GetResponseRange().Kvs)
	return t, nil
}

// leaderHints derives each copyset's leader from the replica statuses of
// online chunkservers: the leader reported with the highest term wins.
// Caller holds s.mu.
func (s *Server) leaderHints(now time.Time) map[uint64]uint64 {
	type lt struct{ leader, term uint64 }
	best := map[uint64]lt{}
	for id, l := range s.live {
		if !s.isOnline(id, now) {
			continue
		}
		for g, st := range l.copysets {
			leader := st.LeaderId
			if st.Leader {
				leader = id
			}
			if leader == 0 {
				continue
			}
			if b, ok := best[g]; !ok || st.Term > b.term {
				best[g] = lt{leader, st.Term}
			}
		}
	}
	out := make(map[uint64]uint64, len(best))
	for g, b := range best {
		out[g] = b.leader
	}
	return out
}

// copysetProto builds the wire form of a copyset with its leader hint.
func copysetProto(pool uint32, c copysetRecord, hints map[uint64]uint64) *api.Copyset {
	return &api.Copyset{PoolId: pool, Id: c.ID, Members: append([]uint64(nil), c.Members...),
		LeaderHint: hints[api.GroupID(pool, c.ID)], Epoch: c.Epoch, Move: c.Move.proto()}
}

// chunkserverProto builds the wire form of a chunkserver with its liveness.
// Caller holds s.mu.
func (s *Server) chunkserverProto(r chunkserverRecord, now time.Time) *api.ChunkServer {
	cs := &api.ChunkServer{Id: r.ID, Zone: r.Zone, Server: r.Server, Addr: r.Addr, DataDir: r.DataDir,
		CapacityBytes: r.Capacity}
	if l := s.live[r.ID]; l != nil {
		cs.Online = s.isOnline(r.ID, now)
		cs.LastHeartbeatUnixMs = l.last.UnixMilli()
		if l.capacity != 0 {
			cs.CapacityBytes = l.capacity
		}
		cs.UsedBytes = l.used
		cs.DiskState = l.disk
	}
	return cs
}

// Heartbeat records a chunkserver's liveness and copyset statuses and
// answers with the copysets it must host and its peers' addresses.
func (h *handler) Heartbeat(ctx context.Context, req *api.HeartbeatRequest) (*api.HeartbeatResponse, error) {
	s := h.s
	if _, err := checkChunkserver(ctx, req.Id, "heartbeat"); err != nil {
		return nil, err
	}
	if req.Id == 0 {
		return nil, fmt.Errorf("%w: heartbeat without a chunkserver id", ErrInvalidArgument)
	}
	t, err := s.readTopology(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := t.chunkservers[req.Id]; !ok {
		return nil, fmt.Errorf("%w: chunkserver %d is not registered; register first", ErrNotFound, req.Id)
	}
	now := time.Now()
	keys, err := s.capabilityKeys(ctx)
	if err != nil {
		return nil, err
	}
	resp := &api.HeartbeatResponse{VolumesRevision: t.volumesRev, CapabilityKeys: keys}
	peers := map[uint64]bool{}

	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.touch(req.Id, now)
	l.used, l.disk = req.UsedBytes, req.DiskState
	if req.CapacityBytes != 0 {
		l.capacity = req.CapacityBytes
	}
	l.copysets = make(map[uint64]*api.CopysetStatus, len(req.Copysets))
	for _, st := range req.Copysets {
		l.copysets[api.GroupID(st.PoolId, st.CopysetId)] = st
	}
	hints := s.leaderHints(now)
	for _, pool := range sortedPools(t.copysets) {
		inPool := false
		for _, c := range t.copysets[pool] {
			member := false
			for _, m := range c.Members {
				member = member || m == req.Id
			}
			if !member {
				continue
			}
			resp.Copysets = append(resp.Copysets, copysetProto(pool, c, hints))
			inPool = true
			for _, m := range c.Members {
				if m != req.Id {
					peers[m] = true
				}
			}
		}
		if p, ok := t.pools[pool]; ok && inPool {
			resp.Pools = append(resp.Pools, p.proto())
		}
	}
	for _, id := range sortedIDs(peers) {
		if r, ok := t.chunkservers[id]; ok {
			resp.Peers = append(resp.Peers, s.chunkserverProto(r, now))
		}
	}
	for g, tr := range s.transfers {
		if tr.from == req.Id {
			pool, id := api.SplitGroupID(g)
			resp.TransferLeaders = append(resp.TransferLeaders, &api.LeaderTransfer{PoolId: pool, CopysetId: id, To: tr.to})
		}
	}
	return resp, nil
}

// ListChunkServers lists every registered chunkserver with its liveness.
func (h *handler) ListChunkServers(ctx context.Context, _ *api.ListChunkServersRequest) (*api.ListChunkServersResponse, error) {
	s := h.s
	recs, err := getPrefix[chunkserverRecord](ctx, s.cli, chunkserverPrefix)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	resp := &api.ListChunkServersResponse{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		resp.Chunkservers = append(resp.Chunkservers, s.chunkserverProto(r, now))
	}
	return resp, nil
}

func sortedPools[V any](m map[uint32]V) []uint32 {
	out := make([]uint32, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func sortedIDs(m map[uint64]bool) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
