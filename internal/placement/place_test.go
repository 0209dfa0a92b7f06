package placement

import (
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"testing"
)

func topology(zones, serversPerZone, disksPerServer int) []Node {
	var ns []Node
	id := uint64(1)
	for z := range zones {
		for s := range serversPerZone {
			for range disksPerServer {
				ns = append(ns, Node{ID: id, Zone: fmt.Sprintf("z%d", z), Server: fmt.Sprintf("z%d-s%d", z, s)})
				id++
			}
		}
	}
	return ns
}

// check verifies the properties every placement must have and returns the
// per-node loads.
func check(t *testing.T, nodes []Node, got [][]uint64, copysets, replicas int) map[uint64]int {
	t.Helper()
	level, _, err := Domains(nodes, replicas)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[uint64]Node{}
	for _, n := range nodes {
		byID[n.ID] = n
	}
	if len(got) != copysets {
		t.Fatalf("got %d copysets, want %d", len(got), copysets)
	}
	load := map[uint64]int{}
	for _, n := range nodes {
		load[n.ID] = 0
	}
	for c, m := range got {
		if len(m) != replicas {
			t.Fatalf("copyset %d has %d members, want %d", c, len(m), replicas)
		}
		seen := map[string]bool{}
		for i, id := range m {
			n, ok := byID[id]
			if !ok {
				t.Fatalf("copyset %d: unknown member %d", c, id)
			}
			if i > 0 && m[i-1] >= id {
				t.Fatalf("copyset %d: members %v not sorted and distinct", c, m)
			}
			d := n.Zone
			if level == DomainServer {
				d = n.Zone + "/" + n.Server
			}
			if seen[d] {
				t.Fatalf("copyset %d: members %v share %s %q", c, m, level, d)
			}
			seen[d] = true
			load[id]++
		}
	}
	return load
}

func spread(load map[uint64]int) (lo, hi int) {
	lo = -1
	for _, l := range load {
		if lo < 0 || l < lo {
			lo = l
		}
		hi = max(hi, l)
	}
	return lo, hi
}

func TestPlaceThreeZones(t *testing.T) {
	nodes := topology(3, 1, 1)
	got, err := Place(nodes, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	for c, m := range got {
		if !reflect.DeepEqual(m, []uint64{1, 2, 3}) {
			t.Fatalf("copyset %d = %v, want [1 2 3]", c, m)
		}
	}
}

func TestPlaceErrors(t *testing.T) {
	cases := []struct {
		name     string
		nodes    []Node
		cs, reps int
		want     error
	}{
		{"zero replicas", topology(3, 1, 1), 10, 0, ErrBadArgument},
		{"zero copysets", topology(3, 1, 1), 0, 3, ErrBadArgument},
		{"too few nodes", topology(2, 1, 1), 10, 3, ErrNotEnoughDomains},
		{"one server many disks", topology(1, 1, 5), 10, 3, ErrNotEnoughDomains},
		{"two servers", topology(1, 2, 3), 10, 3, ErrNotEnoughDomains},
		{"zero id", []Node{{ID: 0, Zone: "a"}, {ID: 1, Zone: "b"}}, 1, 1, ErrBadArgument},
		{"duplicate id", []Node{{ID: 1, Zone: "a"}, {ID: 1, Zone: "b"}}, 1, 1, ErrBadArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Place(tc.nodes, tc.cs, tc.reps)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Place: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestPlaceFallsBackToServers(t *testing.T) {
	nodes := topology(1, 4, 2) // one zone, 4 servers with 2 disks each
	got, err := Place(nodes, 40, 3)
	if err != nil {
		t.Fatal(err)
	}
	load := check(t, nodes, got, 40, 3)
	if lo, hi := spread(load); hi-lo > 1 {
		t.Fatalf("loads %v: spread %d..%d", load, lo, hi)
	}
}

func TestPlaceSingleReplica(t *testing.T) {
	nodes := topology(1, 1, 4)
	got, err := Place(nodes, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	load := check(t, nodes, got, 10, 1)
	if lo, hi := spread(load); hi-lo > 1 {
		t.Fatalf("loads %v", load)
	}
}

func TestPlaceDeterministic(t *testing.T) {
	nodes := topology(3, 2, 2)
	a, err := Place(nodes, 50, 3)
	if err != nil {
		t.Fatal(err)
	}
	rev := append([]Node(nil), nodes...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	b, err := Place(rev, 50, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("placement depends on the order of the nodes")
	}
}

func TestDefaultCopysets(t *testing.T) {
	if got := DefaultCopysets(3, 3); got != 100 {
		t.Fatalf("DefaultCopysets(3,3) = %d, want 100", got)
	}
	if got := DefaultCopysets(10, 3); got != 333 {
		t.Fatalf("DefaultCopysets(10,3) = %d, want 333", got)
	}
	if got := DefaultCopysets(1, 5); got != 20 {
		t.Fatalf("DefaultCopysets(1,5) = %d, want 20", got)
	}
}

// TestPlaceProperties places copysets on random topologies and checks
// distinct failure domains, balance wherever the domains allow it, and a
// scatter width close to the best possible.
func TestPlaceProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(20261121))
	worst := 1.0
	defer func() { t.Logf("worst scatter width ratio %.2f", worst) }()
	for iter := range 100 {
		replicas := 1 + rng.Intn(5)
		zones := 1 + rng.Intn(6)
		var nodes []Node
		id := uint64(1 + rng.Intn(1000))
		for z := range zones {
			servers := 1 + rng.Intn(4)
			for s := range servers {
				for range 1 + rng.Intn(3) {
					nodes = append(nodes, Node{ID: id, Zone: fmt.Sprintf("z%d", z), Server: fmt.Sprintf("s%d", s)})
					id += uint64(1 + rng.Intn(3))
				}
			}
		}
		copysets := 1 + rng.Intn(min(600, DefaultCopysets(len(nodes), replicas)))
		name := fmt.Sprintf("iter%d/%dnodes/%dzones/r%d/c%d", iter, len(nodes), zones, replicas, copysets)
		level, _, derr := Domains(nodes, replicas)
		got, err := Place(nodes, copysets, replicas)
		if derr != nil || len(nodes) < replicas {
			if !errors.Is(err, ErrNotEnoughDomains) {
				t.Fatalf("%s: err %v, want ErrNotEnoughDomains", name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		load := check(t, nodes, got, copysets, replicas)

		// Balance is possible when no failure domain holds more than its
		// share: a domain takes at most one replica of each copyset.
		domSize := map[string]int{}
		for _, n := range nodes {
			k := n.Zone
			if level == DomainServer {
				k += "/" + n.Server
			}
			domSize[k]++
		}
		balanceable, crowded := true, false
		for _, sz := range domSize {
			balanceable = balanceable && sz*replicas <= len(nodes)
			// A domain with 1/replicas of the nodes or more is in (nearly)
			// every copyset, which narrows everyone else's peers.
			crowded = crowded || sz*replicas >= len(nodes)
		}
		if lo, hi := spread(load); balanceable && hi-lo > 1 {
			t.Fatalf("%s: loads spread %d..%d (domains %v)", name, lo, hi, domSize)
		}

		// Scatter width: node i can have at most
		// min(nodes outside its domain, load*(replicas-1)) peers. When a
		// domain is crowded (not balanceable) every copyset needs one of its
		// members and the others can reach fewer peers, so the bound is loose
		// there and only a weaker floor is checked.
		sw := ScatterWidth(got)
		var sum, best float64
		for _, n := range nodes {
			k := n.Zone
			if level == DomainServer {
				k += "/" + n.Server
			}
			best += float64(min(len(nodes)-domSize[k], load[n.ID]*(replicas-1)))
			sum += float64(sw[n.ID])
		}
		floor := 0.9
		if crowded {
			floor = 0.7
		}
		if best > 0 && sum/best < floor {
			t.Fatalf("%s: total scatter width %.0f, best possible %.0f", name, sum, best)
		}
		if best > 0 {
			worst = min(worst, sum/best)
		}
	}
}

func TestScatterWidthManyNodes(t *testing.T) {
	nodes := topology(3, 4, 2) // 24 chunkservers in 3 zones
	cs := DefaultCopysets(len(nodes), 3)
	got, err := Place(nodes, cs, 3)
	if err != nil {
		t.Fatal(err)
	}
	load := check(t, nodes, got, cs, 3)
	if lo, hi := spread(load); hi-lo > 1 {
		t.Fatalf("loads spread %d..%d", lo, hi)
	}
	for id, w := range ScatterWidth(got) {
		if w != 16 { // every chunkserver in the other two zones
			t.Errorf("chunkserver %d: scatter width %d, want 16", id, w)
		}
	}
}
