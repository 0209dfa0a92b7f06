package mds

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// simCS is one simulated chunkserver of sim.
type simCS struct {
	id        uint64
	disk      api.DiskState   // heartbeat disk state; UNKNOWN is sent as OK
	down      bool            // sends no heartbeats
	unhealthy map[uint32]bool // copysets whose replica reports itself stopped
}

// sim plays the chunkservers of one pool against a real MDS: every tick,
// each chunkserver that is up heartbeats the copysets it is a member of. A
// copyset's leader is its first up, healthy member unless a transfer moved
// it; a member change converges (the leader reports the listed members as
// voters) lag after the MDS listed it. Leader transfers in heartbeat answers
// take effect at once. It records the largest number of moves in flight
// seen, in all and per chunkserver (receiver or leader).
type sim struct {
	t     *testing.T
	addrs []string // MDS addresses (mdsclient follows the active one)
	pool  uint32
	lag   time.Duration

	mu        sync.Mutex
	cs        map[uint64]*simCS
	leader    map[uint32]uint64
	voters    map[uint32][]uint64 // what the leader reports
	listedAt  map[uint32]time.Time
	epoch     map[uint32]uint64
	cur       []*api.Copyset
	maxMoves  int
	maxPerCS  int
	transfers int
	stop      chan struct{}
	wg        sync.WaitGroup
}

func newSim(t *testing.T, r *running, pool uint32, lag time.Duration, ids []uint64) *sim {
	return newSimAt(t, []string{r.s.Addr()}, pool, lag, ids)
}

func newSimAt(t *testing.T, addrs []string, pool uint32, lag time.Duration, ids []uint64) *sim {
	s := &sim{t: t, addrs: addrs, pool: pool, lag: lag, cs: map[uint64]*simCS{}, leader: map[uint32]uint64{},
		voters: map[uint32][]uint64{}, listedAt: map[uint32]time.Time{}, epoch: map[uint32]uint64{},
		stop: make(chan struct{})}
	for _, id := range ids {
		s.cs[id] = &simCS{id: id, unhealthy: map[uint32]bool{}}
	}
	s.wg.Add(1)
	go s.run()
	t.Cleanup(s.close)
	return s
}

func (s *sim) close() {
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	s.wg.Wait()
}

func (s *sim) with(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

func (s *sim) run() {
	defer s.wg.Done()
	c := dial(s.t, s.addrs...)
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.tick(ctx, c)
		cancel()
	}
}

// tick is one round of heartbeats.
func (s *sim) tick(ctx context.Context, c *mdsclient.Client) {
	{
		cur, err := c.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: s.pool})
		if err != nil {
			return
		}
		now := time.Now()
		s.mu.Lock()
		s.cur = cur.Copysets
		moves, per := 0, map[uint64]int{}
		for _, cs := range cur.Copysets {
			up := func(m uint64) bool {
				x := s.cs[m]
				return x != nil && !x.down && !x.unhealthy[cs.Id] && (x.disk == api.DiskState_DISK_STATE_UNKNOWN || x.disk == api.DiskState_DISK_STATE_OK)
			}
			if cs.Epoch != s.epoch[cs.Id] {
				s.epoch[cs.Id], s.listedAt[cs.Id] = cs.Epoch, now
			}
			if s.voters[cs.Id] == nil || now.Sub(s.listedAt[cs.Id]) >= s.lag {
				s.voters[cs.Id] = cs.Members
			}
			if l := s.leader[cs.Id]; !slices.Contains(cs.Members, l) || !up(l) {
				s.leader[cs.Id] = 0
				for _, m := range cs.Members {
					if up(m) {
						s.leader[cs.Id] = m
						break
					}
				}
			}
			if cs.Move != nil {
				moves++
				per[cs.Move.To]++
				if l := s.leader[cs.Id]; l != cs.Move.To {
					per[l]++
				}
			}
		}
		s.maxMoves = max(s.maxMoves, moves)
		for _, n := range per {
			s.maxPerCS = max(s.maxPerCS, n)
		}
		var reqs []*api.HeartbeatRequest
		for _, x := range s.cs {
			if x.down {
				continue
			}
			disk := x.disk
			if disk == api.DiskState_DISK_STATE_UNKNOWN {
				disk = api.DiskState_DISK_STATE_OK
			}
			req := &api.HeartbeatRequest{Id: x.id, DiskState: disk}
			for _, cs := range cur.Copysets {
				if !slices.Contains(cs.Members, x.id) {
					continue
				}
				req.Copysets = append(req.Copysets, &api.CopysetStatus{PoolId: cs.PoolId, CopysetId: cs.Id,
					Leader: s.leader[cs.Id] == x.id, Term: cs.Epoch + 1, Healthy: !x.unhealthy[cs.Id],
					Voters: s.voters[cs.Id], LeaderId: s.leader[cs.Id]})
			}
			reqs = append(reqs, req)
		}
		s.mu.Unlock()
		for _, req := range reqs {
			resp, err := c.Heartbeat(ctx, req)
			if err != nil {
				continue
			}
			s.mu.Lock()
			for _, tr := range resp.TransferLeaders {
				if s.leader[tr.CopysetId] == req.Id && tr.PoolId == s.pool {
					s.leader[tr.CopysetId] = tr.To
					s.transfers++
				}
			}
			s.mu.Unlock()
		}
	}
}

// counts returns, from the last GetCopysets, copysets and leaders per
// chunkserver, and the moves in flight.
func (s *sim) counts() (members, leaders map[uint64]int, moving int) {
	members, leaders = map[uint64]int{}, map[uint64]int{}
	s.with(func() {
		for id := range s.cs {
			members[id], leaders[id] = 0, 0
		}
		for _, cs := range s.cur {
			for _, m := range cs.Members {
				members[m]++
			}
			leaders[s.leader[cs.Id]]++
			if cs.Move != nil {
				moving++
			}
		}
	})
	return members, leaders, moving
}

func spread(m map[uint64]int, ids []uint64) (lo, hi int) {
	lo, hi = 1<<30, 0
	for _, id := range ids {
		lo, hi = min(lo, m[id]), max(hi, m[id])
	}
	return lo, hi
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSchedulerBalanceNewChunkserver: a pool placed on three chunkservers
// spreads onto a fourth that registers later, until copyset counts are
// even, with moves in flight never above the limits (2 in all, 1 per
// chunkserver); then leaders are evened out by transfers.
func TestSchedulerBalanceNewChunkserver(t *testing.T) {
	// The heartbeat timeout only has to outlast registering three chunkservers
	// and creating the pool before the simulation heartbeats them (over 1 s
	// under the race detector on a loaded machine: "2 chunkservers online").
	r := startMDS(t, Config{HeartbeatTimeout: 5 * time.Second, RecoveryGrace: time.Hour,
		ScheduleInterval: 100 * time.Millisecond, MaxRecoveryMoves: 2, MaxMovesPerChunkserver: 1})
	defer r.stop(t)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	var ids []uint64
	for _, z := range []string{"z1", "z2", "z3"} {
		ids = append(ids, register(t, c, z, "h"+z, "cs-"+z+":1"))
	}
	pool, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 12})
	if err != nil {
		t.Fatal(err)
	}
	s := newSim(t, r, pool.Pool.Id, 300*time.Millisecond, ids)
	// Everyone leads what the sim gives it (first member): uneven leaders.
	time.Sleep(time.Second)
	if _, _, moving := s.counts(); moving != 0 {
		t.Fatalf("%d moves on a balanced pool", moving)
	}
	id4 := register(t, c, "z4", "hz4", "cs-z4:1")
	ids = append(ids, id4)
	s.with(func() { s.cs[id4] = &simCS{id: id4, unhealthy: map[uint32]bool{}} })

	waitFor(t, 30*time.Second, "copysets balanced", func() error {
		members, _, moving := s.counts()
		if lo, hi := spread(members, ids); hi-lo > 0 || moving > 0 {
			return fmt.Errorf("members per chunkserver %v, %d moves in flight", members, moving)
		}
		return nil
	})
	waitFor(t, 30*time.Second, "leaders balanced", func() error {
		_, leaders, _ := s.counts()
		if lo, hi := spread(leaders, ids); hi-lo > 1 {
			return fmt.Errorf("leaders per chunkserver %v", leaders)
		}
		return nil
	})
	s.close()
	if s.maxMoves > 2 || s.maxPerCS > 1 {
		t.Fatalf("moves in flight reached %d in all, %d on one chunkserver; limits 2 and 1", s.maxMoves, s.maxPerCS)
	}
	if s.maxMoves == 0 {
		t.Fatal("no move was ever seen in flight")
	}
	t.Logf("max moves in flight %d, per chunkserver %d; %d leader transfers", s.maxMoves, s.maxPerCS, s.transfers)
}

// TestSchedulerDiskTrouble: a chunkserver whose disk state is FULL
// has its copysets moved at once (RecoveryGrace is an hour), a replica
// reporting itself stopped on a healthy chunkserver is moved too, and
// neither goes to a chunkserver in trouble.
func TestSchedulerDiskTrouble(t *testing.T) {
	r := startMDS(t, Config{HeartbeatTimeout: 5 * time.Second, RecoveryGrace: time.Hour,
		ScheduleInterval: 100 * time.Millisecond, MaxRecoveryMoves: 4, DisableBalance: true})
	defer r.stop(t)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	ids := registerZones(t, c, 5)
	pool, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 10})
	if err != nil {
		t.Fatal(err)
	}
	s := newSim(t, r, pool.Pool.Id, 200*time.Millisecond, ids)
	time.Sleep(500 * time.Millisecond)
	full := ids[0]
	var stopped uint32
	var stoppedOn uint64
	s.with(func() {
		s.cs[full].disk = api.DiskState_DISK_STATE_FULL
		for _, cs := range s.cur {
			if !slices.Contains(cs.Members, full) {
				stopped, stoppedOn = cs.Id, cs.Members[len(cs.Members)-1]
				s.cs[stoppedOn].unhealthy[cs.Id] = true
				break
			}
		}
	})
	start := time.Now()
	waitFor(t, 20*time.Second, "copysets moved off the full disk and the stopped replica", func() error {
		members, _, moving := s.counts()
		if members[full] != 0 || moving != 0 {
			return fmt.Errorf("full chunkserver still in %d copysets, %d moves in flight", members[full], moving)
		}
		var bad error
		s.with(func() {
			for _, cs := range s.cur {
				if cs.Id == stopped && slices.Contains(cs.Members, stoppedOn) {
					bad = fmt.Errorf("copyset %d still lists %d whose replica stopped", cs.Id, stoppedOn)
				}
			}
		})
		return bad
	})
	t.Logf("moved off the troubled disk in %v", time.Since(start).Round(time.Millisecond))
}

// TestSchedulerFailedMove: a move whose target goes bad before the leader
// reports it done is re-planned to another target; the bad target leaves the
// member list and the move record names the new one. The heartbeat timeout is
// seconds long, so that a simulated round running late on a loaded machine
// does not make a live chunkserver look dead.
func TestSchedulerFailedMove(t *testing.T) {
	r := startMDS(t, Config{HeartbeatTimeout: 3 * time.Second, RecoveryGrace: 3 * time.Second,
		ScheduleInterval: 100 * time.Millisecond, MaxRecoveryMoves: 1, MaxMovesPerChunkserver: 1, DisableBalance: true})
	defer r.stop(t)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	ids := registerZones(t, c, 5)
	// Three copysets on five chunkservers: each has two spares.
	pool, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 3})
	if err != nil {
		t.Fatal(err)
	}
	s := newSim(t, r, pool.Pool.Id, time.Hour, ids) // moves never converge
	waitFor(t, 60*time.Second, "the simulation's first round", func() error {
		var err error
		s.with(func() {
			if len(s.cur) != 3 {
				err = fmt.Errorf("%d copysets listed", len(s.cur))
			}
		})
		return err
	})
	var victim uint64
	s.with(func() {
		victim = s.cur[0].Members[0]
		s.cs[victim].down = true
	})
	var first *api.CopysetMove
	var moved uint32
	waitFor(t, 60*time.Second, "a move of the dead member", func() error {
		err := fmt.Errorf("no move yet")
		s.with(func() {
			for _, cs := range s.cur {
				if cs.Move != nil {
					first, moved, err = cs.Move, cs.Id, nil
				}
			}
		})
		return err
	})
	if first.From != victim || first.Reason != reasonDead {
		t.Fatalf("move %v, want one from %d for reason %q", first, victim, reasonDead)
	}
	// Only one move at a time (MaxRecoveryMoves 1), though the victim is in
	// every copyset it was placed in.
	time.Sleep(time.Second) // ten scheduling rounds, to (wrongly) start more
	if _, _, moving := s.counts(); moving != 1 {
		t.Fatalf("%d moves in flight, limit 1", moving)
	}
	s.with(func() {
		if s.maxMoves > 1 {
			t.Fatalf("%d moves were in flight at once, limit 1", s.maxMoves)
		}
	})
	s.with(func() { s.cs[first.To].disk = api.DiskState_DISK_STATE_IO_ERROR })
	waitFor(t, 60*time.Second, "the failed move re-planned", func() error {
		var err error
		s.with(func() {
			cs := s.cur[moved]
			switch {
			case cs.Move == nil || cs.Move.To == first.To:
				err = fmt.Errorf("copyset %d move %v", cs.Id, cs.Move)
			case slices.Contains(cs.Members, first.To) || slices.Contains(cs.Members, victim):
				err = fmt.Errorf("copyset %d members %v still list %d or %d", cs.Id, cs.Members, first.To, victim)
			case cs.Move.Reason != reasonDisk || cs.Move.From != first.To:
				err = fmt.Errorf("copyset %d move %v, want from %d for reason %q", cs.Id, cs.Move, first.To, reasonDisk)
			}
		})
		return err
	})
}

// TestSchedulerFailover: moves in flight survive a failover of the active
// MDS (their records are in etcd): the new active MDS counts them against
// the limits from its first round, finishes the balancing, and never has
// more moves in flight than allowed.
func TestSchedulerFailover(t *testing.T) {
	etcd := startEtcd(t)
	cfg := Config{EtcdEndpoints: []string{etcd}, ElectionTTL: 2 * time.Second, HeartbeatTimeout: 2 * time.Second,
		RecoveryGrace: time.Hour, ScheduleInterval: 100 * time.Millisecond, MaxRecoveryMoves: 2, MaxMovesPerChunkserver: 2}
	r1 := startMDS(t, cfg)
	waitActive(t, r1, 30*time.Second)
	r2 := startMDS(t, cfg)
	defer r2.stop(t)
	c := dial(t, r1.s.Addr(), r2.s.Addr())
	ctx := ctxT(t)
	var ids []uint64
	for _, z := range []string{"z1", "z2", "z3"} {
		ids = append(ids, register(t, c, z, "h"+z, "cs-"+z+":1"))
	}
	pool, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 12})
	if err != nil {
		t.Fatal(err)
	}
	// Moves converge 3 s after they are listed: longer than the failover.
	s := newSimAt(t, []string{r1.s.Addr(), r2.s.Addr()}, pool.Pool.Id, 3*time.Second, ids)
	id4 := register(t, c, "z4", "hz4", "cs-z4:1")
	ids = append(ids, id4)
	s.with(func() { s.cs[id4] = &simCS{id: id4, unhealthy: map[uint32]bool{}} })
	waitFor(t, 20*time.Second, "two moves in flight", func() error {
		if _, _, moving := s.counts(); moving < 2 {
			return fmt.Errorf("%d moves", moving)
		}
		return nil
	})
	r1.crash(t)
	waitActive(t, r2, 30*time.Second)
	waitFor(t, 60*time.Second, "copysets balanced after the failover", func() error {
		members, _, moving := s.counts()
		if lo, hi := spread(members, ids); hi-lo > 0 || moving > 0 {
			return fmt.Errorf("members per chunkserver %v, %d moves in flight", members, moving)
		}
		return nil
	})
	s.close()
	if s.maxMoves > 2 || s.maxPerCS > 2 {
		t.Fatalf("moves in flight reached %d in all, %d on one chunkserver across the failover; limits 2 and 2", s.maxMoves, s.maxPerCS)
	}
}

// registerZones registers n chunkservers, one per zone z1..zn, and returns their ids.
func registerZones(t *testing.T, c *mdsclient.Client, n int) []uint64 {
	var ids []uint64
	for i := 1; i <= n; i++ {
		z := fmt.Sprintf("z%d", i)
		ids = append(ids, register(t, c, z, "h"+z, "cs-"+z+":1"))
	}
	return ids
}
