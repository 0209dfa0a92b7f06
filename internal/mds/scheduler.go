package mds

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/internal/placement"
)

// Scheduler defaults.
const (
	DefaultRecoveryGrace    = 10 * time.Minute
	DefaultScheduleInterval = 5 * time.Second
	DefaultMaxRecoveryMoves = 4
)

// move replaces one member of one copyset.
type move struct {
	pool     uint32
	copyset  uint32
	from, to uint64
}

// schedule runs the recovery scheduler while Run runs: every
// ScheduleInterval, on the active MDS, it re-replicates the copysets of
// chunkservers that have been offline longer than RecoveryGrace.
func (s *Server) schedule(ctx context.Context) {
	if s.cfg.RecoveryGrace < 0 {
		return
	}
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
		if err := s.recoverOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("recovery round failed", "err", err)
		}
	}
}

// recoverOnce plans and commits at most MaxRecoveryMoves member
// replacements (fewer while earlier moves are still in flight: a copyset
// whose leader reports voters other than its listed members).
//
// A copyset is repaired only while a majority of its members is online:
// the leader adds the new member as a learner, lets it catch up, promotes
// it and removes the dead one (the chunkservers' side of the protocol).
// The replacement is the least-loaded online chunkserver in a zone (else
// on a server) none of the surviving members uses; ties go to the one
// sharing the fewest copysets with the survivors (scatter width).
func (s *Server) recoverOnce(ctx context.Context) error {
	t, err := s.readTopology(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	dead := map[uint64]bool{}
	online := map[uint64]bool{}
	pending := 0
	s.mu.Lock()
	for id := range t.chunkservers {
		if s.isOnline(id, now) {
			online[id] = true
			continue
		}
		since := s.activeSince
		if l := s.live[id]; l != nil && l.last.After(since) {
			since = l.last
		}
		if now.Sub(since) > s.cfg.RecoveryGrace {
			dead[id] = true
		}
	}
	for _, pool := range sortedPools(t.copysets) {
		for _, c := range t.copysets[pool] {
			if c.Epoch > 0 && s.changing(pool, c, now) {
				pending++
			}
		}
	}
	s.mu.Unlock()
	budget := s.cfg.MaxRecoveryMoves - pending
	if len(dead) == 0 || budget <= 0 {
		return nil
	}

	load := map[uint64]int{}
	pairs := map[[2]uint64]int{}
	for _, cs := range t.copysets {
		for _, c := range cs {
			for _, m := range c.Members {
				load[m]++
				for _, o := range c.Members {
					pairs[[2]uint64{m, o}]++
				}
			}
		}
	}
	var moves []move
	for _, pool := range sortedPools(t.copysets) {
		for _, c := range t.copysets[pool] {
			if budget == 0 {
				break
			}
			var from uint64
			up := 0
			for _, m := range c.Members {
				if dead[m] && from == 0 {
					from = m
				}
				if online[m] {
					up++
				}
			}
			if from == 0 || up*2 <= len(c.Members) {
				continue
			}
			to := pickReplacement(t, c.Members, from, online, load, pairs)
			if to == 0 {
				continue
			}
			moves = append(moves, move{pool: pool, copyset: c.ID, from: from, to: to})
			load[to]++
			load[from]--
			for _, o := range c.Members {
				if o != from {
					pairs[[2]uint64{to, o}]++
					pairs[[2]uint64{o, to}]++
				}
			}
			budget--
		}
	}
	if len(moves) == 0 {
		return nil
	}
	return s.commitMoves(ctx, moves)
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

// pickReplacement chooses the chunkserver that takes from's place in a
// copyset with members, or 0 if none fits.
func pickReplacement(t *topology, members []uint64, from uint64, online map[uint64]bool,
	load map[uint64]int, pairs map[[2]uint64]int) uint64 {
	for _, level := range []placement.DomainLevel{placement.DomainZone, placement.DomainServer} {
		used := map[string]bool{}
		for _, m := range members {
			if m != from {
				used[domainOf(t.chunkservers[m], level)] = true
			}
		}
		var best uint64
		bestShared := 0
		for _, id := range sortedIDs(online) {
			if slices.Contains(members, id) || used[domainOf(t.chunkservers[id], level)] {
				continue
			}
			shared := 0
			for _, m := range members {
				if m != from {
					shared += pairs[[2]uint64{id, m}]
				}
			}
			if best == 0 || load[id] < load[best] || (load[id] == load[best] && shared < bestShared) {
				best, bestShared = id, shared
			}
		}
		if best != 0 {
			return best
		}
	}
	return 0
}

func domainOf(r chunkserverRecord, level placement.DomainLevel) string {
	if level == placement.DomainZone {
		return r.Zone
	}
	return r.Zone + "\x00" + r.Server
}

// commitMoves writes the moves, one transaction per pool: the copyset's
// member is replaced (if it is still there), its epoch bumped.
func (s *Server) commitMoves(ctx context.Context, moves []move) error {
	byPool := map[uint32][]move{}
	for _, m := range moves {
		byPool[m.pool] = append(byPool[m.pool], m)
	}
	for _, pool := range sortedPools(byPool) {
		var done []move
		var epochs []uint64
		err := s.txn(ctx, func(stm concurrency.STM) error {
			done, epochs = done[:0], epochs[:0]
			v := stm.Get(copysetKey(pool))
			if v == "" {
				return nil // pool gone
			}
			cs, err := decode[[]copysetRecord](v)
			if err != nil {
				return err
			}
			for _, m := range byPool[pool] {
				if int(m.copyset) >= len(cs) || cs[m.copyset].ID != m.copyset {
					return fmt.Errorf("mds: copyset %d of pool %d is not at its index", m.copyset, pool)
				}
				c := &cs[m.copyset]
				i := slices.Index(c.Members, m.from)
				if i < 0 || slices.Contains(c.Members, m.to) {
					continue // changed meanwhile
				}
				c.Members = slices.Clone(c.Members)
				c.Members[i] = m.to
				slices.Sort(c.Members)
				c.Epoch++
				done = append(done, m)
				epochs = append(epochs, c.Epoch)
			}
			if len(done) > 0 {
				stm.Put(copysetKey(pool), encode(cs))
				bumpTopologyRevision(stm)
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.m.moves.Add(float64(len(done)))
		for i, m := range done {
			s.log.Info("copyset re-replicated", "copyset", placement.GroupID(m.pool, m.copyset), "pool", m.pool,
				"from", m.from, "to", m.to, "epoch", epochs[i])
		}
	}
	return nil
}
