package placement

import (
	"fmt"
	"slices"
	"testing"
)

func anaHosts(policy ANAPolicy, sub string, hosts, namespaces int) []ANAHost {
	var out []ANAHost
	for h := range hosts {
		var ns []uint32
		for i := range namespaces {
			ns = append(ns, uint32(i+1))
		}
		out = append(out, ANAHost{Subsystem: sub, Host: fmt.Sprintf("host%d", h), Policy: policy, NSIDs: ns})
	}
	return out
}

// checkPaths: every key of hosts has one live optimized node and
// min(2, nodes-1) distinct live non-optimized nodes other than it.
func checkPaths(t *testing.T, nodes []uint64, hosts []ANAHost, got map[ANAKey]ANAPaths) {
	t.Helper()
	for _, h := range hosts {
		for _, ns := range h.NSIDs {
			k := ANAKey{h.Subsystem, h.Host, ns}
			p, ok := got[k]
			if !ok {
				t.Fatalf("%v has no assignment", k)
			}
			if !slices.Contains(nodes, p.Optimized) {
				t.Fatalf("%v: optimized node %d is not live (%v)", k, p.Optimized, nodes)
			}
			want := min(ANANonOptimized, len(nodes)-1)
			if len(p.NonOptimized) != want {
				t.Fatalf("%v: %d non-optimized paths, want %d", k, len(p.NonOptimized), want)
			}
			seen := map[uint64]bool{p.Optimized: true}
			for _, n := range p.NonOptimized {
				if seen[n] || !slices.Contains(nodes, n) {
					t.Fatalf("%v: non-optimized %v repeats a node or names a dead one", k, p.NonOptimized)
				}
				seen[n] = true
			}
			if p.State(p.Optimized) != ANAOptimized || p.State(p.NonOptimized[0]) != ANANonOptimizedSt || p.State(999) != ANAInaccessible {
				t.Fatalf("%v: State disagrees with the paths", k)
			}
		}
	}
}

func optimizedLoad(got map[ANAKey]ANAPaths) map[uint64]int {
	load := map[uint64]int{}
	for _, p := range got {
		load[p.Optimized]++
	}
	return load
}

func anaSpread(load map[uint64]int, nodes []uint64) (lo, hi int) {
	lo = 1 << 30
	for _, n := range nodes {
		lo, hi = min(lo, load[n]), max(hi, load[n])
	}
	return
}

func TestAssignANAInheritOneNodePerHost(t *testing.T) {
	nodes := []uint64{1, 2, 3}
	hosts := anaHosts(ANAInherit, "sub", 6, 4)
	got := AssignANA(nodes, hosts, nil)
	checkPaths(t, nodes, hosts, got)
	for _, h := range hosts {
		first := got[ANAKey{"sub", h.Host, 1}].Optimized
		for _, ns := range h.NSIDs {
			if o := got[ANAKey{"sub", h.Host, ns}].Optimized; o != first {
				t.Fatalf("inherit: %s namespace %d optimized on %d, namespace 1 on %d", h.Host, ns, o, first)
			}
		}
	}
	if lo, hi := anaSpread(optimizedLoad(got), nodes); hi-lo > 4 {
		t.Fatalf("inherit: optimized load %v is not even across hosts", optimizedLoad(got))
	}
}

func TestAssignANABalanceSpreadsOneHost(t *testing.T) {
	nodes := []uint64{1, 2, 3}
	hosts := anaHosts(ANABalance, "sub", 1, 3)
	got := AssignANA(nodes, hosts, nil)
	checkPaths(t, nodes, hosts, got)
	seen := map[uint64]bool{}
	for _, p := range got {
		seen[p.Optimized] = true
	}
	if len(seen) != 3 {
		t.Fatalf("balance: 3 namespaces of one host on %d optimized nodes, want 3: %v", len(seen), got)
	}
	// Across hosts: 5 hosts × 4 namespaces over 3 nodes stays within one.
	hosts = anaHosts(ANABalance, "sub", 5, 4)
	got = AssignANA(nodes, hosts, nil)
	checkPaths(t, nodes, hosts, got)
	if lo, hi := anaSpread(optimizedLoad(got), nodes); hi-lo > 1 {
		t.Fatalf("balance: optimized load %v is not even", optimizedLoad(got))
	}
	for _, h := range hosts {
		seen := map[uint64]int{}
		for _, ns := range h.NSIDs {
			seen[got[ANAKey{"sub", h.Host, ns}].Optimized]++
		}
		if len(seen) != 3 {
			t.Fatalf("balance: %s's 4 namespaces use %d of 3 nodes: %v", h.Host, len(seen), seen)
		}
	}
}

func TestAssignANAFailoverGoesToANonOptimizedNode(t *testing.T) {
	for _, policy := range []ANAPolicy{ANAInherit, ANABalance} {
		nodes := []uint64{1, 2, 3, 4}
		hosts := anaHosts(policy, "sub", 3, 2)
		before := AssignANA(nodes, hosts, nil)
		checkPaths(t, nodes, hosts, before)
		// Kill node 2: its keys move to one of their non-optimized nodes,
		// the others keep theirs.
		alive := []uint64{1, 3, 4}
		after := AssignANA(alive, hosts, before)
		checkPaths(t, alive, hosts, after)
		for k, p := range before {
			q := after[k]
			if p.Optimized != 2 && q.Optimized != p.Optimized && policy == ANABalance {
				t.Errorf("policy %d: %v moved from live node %d to %d", policy, k, p.Optimized, q.Optimized)
			}
			if p.Optimized == 2 && !slices.Contains(p.NonOptimized, q.Optimized) {
				t.Errorf("policy %d: %v failed over to %d, not one of its non-optimized %v", policy, k, q.Optimized, p.NonOptimized)
			}
		}
		// Stable: the same input gives the same answer.
		again := AssignANA(alive, hosts, after)
		for k, p := range after {
			if q := again[k]; q.Optimized != p.Optimized || !slices.Equal(q.NonOptimized, p.NonOptimized) {
				t.Fatalf("policy %d: %v changed without a cause: %v → %v", policy, k, p, q)
			}
		}
	}
}

func TestAssignANAJoinRebalances(t *testing.T) {
	hosts := anaHosts(ANABalance, "sub", 1, 3)
	one := AssignANA([]uint64{7}, hosts, nil)
	for _, p := range one {
		if p.Optimized != 7 || len(p.NonOptimized) != 0 {
			t.Fatalf("one node: %v", p)
		}
	}
	nodes := []uint64{7, 8, 9}
	got := AssignANA(nodes, hosts, one)
	checkPaths(t, nodes, hosts, got)
	if lo, hi := anaSpread(optimizedLoad(got), nodes); lo != 1 || hi != 1 {
		t.Fatalf("after two nodes joined the load is %v, want one each", optimizedLoad(got))
	}
	if len(AssignANA(nil, hosts, got)) != 0 {
		t.Fatal("no live node: want no assignment")
	}
}

func TestAssignANAOnlyNodesTheHostReaches(t *testing.T) {
	nodes := []uint64{1, 2, 3, 4, 5}
	hosts := anaHosts(ANABalance, "sub", 2, 3)
	hosts[0].Nodes = []uint64{2, 3, 4, 9} // 9 is not live
	hosts[1].Nodes = []uint64{1}
	got := AssignANA(nodes, hosts, nil)
	for k, p := range got {
		allowed := hosts[0].Nodes
		if k.Host == hosts[1].Host {
			allowed = hosts[1].Nodes
		}
		for _, n := range append([]uint64{p.Optimized}, p.NonOptimized...) {
			if !slices.Contains(allowed, n) || n == 9 {
				t.Fatalf("%v: path on node %d, the host reaches only %v", k, n, allowed)
			}
		}
		if k.Host == hosts[0].Host && len(p.NonOptimized) != 2 || k.Host == hosts[1].Host && len(p.NonOptimized) != 0 {
			t.Fatalf("%v: non-optimized %v", k, p.NonOptimized)
		}
	}
	if len(got) != 6 {
		t.Fatalf("%d assignments, want 6", len(got))
	}
}
