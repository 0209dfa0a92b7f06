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
		pool, id := api.SplitGroupID(g)
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
//     does not report the listed members as its voters yet, or reports a
//     joint configuration (or, without a
//     record, a leader reporting other voters); once reported it is done.
//     A move whose target went bad failed: it is no longer in flight and
//     its copyset is repaired again. Moves in flight fill the Budget
//     (MaxRecoveryMoves in all, MaxMovesPerChunkserver per target and per
//     leader).
//  3. Repairs: members that are sick or whose replica reports itself
//     unhealthy (reason "disk"), then dead members (reason "dead").
//  4. Balance, only when every member of every copyset is online with a
//     healthy disk and nothing needs repair: copyset counts per replicated pool (a pool of
//     one replica is left as placed: placement by fit, docs/design.md §9, is not
//     built), then — with no move in
//     flight or planned — leaders (MaxLeaderTransfers in flight).
func (s *Server) planRound(t *topology, now time.Time) plan {
	nodes := s.classifyChunkservers(t, now) // 1
	hints := s.leaderHints(now)
	s.expireTransfers(hints, now)
	r := s.surveyCopysets(t, nodes, hints, now) // 2
	r.planRepairs()                             // 3
	if !r.calm || s.cfg.DisableBalance {        // 4
		return r.out
	}
	r.planBalance()
	if r.out.inFlight > 0 || len(r.out.start) > 0 {
		return r.out
	}
	r.out.transfers = s.planLeaderTransfers(r.all, nodes.serving)
	return r.out
}

// nodeStates is how one round sees the chunkservers (planRound, step 1).
type nodeStates struct {
	all     []placement.Node
	online  map[uint64]bool
	sick    map[uint64]bool // online, disk state FULL or IO_ERROR
	dead    map[uint64]bool // offline longer than RecoveryGrace
	targets map[uint64]bool // may receive new replicas
	serving map[uint64]bool // online with a healthy disk (may be full)
}

// classifyChunkservers is planRound's step 1. Caller holds s.mu.
func (s *Server) classifyChunkservers(t *topology, now time.Time) nodeStates {
	n := nodeStates{
		online:  map[uint64]bool{},
		sick:    map[uint64]bool{},
		dead:    map[uint64]bool{},
		targets: map[uint64]bool{},
		serving: map[uint64]bool{},
	}
	for id, r := range t.chunkservers {
		n.all = append(n.all, placement.Node{ID: id, Zone: r.Zone, Server: r.Server})
		l := s.live[id]
		if s.isOnline(id, now) {
			n.online[id] = true
			// UNKNOWN: registered, no heartbeat yet.
			okDisk := l.disk == api.DiskState_DISK_STATE_OK || l.disk == api.DiskState_DISK_STATE_UNKNOWN
			n.sick[id] = !okDisk
			full := l.capacity > 0 && l.used*100 >= l.capacity*fullPercent
			n.targets[id] = okDisk && !full
			n.serving[id] = okDisk
			continue
		}
		since := s.activeSince
		if l != nil && l.last.After(since) {
			since = l.last
		}
		if s.cfg.RecoveryGrace >= 0 && now.Sub(since) > s.cfg.RecoveryGrace {
			n.dead[id] = true
		}
	}
	return n
}

// expireTransfers forgets the leader transfers that took effect or timed
// out. Caller holds s.mu.
func (s *Server) expireTransfers(hints map[uint64]uint64, now time.Time) {
	for g, tr := range s.transfers {
		if hints[g] == tr.to || now.After(tr.until) {
			delete(s.transfers, g)
		}
	}
}

// copysetRef names a copyset within its pool.
type copysetRef struct {
	pool uint32
	id   uint32
}

// round is the working state of one planRound after its survey of the
// copysets (step 2); the later steps add their moves to out.
type round struct {
	out     plan
	budget  *placement.Budget
	pools   map[uint32]*placement.Pool
	reasons map[copysetRef]map[uint64]string // why each bad member must move
	failed  map[copysetRef]uint64            // the target of a move that went bad
	// all: every copyset by group id, leaders as planned (for leader balancing).
	all []placement.Copyset
	// calm: every member of every copyset serves and none needs repair.
	calm bool
}

// surveyCopysets is planRound's step 2: which members are bad and why,
// which moves are done, failed or in flight (they take their share of the
// budget). Caller holds s.mu.
func (s *Server) surveyCopysets(t *topology, nodes nodeStates, hints map[uint64]uint64, now time.Time) *round {
	r := &round{
		budget:  placement.NewBudget(s.cfg.MaxRecoveryMoves, s.cfg.MaxMovesPerChunkserver),
		pools:   map[uint32]*placement.Pool{},
		reasons: map[copysetRef]map[uint64]string{},
		failed:  map[copysetRef]uint64{},
		calm:    true,
	}
	load := map[uint64]int{}
	for _, cs := range t.copysets {
		for _, c := range cs {
			for _, m := range c.Members {
				load[m]++
			}
		}
	}
	for _, pool := range sortedPools(t.copysets) {
		replicas := len(t.copysets[pool][0].Members)
		if pr, ok := t.pools[pool]; ok {
			replicas = int(pr.Replicas)
		}
		pp := &placement.Pool{Replicas: replicas, Nodes: nodes.all, Targets: nodes.targets, Load: load}
		r.pools[pool] = pp
		for _, c := range t.copysets[pool] {
			g := api.GroupID(pool, c.ID)
			k := copysetRef{pool, c.ID}
			leader := hints[g]
			if !slices.Contains(c.Members, leader) || !nodes.online[leader] {
				leader = 0
			}
			pc := placement.Copyset{ID: uint64(c.ID), Members: c.Members, Leader: leader}
			why := map[uint64]string{}
			for _, m := range c.Members {
				st := s.replicaStatus(m, g)
				if nodes.sick[m] || (st != nil && !st.Healthy) {
					pc.Bad = append(pc.Bad, m)
					why[m] = reasonDisk
				}
			}
			for _, m := range c.Members {
				if nodes.dead[m] {
					pc.Bad = append(pc.Bad, m)
					why[m] = reasonDead
				}
				if !nodes.serving[m] {
					r.calm = false
				}
			}
			r.reasons[k] = why
			converged := s.converged(g, c.Members, leader)
			switch {
			case c.Move != nil && converged:
				r.out.done = append(r.out.done, move{pool: pool, copyset: c.ID, from: c.Move.From, to: c.Move.To,
					reason: c.Move.Reason, leader: leader})
			case c.Move != nil && why[c.Move.To] != "":
				r.failed[k] = c.Move.To // target went bad: repair anew
			case c.Move != nil || (c.Epoch > 0 && s.changing(pool, c, now)):
				pc.Busy = true
				to := uint64(0)
				if c.Move != nil {
					to = c.Move.To
				}
				r.budget.Use(to, leader)
				r.out.inFlight++
			}
			if len(pc.Bad) > 0 {
				r.calm = false
			}
			pp.Copysets = append(pp.Copysets, pc)
			// A transfer in flight counts as done: planning from the old
			// leader (heartbeats lag) overshot and leaders ping-ponged.
			planned := leader
			if tr := s.transfers[g]; tr.to != 0 {
				planned = tr.to
			}
			r.all = append(r.all, placement.Copyset{ID: g, Members: c.Members, Leader: planned,
				Busy: pc.Busy || s.transfers[g].to != 0})
		}
	}
	return r
}

// planRepairs is planRound's step 3: replace bad members, within the budget.
func (r *round) planRepairs() {
	for _, pool := range sortedPools(r.pools) {
		for _, m := range placement.Repairs(*r.pools[pool], r.budget) {
			k := copysetRef{pool, uint32(m.Copyset)}
			r.out.start = append(r.out.start, move{pool: pool, copyset: uint32(m.Copyset), from: m.From, to: m.To,
				reason: r.reasons[k][m.From], leader: leaderOf(r.pools[pool], m.Copyset), failed: r.failed[k]})
		}
	}
}

// planBalance is the first half of planRound's step 4: even out copyset
// counts per replicated pool, within the budget.
func (r *round) planBalance() {
	for _, pool := range sortedPools(r.pools) {
		if r.pools[pool].Replicas < 2 {
			continue // a local pool (docs/design.md §9) is left as placed, not balanced by count
		}
		for _, m := range placement.Balance(*r.pools[pool], r.budget) {
			r.out.start = append(r.out.start, move{pool: pool, copyset: uint32(m.Copyset), from: m.From, to: m.To,
				reason: reasonBalance, leader: leaderOf(r.pools[pool], m.Copyset)})
		}
	}
}

// planLeaderTransfers is the second half of planRound's step 4: even out
// leaders, at most MaxLeaderTransfers in flight. Caller holds s.mu.
func (s *Server) planLeaderTransfers(all []placement.Copyset, serving map[uint64]bool) map[uint64]placement.Transfer {
	room := s.cfg.MaxLeaderTransfers - len(s.transfers)
	if room <= 0 {
		return nil
	}
	out := map[uint64]placement.Transfer{}
	for _, tr := range placement.LeaderTransfers(all, serving, room) {
		out[tr.Copyset] = tr
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
// its voters, no learners and no joint configuration (whose incoming half
// may already be members while the old member still counts for quorum).
// Caller holds s.mu.
func (s *Server) converged(g uint64, members []uint64, leader uint64) bool {
	if leader == 0 {
		return false
	}
	st := s.live[leader].copysets[g]
	if st == nil || !st.Leader || len(st.Learners) > 0 || len(st.VotersOutgoing) > 0 {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(st.Voters)), members)
}

// changing reports whether a copyset's leader (as heartbeats tell) has a
// configuration other than the listed members: a move still in flight.
// Caller holds s.mu.
func (s *Server) changing(pool uint32, c copysetRecord, now time.Time) bool {
	g := api.GroupID(pool, c.ID)
	for _, m := range c.Members {
		if !s.isOnline(m, now) {
			continue
		}
		st, ok := s.live[m].copysets[g]
		if !ok || !st.Leader || len(st.Voters) == 0 {
			continue // no leader's view of the configuration here
		}
		voters := slices.Sorted(slices.Values(st.Voters))
		return !slices.Equal(voters, c.Members) || len(st.Learners) > 0 || len(st.VotersOutgoing) > 0
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
			s.log.Info("copyset move done", "copyset", api.GroupID(m.pool, m.copyset), "pool", m.pool,
				"id", m.copyset, "from", m.from, "to", m.to, "reason", m.reason, "took", took[i].Round(time.Millisecond))
		}
		for i, m := range started {
			args := []any{"copyset", api.GroupID(m.pool, m.copyset), "pool", m.pool, "id", m.copyset,
				"from", m.from, "to", m.to, "reason", m.reason, "leader", m.leader, "epoch", epochs[i]}
			if m.failed != 0 {
				args = append(args, "replaces_failed_target", m.failed)
			}
			s.log.Info("copyset move started", args...)
		}
	}
	return nil
}
