package raftstore

import (
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"testing"
)

// chaosGroups: five hosts, four groups of three, overlapping.
var chaosGroups = map[uint64][]uint64{
	1: {1, 2, 3},
	2: {2, 3, 4},
	3: {3, 4, 5},
	4: {1, 4, 5},
}

// TestChaos drives hosts on a network that drops, delays, reorders and partitions,
// with crashes and restarts, leadership transfers and snapshots (log compaction) under way, and checks:
// at most one leader per term per group (every step); every replica applies the
// same entry at the same index, in increasing order (every apply); every callback
// runs exactly once; a read barrier that succeeded saw every write acknowledged
// before it was issued; after healing, every replica of a group holds the same state
// and every acknowledged write. Reproducible from the seed printed on failure.
func TestChaos(t *testing.T) {
	seeds := []int64{1, 2, 3, 4, 5, 6}
	steps := 3000
	switch {
	case testing.Short():
		seeds, steps = seeds[:1], 1000
	case raceEnabled:
		seeds = seeds[:3]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runChaos(t, seed, steps) })
	}
}

type chaosProp struct {
	group uint64
	key   string
	calls int
	err   error
}

func runChaos(t *testing.T, seed int64, steps int) string {
	c := newCluster(t, seed, 5, chaosGroups, func(cfg *Config) {
		cfg.SnapshotEntries = 40
		cfg.CatchUpEntries = 10
	})
	defer c.stop()
	n := c.net
	rng := n.rng
	n.drop, n.maxDelay = 0.05, 3
	var props []*chaosProp
	acked := map[uint64][]string{} // group → keys acknowledged, in ack order
	reads, leaseOK := 0, 0
	seq := 0
	gids := slices.Sorted(maps.Keys(chaosGroups))

	for s := 0; s < steps; s++ {
		switch r := rng.Intn(1000); {
		case r < 4: // isolate one node
			n.heal()
			n.partition([]uint64{uint64(1 + rng.Intn(5))})
		case r < 6: // split two against three
			n.heal()
			a := uint64(1 + rng.Intn(5))
			b := uint64(1 + (int(a)+rng.Intn(4))%5)
			n.partition([]uint64{a, b})
		case r < 12:
			n.heal()
		case r < 16: // crash and restart a node: it comes back with what was durable
			c.restart(uint64(1 + rng.Intn(5)))
		case r < 18: // hand leadership of a group to another member
			gid := gids[rng.Intn(len(gids))]
			if l := c.leader(gid); l != 0 {
				m := chaosGroups[gid]
				c.hosts[l].TransferLeader(gid, m[rng.Intn(len(m))])
			}
		}
		for range rng.Intn(3) {
			gid := gids[rng.Intn(len(gids))]
			members := chaosGroups[gid]
			target := members[rng.Intn(len(members))]
			if l := c.leader(gid); l != 0 && rng.Intn(10) < 8 {
				target = l
			}
			seq++
			p := &chaosProp{group: gid, key: fmt.Sprintf("k%d", seq)}
			props = append(props, p)
			c.hosts[target].Propose(gid, propData(fmt.Sprintf("%s=v%d", p.key, seq)), func(err error) {
				p.calls++
				p.err = err
				if err == nil {
					acked[gid] = append(acked[gid], p.key)
				}
			})
		}
		if rng.Intn(4) == 0 {
			gid := gids[rng.Intn(len(gids))]
			members := chaosGroups[gid]
			target := members[rng.Intn(len(members))]
			if l := c.leader(gid); l != 0 && rng.Intn(10) < 8 {
				target = l
			}
			before := slices.Clone(acked[gid])
			sm := c.sms[target][gid]
			reads++
			calls := 0
			c.hosts[target].ReadBarrier(gid, func(err error) {
				calls++
				if calls > 1 {
					c.fatalf("read barrier answered twice")
				}
				if err != nil {
					if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrStopped) { // a restart
						c.fatalf("read barrier: unexpected error %v", err)
					}
					return
				}
				leaseOK++
				for _, k := range before {
					if _, ok := sm.get(k); !ok {
						c.fatalf("group %d: read on node %d misses %s, acknowledged before the read", gid, target, k)
					}
				}
			})
		}
		c.step()
	}

	// Heal and let everything settle.
	n.heal()
	n.drop = 0
	c.waitConverged(3000)
	for _, gid := range gids {
		for _, id := range chaosGroups[gid] {
			sm := c.sms[id][gid]
			for _, k := range acked[gid] {
				if _, ok := sm.get(k); !ok {
					c.fatalf("group %d node %d lost acknowledged write %s", gid, id, k)
				}
			}
		}
	}
	c.stop()
	ok, notLeader := 0, 0
	for _, p := range props {
		if p.calls != 1 {
			c.fatalf("proposal %s answered %d times", p.key, p.calls)
		}
		switch {
		case p.err == nil:
			ok++
		case errors.Is(p.err, ErrNotLeader) || errors.Is(p.err, ErrStopped): // ErrStopped: its host restarted
			notLeader++
		default:
			c.fatalf("proposal %s: unexpected result %v", p.key, p.err)
		}
	}
	snaps := uint64(0)
	sent := uint64(0)
	for _, h := range c.hosts {
		snaps += h.Stats().SnapshotsCreated
		sent += h.Stats().SnapshotsSent
	}
	terms := 0
	for _, m := range c.leaders {
		terms += len(m)
	}
	summary := fmt.Sprintf("seed %d: %d proposals (%d ok, %d NOT_LEADER), %d reads (%d ok), %d leader terms, %d snapshots created, %d streamed",
		seed, len(props), ok, notLeader, reads, leaseOK, terms, snaps, sent)
	t.Log(summary)
	if ok < len(props)/4 {
		t.Fatalf("seed %d: only %d of %d proposals succeeded: the cluster made little progress", seed, ok, len(props))
	}
	if snaps == 0 {
		t.Fatalf("seed %d: no snapshot was created", seed)
	}
	h := fnv.New64a()
	for _, gid := range gids {
		m := c.committed[gid]
		for _, idx := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(h, "%d/%d=%s;", gid, idx, m[idx])
		}
	}
	return fmt.Sprintf("%s; committed digest %x", summary, h.Sum64())
}

// TestChaosReproducible: the same seed gives the same run, decision for decision.
func TestChaosReproducible(t *testing.T) {
	a := runChaos(t, 99, 600)
	b := runChaos(t, 99, 600)
	if a != b {
		t.Fatalf("same seed, different runs:\n%s\n%s", a, b)
	}
}
