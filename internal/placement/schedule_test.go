package placement

import (
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"testing"
)

// randomTopology returns nodes in 3..5 zones with 1..3 servers each and
// 1..2 disks per server, ids from 1.
func randomTopology(r *rand.Rand) []Node {
	var ns []Node
	id := uint64(1)
	zones := 3 + r.Intn(3)
	for z := range zones {
		for s := range 1 + r.Intn(3) {
			for range 1 + r.Intn(2) {
				ns = append(ns, Node{ID: id, Zone: fmt.Sprintf("z%d", z), Server: fmt.Sprintf("z%d-s%d", z, s)})
				id++
			}
		}
	}
	return ns
}

func poolOf(t *testing.T, nodes []Node, copysets, replicas int) Pool {
	t.Helper()
	placed, err := Place(nodes, copysets, replicas)
	if err != nil {
		t.Fatal(err)
	}
	p := Pool{Replicas: replicas, Nodes: nodes, Targets: map[uint64]bool{}}
	for _, n := range nodes {
		p.Targets[n.ID] = true
	}
	for i, m := range placed {
		p.Copysets = append(p.Copysets, Copyset{ID: uint64(i), Members: m, Leader: m[i%len(m)]})
	}
	return p
}

// checkDomains fails if a copyset has two members in one failure domain.
func checkDomains(t *testing.T, p Pool) {
	t.Helper()
	dom := p.domains()
	for _, c := range p.Copysets {
		seen := map[string]bool{}
		for _, m := range c.Members {
			if seen[dom[m]] {
				t.Fatalf("copyset %d: members %v share a failure domain", c.ID, c.Members)
			}
			seen[dom[m]] = true
		}
		if !slices.IsSorted(c.Members) || len(slices.Compact(slices.Clone(c.Members))) != len(c.Members) {
			t.Fatalf("copyset %d: members %v not sorted and distinct", c.ID, c.Members)
		}
	}
}

// checkBudget fails if moves exceed the limits (each move involves its
// target and the copyset's leader).
func checkBudget(t *testing.T, moves []Move, leaders map[uint64]uint64, total, perNode int) {
	t.Helper()
	if len(moves) > total {
		t.Fatalf("%d moves, limit %d", len(moves), total)
	}
	per := map[uint64]int{}
	for _, m := range moves {
		per[m.To]++
		if l := leaders[m.Copyset]; l != m.To && l != 0 {
			per[l]++
		}
	}
	for n, k := range per {
		if k > perNode {
			t.Fatalf("chunkserver %d is in %d moves, limit %d per chunkserver: %v", n, k, perNode, moves)
		}
	}
}

// TestRepairsRandom kills a random chunkserver of random topologies and
// repairs in rounds: every copyset loses the dead member, keeps its failure
// domains, and no round exceeds the budget.
func TestRepairsRandom(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		r := rand.New(rand.NewSource(seed))
		nodes := randomTopology(r)
		p := poolOf(t, nodes, 10+r.Intn(60), 3)
		dead := nodes[r.Intn(len(nodes))].ID
		p.Targets[dead] = false
		total, perNode := 1+r.Intn(6), 1+r.Intn(2)
		for round := 0; ; round++ {
			if round > 1000 {
				t.Fatalf("seed %d: repairs did not finish", seed)
			}
			leaders := map[uint64]uint64{}
			for i := range p.Copysets {
				c := &p.Copysets[i]
				c.Busy, c.Bad = false, nil
				if slices.Contains(c.Members, dead) {
					c.Bad = []uint64{dead}
				}
				if c.Leader == dead || !slices.Contains(c.Members, c.Leader) {
					for _, m := range c.Members {
						if m != dead {
							c.Leader = m
							break
						}
					}
				}
				leaders[c.ID] = c.Leader
			}
			p.Load = nil
			moves := Repairs(p, NewBudget(total, perNode))
			checkBudget(t, moves, leaders, total, perNode)
			checkDomains(t, p)
			if len(moves) == 0 {
				break
			}
			for _, m := range moves {
				if m.From != dead || m.To == dead {
					t.Fatalf("seed %d: move %+v", seed, m)
				}
			}
		}
		dom := p.domains()
		for _, c := range p.Copysets {
			if !slices.Contains(c.Members, dead) {
				continue
			}
			// Allowed only when no chunkserver could take its place.
			used := map[string]bool{}
			for _, m := range c.Members {
				if m != dead {
					used[dom[m]] = true
				}
			}
			for _, n := range nodes {
				if n.ID != dead && !slices.Contains(c.Members, n.ID) && !used[dom[n.ID]] {
					t.Fatalf("seed %d: copyset %d keeps dead member %d though %d could replace it", seed, c.ID, dead, n.ID)
				}
			}
		}
	}
}

// TestRepairsExample pins one small case: four zones, the dead member of
// each copyset goes to the only chunkserver in the fourth zone, and a move
// whose target went bad is re-planned.
func TestRepairsExample(t *testing.T) {
	nodes := []Node{{1, "a", "a1"}, {2, "b", "b1"}, {3, "c", "c1"}, {4, "d", "d1"}}
	p := Pool{Replicas: 3, Nodes: nodes, Targets: map[uint64]bool{1: true, 2: true, 4: true},
		Copysets: []Copyset{
			{ID: 0, Members: []uint64{1, 2, 3}, Leader: 1, Bad: []uint64{3}},
			{ID: 1, Members: []uint64{1, 2, 4}, Leader: 2},
			{ID: 2, Members: []uint64{2, 3, 4}, Leader: 0, Bad: []uint64{3}}, // no leader: waits
		}}
	got := Repairs(p, NewBudget(10, 10))
	want := []Move{{Copyset: 0, From: 3, To: 4}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Repairs = %v, want %v", got, want)
	}
	if !p.Copysets[0].Busy || !reflect.DeepEqual(p.Copysets[0].Members, []uint64{1, 2, 4}) {
		t.Fatalf("copyset 0 after the move: %+v", p.Copysets[0])
	}
	// Per-chunkserver limit: chunkserver 4 already receives one copyset.
	p.Copysets[0] = Copyset{ID: 0, Members: []uint64{1, 2, 3}, Leader: 1, Bad: []uint64{3}}
	b := NewBudget(10, 1)
	b.Use(4)
	if got := Repairs(p, b); len(got) != 0 {
		t.Fatalf("Repairs beyond the per-chunkserver limit: %v", got)
	}
}

// TestBalanceNewNodes places pools on random topologies, adds chunkservers
// (one per new zone, or in existing zones) and balances in budget-limited
// rounds until nothing moves: counts end within one of each other (these
// topologies allow it), domains stay distinct, and the plan is
// deterministic.
func TestBalanceNewNodes(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		r := rand.New(rand.NewSource(seed))
		zones := 3 + r.Intn(3)
		var nodes []Node
		for z := range zones {
			nodes = append(nodes, Node{ID: uint64(z + 1), Zone: fmt.Sprintf("z%d", z), Server: fmt.Sprintf("s%d", z)})
		}
		copysets := 8 + r.Intn(80)
		p := poolOf(t, nodes, copysets, 3)
		added := 1 + r.Intn(3)
		for k := range added {
			id := uint64(len(nodes) + 1)
			nodes = append(nodes, Node{ID: id, Zone: fmt.Sprintf("z%d", zones+k), Server: fmt.Sprintf("s%d", id)})
			p.Targets[id] = true
		}
		p.Nodes = nodes
		total, perNode := 1+r.Intn(8), 1+r.Intn(3)
		for round := 0; ; round++ {
			if round > 10000 {
				t.Fatalf("seed %d: balancing did not finish", seed)
			}
			leaders := map[uint64]uint64{}
			for i := range p.Copysets {
				c := &p.Copysets[i]
				c.Busy = false
				if !slices.Contains(c.Members, c.Leader) {
					c.Leader = c.Members[0]
				}
				leaders[c.ID] = c.Leader
			}
			q := p
			q.Copysets = slices.Clone(p.Copysets)
			again := Balance(q, NewBudget(total, perNode))
			moves := Balance(p, NewBudget(total, perNode))
			if !reflect.DeepEqual(again, moves) {
				t.Fatalf("seed %d: Balance not deterministic: %v vs %v", seed, again, moves)
			}
			checkBudget(t, moves, leaders, total, perNode)
			checkDomains(t, p)
			if len(moves) == 0 {
				break
			}
		}
		load := map[uint64]int{}
		for _, c := range p.Copysets {
			for _, m := range c.Members {
				load[m]++
			}
		}
		lo, hi := copysets, 0
		for _, n := range nodes {
			lo, hi = min(lo, load[n.ID]), max(hi, load[n.ID])
		}
		if hi-lo > 1 {
			t.Fatalf("seed %d: %d zones + %d new, %d copysets: loads %v (max-min %d)", seed, zones, added, copysets, load, hi-lo)
		}
	}
}

// TestBalanceSkips: busy copysets, copysets with bad members or a member
// that is not a target are never moved.
func TestBalanceSkips(t *testing.T) {
	nodes := []Node{{1, "a", "a"}, {2, "b", "b"}, {3, "c", "c"}, {4, "d", "d"}}
	mk := func() Pool {
		return Pool{Replicas: 3, Nodes: nodes, Targets: map[uint64]bool{1: true, 2: true, 3: true, 4: true},
			Copysets: []Copyset{
				{ID: 0, Members: []uint64{1, 2, 3}, Leader: 1, Busy: true},
				{ID: 1, Members: []uint64{1, 2, 3}, Leader: 1, Bad: []uint64{3}},
				{ID: 2, Members: []uint64{1, 2, 3}, Leader: 0},
			}}
	}
	if got := Balance(mk(), NewBudget(10, 10)); len(got) != 0 {
		t.Fatalf("Balance moved %v", got)
	}
	p := mk()
	p.Copysets[0].Busy = false
	p.Targets[3] = false
	if got := Balance(p, NewBudget(10, 10)); len(got) != 0 {
		t.Fatalf("Balance moved a copyset with a non-target member: %v", got)
	}
	p = mk()
	p.Copysets[0].Busy = false
	got := Balance(p, NewBudget(10, 10))
	if len(got) != 1 || got[0].Copyset != 0 || got[0].To != 4 {
		t.Fatalf("Balance = %v, want copyset 0 to chunkserver 4", got)
	}
}

// TestLeaderTransfersRandom piles leaders onto few chunkservers of random
// placements and transfers in rounds: leadership goes only to members that
// are targets, and ends spread to within two of even (exactly even is not
// always reachable: a chunkserver can only lead copysets it is a member of).
func TestLeaderTransfersRandom(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		r := rand.New(rand.NewSource(seed))
		nodes := randomTopology(r)
		p := poolOf(t, nodes, len(nodes)*(3+r.Intn(10)), 3)
		for i := range p.Copysets {
			p.Copysets[i].Leader = p.Copysets[i].Members[0] // lowest ids lead everything
		}
		targets := p.Targets
		for round := 0; ; round++ {
			if round > 10000 {
				t.Fatal("did not finish")
			}
			ts := LeaderTransfers(p.Copysets, targets, 3)
			if len(ts) > 3 {
				t.Fatalf("%d transfers, max 3", len(ts))
			}
			if len(ts) == 0 {
				break
			}
			for _, tr := range ts {
				c := &p.Copysets[tr.Copyset]
				if c.Leader != tr.From || !slices.Contains(c.Members, tr.To) || tr.To == tr.From {
					t.Fatalf("bad transfer %+v of %+v", tr, c)
				}
				c.Leader = tr.To
			}
		}
		leads := map[uint64]int{}
		for _, c := range p.Copysets {
			leads[c.Leader]++
		}
		lo, hi := len(p.Copysets), 0
		for _, n := range nodes {
			lo, hi = min(lo, leads[n.ID]), max(hi, leads[n.ID])
		}
		if hi-lo > 2 {
			t.Fatalf("seed %d: %d nodes, %d copysets: leaders %v (max-min %d)", seed, len(nodes), len(p.Copysets), leads, hi-lo)
		}
	}
}

// TestLeaderTransfersSkips: no transfer to a non-target, none of a busy
// copyset.
func TestLeaderTransfersSkips(t *testing.T) {
	cs := []Copyset{
		{ID: 1, Members: []uint64{1, 2, 3}, Leader: 1},
		{ID: 2, Members: []uint64{1, 2, 3}, Leader: 1, Busy: true},
		{ID: 3, Members: []uint64{1, 2, 3}, Leader: 1},
	}
	got := LeaderTransfers(cs, map[uint64]bool{1: true, 2: true}, 10)
	want := []Transfer{{Copyset: 1, From: 1, To: 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("LeaderTransfers = %v, want %v", got, want)
	}
}

// With 4 chunkservers and 3 replicas every copyset leaves one out: here no
// copyset led by the busiest chunkserver (4) has the idlest one (2) as a member,
// so only a chain 4 → 1 → 2 evens the leaders.
func TestLeaderTransfersTwoHop(t *testing.T) {
	var cs []Copyset
	add := func(leader uint64, members ...uint64) {
		cs = append(cs, Copyset{ID: uint64(len(cs) + 1), Members: members, Leader: leader})
	}
	for range 4 {
		add(4, 1, 3, 4)
	}
	for range 3 {
		add(1, 1, 2, 3)
	}
	for range 3 {
		add(3, 1, 2, 3)
	}
	for range 2 {
		add(2, 2, 3, 4)
	}
	targets := map[uint64]bool{1: true, 2: true, 3: true, 4: true}
	out := LeaderTransfers(cs, targets, 2)
	if len(out) != 2 {
		t.Fatalf("got %d transfers %+v, want a chain of 2", len(out), out)
	}
	leads := map[uint64]int{}
	for _, c := range cs {
		leads[c.Leader]++
	}
	for _, tr := range out {
		var c *Copyset
		for i := range cs {
			if cs[i].ID == tr.Copyset {
				c = &cs[i]
			}
		}
		if c == nil || c.Leader != tr.From || !slices.Contains(c.Members, tr.To) {
			t.Fatalf("transfer %+v: not from the copyset's leader to one of its members", tr)
		}
		c.Leader = tr.To
		leads[tr.From]--
		leads[tr.To]++
	}
	for id, n := range leads {
		if n != 3 {
			t.Fatalf("after the transfers chunkserver %d leads %d (all: %v), want 3 each", id, n, leads)
		}
	}
	// Once even, nothing more to do.
	if more := LeaderTransfers(cs, targets, 2); len(more) != 0 {
		t.Fatalf("balanced leaders still planned %+v", more)
	}
}
