package mds

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/internal/placement"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Scheduler defaults.
const (
	DefaultRecoveryGrace          = 10 * time.Minute
	DefaultScheduleInterval       = 5 * time.Second
	DefaultMaxRecoveryMoves       = 4
	DefaultMaxMovesPerChunkserver = 2
	DefaultMaxLeaderTransfers     = 2
)

// fullPercent: a chunkserver whose disk is at least this full receives no
// new replicas.
const fullPercent = 95

// Why a member moves (the copyset record's move.reason, and logs).
const (
	reasonDead    = "dead"    // offline longer than RecoveryGrace
	reasonDisk    = "disk"    // its replica stopped on a disk error, or its disk is full / failing
	reasonBalance = "balance" // evening out copyset counts
)

// moveRecord is a member change in flight, kept in the copyset record until
// the copyset's leader reports the new configuration.
type moveRecord struct {
	From      uint64 `json:"from"`
	To        uint64 `json:"to"`
	Reason    string `json:"reason"`
	StartedMs int64  `json:"started_unix_ms"`
}

func (m *moveRecord) proto() *api.CopysetMove {
	if m == nil {
		return nil
	}
	return &api.CopysetMove{From: m.From, To: m.To, Reason: m.Reason, StartedUnixMs: m.StartedMs}
}

// move replaces one member of one copyset (started), or records that a
// move finished (done).
type move struct {
	pool     uint32
	copyset  uint32
	from, to uint64
	reason   string
	leader   uint64
	failed   uint64 // the target of an earlier move this one replaces (it went bad)
}

// pendingTransfer is a leader transfer the heartbeat answers carry to the
// copyset's leader until it took effect or timed out. In Server.transfers,
// under Server.mu.
type pendingTransfer struct {
	from, to uint64
	until    time.Time
}

// plan is one scheduler round's decisions.
type plan struct {
	start     []move
	done      []move // moves whose new configuration the leader reports
	transfers map[uint64]placement.Transfer
	inFlight  int
}

// schedule runs the scheduler while Run runs: every ScheduleInterval, on
// the active MDS, one round (scheduleOnce).
func (s *Server) schedule(ctx context.Context) {
	t := time.NewTicker(s.cfg.ScheduleInterval)
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
		if err := s.scheduleOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("scheduler round failed", "err", err)
		}
	}
}

// scheduleOnce plans one round from the topology and the heartbeats
// (planRound), commits its member moves to etcd and arms its leader
// transfers. See doc.go, "Scheduler".
func (s *Server) scheduleOnce(ctx context.Context) error {
	t, err := s.readTopology(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	s.mu.Lock()
	p := s.planRound(t, now)
	for g, tr := range p.transfers {
		s.transfers[g] = pendingTransfer{from: tr.From, to: tr.To, until: now.Add(leaderTransferTimeout(s.cfg))}
	}
	s.mu.Unlock()
	s.m.movesInFlight.Set(float64(p.inFlight + len(p.start) - len(p.done)))
	for g, tr := range p.transfers {
		pool, id := placement.SplitGroupID(g)
		s.m.transfers.Inc()
		s.log.Info("copyset leader transfer", "copyset", g, "pool", pool, "id", id,
			"from", tr.From, "to", tr.To, "reason", reasonBalance)
	}
	if len(p.start) == 0 && len(p.done) == 0 {
		return nil
	}
	return s.commitMoves(ctx, p.start, p.done)
}

// leaderTransferTimeout: a transfer not done after this is forgotten (and
// may be planned again).
func leaderTransferTimeout(cfg Config) time.Duration {
	return max(10*time.Second, 3*cfg.ScheduleInterval)
}

// planRound decides one round. Caller holds s.mu.
//
//  1. Chunkservers: online, sick (online, disk state FULL or IO_ERROR), dead
//     (offline longer than RecoveryGrace; never with a negative grace),
//     target (online, disk state OK and below fullPercent used).
//  2. Copysets: a move in flight is one with a move record whose leader
//     does not report the listed members as its voters yet (or, without a
//     record, a leader reporting other voters); once reported it is done.
//     A move whose target went bad failed: it is no longer in flight and
//     its copyset is repaired again. Moves in flight fill the Budget
//     (MaxRecoveryMoves in all, MaxMovesPerChunkserver per target and per
//     leader).
//  3. Repairs: members that are sick or whose replica reports itself
//     unhealthy (reason "disk"), then dead members (reason "dead").
//  4. Balance, only when every member of every copyset is online with a
//     healthy disk and nothing needs repair: copyset counts per replicated pool (a pool of
//     one replica is placed by fit, DESIGN §9), then — with no move in
//     flight or planned — leaders (MaxLeaderTransfers in flight).
func (s *Server) planRound(t *topology, now time.Time) plan {
	online := map[uint64]bool{}
	sick := map[uint64]bool{}
	dead := map[uint64]bool{}
	targets := map[uint64]bool{}
	serving := map[uint64]bool{} // online with a healthy disk (may be full)
	var nodes []placement.Node
	for id, r := range t.chunkservers {
		nodes = append(nodes, placement.Node{ID: id, Zone: r.Zone, Server: r.Server})
		l := s.live[id]
		if s.isOnline(id, now) {
			online[id] = true
			// UNKNOWN: registered, no heartbeat yet.
			okDisk := l.disk == api.DiskState_DISK_STATE_OK || l.disk == api.DiskState_DISK_STATE_UNKNOWN
			sick[id] = !okDisk
			full := l.capacity > 0 && l.used*100 >= l.capacity*fullPercent
			targets[id] = okDisk && !full
			serving[id] = okDisk
			continue
		}
		since := s.activeSince
		if l != nil && l.last.After(since) {
			since = l.last
		}
		if s.cfg.RecoveryGrace >= 0 && now.Sub(since) > s.cfg.RecoveryGrace {
			dead[id] = true
		}
	}
	hints := s.leaderHints(now)
	for g, tr := range s.transfers {
		if hints[g] == tr.to || now.After(tr.until) {
			delete(s.transfers, g)
		}
	}

	var out plan
	budget := placement.NewBudget(s.cfg.MaxRecoveryMoves, s.cfg.MaxMovesPerChunkserver)
	load := map[uint64]int{}
	for _, cs := range t.copysets {
		for _, c := range cs {
			for _, m := range c.Members {
				load[m]++
			}
		}
	}
	calm := true
	type key struct {
		pool uint32
		id   uint32
	}
	reasons := map[key]map[uint64]string{}
	failed := map[key]uint64{}
	pools := map[uint32]*placement.Pool{}
	var all []placement.Copyset
	for _, pool := range sortedPools(t.copysets) {
		replicas := len(t.copysets[pool][0].Members)
		if pr, ok := t.pools[pool]; ok {
			replicas = int(pr.Replicas)
		}
		pp := &placement.Pool{Replicas: replicas, Nodes: nodes, Targets: targets, Load: load}
		pools[pool] = pp
		for _, c := range t.copysets[pool] {
			g := placement.GroupID(pool, c.ID)
			k := key{pool, c.ID}
			leader := hints[g]
			if !slices.Contains(c.Members, leader) || !online[leader] {
				leader = 0
			}
			pc := placement.Copyset{ID: uint64(c.ID), Members: c.Members, Leader: leader}
			why := map[uint64]string{}
			for _, m := range c.Members {
				st := s.replicaStatus(m, g)
				if sick[m] || (st != nil && !st.Healthy) {
					pc.Bad = append(pc.Bad, m)
					why[m] = reasonDisk
				}
			}
			for _, m := range c.Members {
				if dead[m] {
					pc.Bad = append(pc.Bad, m)
					why[m] = reasonDead
				}
				if !serving[m] {
					calm = false
				}
			}
			reasons[k] = why
			converged := s.converged(g, c.Members, leader)
			switch {
			case c.Move != nil && converged:
				out.done = append(out.done, move{pool: pool, copyset: c.ID, from: c.Move.From, to: c.Move.To,
					reason: c.Move.Reason, leader: leader})
			case c.Move != nil && why[c.Move.To] != "":
				failed[k] = c.Move.To // target went bad: repair anew
			case c.Move != nil || (c.Epoch > 0 && s.changing(pool, c, now)):
				pc.Busy = true
				to := uint64(0)
				if c.Move != nil {
					to = c.Move.To
				}
				budget.Use(to, leader)
				out.inFlight++
			}
			if len(pc.Bad) > 0 {
				calm = false
			}
			pp.Copysets = append(pp.Copysets, pc)
			// A transfer in flight counts as done: planning from the old
			// leader (heartbeats lag) overshot and leaders ping-ponged.
			planned := leader
			if tr := s.transfers[g]; tr.to != 0 {
				planned = tr.to
			}
			all = append(all, placement.Copyset{ID: g, Members: c.Members, Leader: planned,
				Busy: pc.Busy || s.transfers[g].to != 0})
		}
	}
	for _, pool := range sortedPools(pools) {
		for _, m := range placement.Repairs(*pools[pool], budget) {
			k := key{pool, uint32(m.Copyset)}
			out.start = append(out.start, move{pool: pool, copyset: uint32(m.Copyset), from: m.From, to: m.To,
				reason: reasons[k][m.From], leader: leaderOf(pools[pool], m.Copyset), failed: failed[k]})
		}
	}
	if !calm || s.cfg.DisableBalance {
		return out
	}
	for _, pool := range sortedPools(pools) {
		if pools[pool].Replicas < 2 {
			continue // a local pool (DESIGN §9) is placed by fit, not count
		}
		for _, m := range placement.Balance(*pools[pool], budget) {
			out.start = append(out.start, move{pool: pool, copyset: uint32(m.Copyset), from: m.From, to: m.To,
				reason: reasonBalance, leader: leaderOf(pools[pool], m.Copyset)})
		}
	}
	if out.inFlight > 0 || len(out.start) > 0 {
		return out
	}
	room := s.cfg.MaxLeaderTransfers - len(s.transfers)
	if room > 0 {
		out.transfers = map[uint64]placement.Transfer{}
		for _, tr := range placement.LeaderTransfers(all, serving, room) {
			out.transfers[tr.Copyset] = tr
		}
	}
	return out
}

func leaderOf(p *placement.Pool, id uint64) uint64 {
	for _, c := range p.Copysets {
		if c.ID == id {
			return c.Leader
		}
	}
	return 0
}

// replicaStatus is the status chunkserver m last reported for group g, if
// it is online. Caller holds s.mu.
func (s *Server) replicaStatus(m, g uint64) *api.CopysetStatus {
	if !s.isOnline(m, time.Now()) {
		return nil
	}
	return s.live[m].copysets[g]
}

// converged reports whether the copyset's leader reports exactly members as
// its voters and no learners. Caller holds s.mu.
func (s *Server) converged(g uint64, members []uint64, leader uint64) bool {
	if leader == 0 {
		return false
	}
	st := s.live[leader].copysets[g]
	if st == nil || !st.Leader || len(st.Learners) > 0 {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(st.Voters)), members)
}

// changing reports whether a copyset's leader (as heartbeats tell) has a
// configuration other than the listed members: a move still in flight.
// Caller holds s.mu.
func (s *Server) changing(pool uint32, c copysetRecord, now time.Time) bool {
	g := placement.GroupID(pool, c.ID)
	for _, m := range c.Members {
		if !s.isOnline(m, now) {
			continue
		}
		st, ok := s.live[m].copysets[g]
		if !ok || !st.Leader || len(st.Voters) == 0 {
			continue // no leader's view of the configuration here
		}
		voters := slices.Sorted(slices.Values(st.Voters))
		return !slices.Equal(voters, c.Members) || len(st.Learners) > 0
	}
	return false
}

// commitMoves writes a round's moves, one transaction per pool: a started
// move replaces its member (if still there), records the move and bumps the
// epoch; a finished move's record is cleared (if it is still that move).
func (s *Server) commitMoves(ctx context.Context, start, done []move) error {
	byPool := map[uint32][]move{}
	for _, m := range start {
		byPool[m.pool] = append(byPool[m.pool], m)
	}
	finished := map[uint32][]move{}
	for _, m := range done {
		finished[m.pool] = append(finished[m.pool], m)
		if byPool[m.pool] == nil {
			byPool[m.pool] = nil
		}
	}
	nowMs := time.Now().UnixMilli()
	for _, pool := range sortedPools(byPool) {
		var started, cleared []move
		var epochs []uint64
		var took []time.Duration
		err := s.txn(ctx, func(stm concurrency.STM) error {
			started, cleared, epochs, took = started[:0], cleared[:0], epochs[:0], took[:0]
			v := stm.Get(copysetKey(pool))
			if v == "" {
				return nil // pool gone
			}
			cs, err := decode[[]copysetRecord](v)
			if err != nil {
				return err
			}
			at := func(id uint32) (*copysetRecord, error) {
				if int(id) >= len(cs) || cs[id].ID != id {
					return nil, fmt.Errorf("mds: copyset %d of pool %d is not at its index", id, pool)
				}
				return &cs[id], nil
			}
			for _, m := range finished[pool] {
				c, err := at(m.copyset)
				if err != nil {
					return err
				}
				if c.Move != nil && c.Move.From == m.from && c.Move.To == m.to {
					took = append(took, time.Duration(nowMs-c.Move.StartedMs)*time.Millisecond)
					c.Move = nil
					cleared = append(cleared, m)
				}
			}
			for _, m := range byPool[pool] {
				c, err := at(m.copyset)
				if err != nil {
					return err
				}
				i := slices.Index(c.Members, m.from)
				if i < 0 || slices.Contains(c.Members, m.to) {
					continue // changed meanwhile
				}
				c.Members = slices.Clone(c.Members)
				c.Members[i] = m.to
				slices.Sort(c.Members)
				c.Epoch++
				c.Move = &moveRecord{From: m.from, To: m.to, Reason: m.reason, StartedMs: nowMs}
				started = append(started, m)
				epochs = append(epochs, c.Epoch)
			}
			if len(started) > 0 || len(cleared) > 0 {
				stm.Put(copysetKey(pool), encode(cs))
				bumpTopologyRevision(stm)
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.m.moves.Add(float64(len(started)))
		for i, m := range cleared {
			s.log.Info("copyset move done", "copyset", placement.GroupID(m.pool, m.copyset), "pool", m.pool,
				"id", m.copyset, "from", m.from, "to", m.to, "reason", m.reason, "took", took[i].Round(time.Millisecond))
		}
		for i, m := range started {
			args := []any{"copyset", placement.GroupID(m.pool, m.copyset), "pool", m.pool, "id", m.copyset,
				"from", m.from, "to", m.to, "reason", m.reason, "leader", m.leader, "epoch", epochs[i]}
			if m.failed != 0 {
				args = append(args, "replaces_failed_target", m.failed)
			}
			s.log.Info("copyset move started", args...)
		}
	}
	return nil
}
