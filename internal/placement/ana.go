package placement

import (
	"cmp"
	"slices"
)

// ANAPolicy says how the optimized paths of one NVMe subsystem's namespaces
// are chosen for a host (docs/nvmf.md).
type ANAPolicy int

const (
	// ANAInherit: a host uses one optimized access node for every namespace
	// of the subsystem.
	ANAInherit ANAPolicy = iota
	// ANABalance: the namespaces of one host are spread over different
	// optimized access nodes.
	ANABalance
)

// ANANonOptimized is how many non-optimized paths each (host, namespace)
// gets besides its optimized one; every other access node is inaccessible.
const ANANonOptimized = 2

// ANAKey names one host's view of one namespace of a subsystem.
type ANAKey struct {
	Subsystem string
	Host      string
	NSID      uint32
}

// ANAPaths is the assignment of one ANAKey: the optimized access node and the
// non-optimized ones, in order; every other live access node is inaccessible.
type ANAPaths struct {
	Optimized    uint64
	NonOptimized []uint64
}

// ANAHost is one host connected to a subsystem, with the namespaces it sees.
type ANAHost struct {
	Subsystem string
	Host      string
	Policy    ANAPolicy
	NSIDs     []uint32
	// Nodes are the access nodes the host is connected to (it has a path
	// through them); empty: every live node.
	Nodes []uint64
}

// AssignANA chooses the paths of every (subsystem, host, namespace) in hosts
// over the live access nodes. It is deterministic and sticky: an optimized
// node that is still live and not above its share of the optimized load
// keeps its namespaces; a namespace whose optimized node died goes, when it
// can, to one of its previous non-optimized nodes (the host already uses
// those paths). Loads are counted over all hosts and subsystems, so the
// optimized load stays even across hosts.
//
//   - ANAInherit: every namespace of one (subsystem, host) gets the same
//     optimized node, chosen per (subsystem, host) as one unit of load per
//     namespace.
//   - ANABalance: the namespaces of one (subsystem, host) go to distinct
//     optimized nodes as far as there are nodes, least loaded first.
//
// Only the live nodes in a host's Nodes (all live nodes when it is empty)
// are candidates for its paths. The non-optimized nodes of a key are the
// next ANANonOptimized candidates after its optimized one in id order (fewer
// when there are fewer). A host with no live candidate gets no assignment.
func AssignANA(nodes []uint64, hosts []ANAHost, prev map[ANAKey]ANAPaths) map[ANAKey]ANAPaths {
	nodes = slices.Clone(nodes)
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	out := map[ANAKey]ANAPaths{}
	if len(nodes) == 0 {
		return out
	}
	hosts = slices.Clone(hosts)
	slices.SortFunc(hosts, func(a, b ANAHost) int {
		return cmp.Or(cmp.Compare(a.Subsystem, b.Subsystem), cmp.Compare(a.Host, b.Host))
	})
	live := map[uint64]bool{}
	for _, n := range nodes {
		live[n] = true
	}
	total := 0
	for i := range hosts {
		ns := slices.Clone(hosts[i].NSIDs)
		slices.Sort(ns)
		hosts[i].NSIDs = slices.Compact(ns)
		total += len(hosts[i].NSIDs)
	}
	share := (total + len(nodes) - 1) / len(nodes) // the most optimized namespaces one node should hold
	load := map[uint64]int{}
	// cand: the live nodes host h can use, sorted.
	cand := func(h ANAHost) []uint64 {
		if len(h.Nodes) == 0 {
			return nodes
		}
		var out []uint64
		for _, n := range nodes {
			if slices.Contains(h.Nodes, n) {
				out = append(out, n)
			}
		}
		return out
	}
	fits := func(n uint64, k int) bool { return live[n] && load[n]+k <= share }
	// fallback picks the node for k namespaces whose sticky choice failed:
	// a previous non-optimized node that fits, else the least loaded
	// (avoiding the nodes in avoid when it can), lowest id on ties.
	fallback := func(k int, nodes []uint64, was []uint64, avoid map[uint64]bool) uint64 {
		for _, n := range was {
			if fits(n, k) && !avoid[n] && slices.Contains(nodes, n) {
				return n
			}
		}
		best := uint64(0)
		for _, n := range nodes {
			if best == 0 || less(n, best, load, avoid) {
				best = n
			}
		}
		return best
	}
	// Two passes: first the sticky choices that still fit, so that they
	// are not crowded out by newcomers sorted before them; then the rest.
	chosen := map[ANAKey]uint64{}
	for _, h := range hosts {
		switch h.Policy {
		case ANABalance:
			used := map[uint64]bool{}
			hn := cand(h)
			spread := len(h.NSIDs) <= len(hn)
			for _, ns := range h.NSIDs {
				k := ANAKey{h.Subsystem, h.Host, ns}
				if p, ok := prev[k]; ok && fits(p.Optimized, 1) && slices.Contains(hn, p.Optimized) && !(spread && used[p.Optimized]) {
					chosen[k] = p.Optimized
					used[p.Optimized] = true
					load[p.Optimized]++
				}
			}
		default:
			if len(h.NSIDs) == 0 {
				continue
			}
			first := ANAKey{h.Subsystem, h.Host, h.NSIDs[0]}
			p, ok := prev[first]
			if !ok || !fits(p.Optimized, len(h.NSIDs)) || !slices.Contains(cand(h), p.Optimized) {
				continue
			}
			same := true
			for _, ns := range h.NSIDs[1:] {
				q, ok := prev[ANAKey{h.Subsystem, h.Host, ns}]
				same = same && ok && q.Optimized == p.Optimized
			}
			if !same {
				continue
			}
			for _, ns := range h.NSIDs {
				chosen[ANAKey{h.Subsystem, h.Host, ns}] = p.Optimized
			}
			load[p.Optimized] += len(h.NSIDs)
		}
	}
	for _, h := range hosts {
		switch h.Policy {
		case ANABalance:
			hn := cand(h)
			if len(hn) == 0 {
				continue
			}
			used := map[uint64]bool{}
			for _, ns := range h.NSIDs {
				if n, ok := chosen[ANAKey{h.Subsystem, h.Host, ns}]; ok {
					used[n] = true
				}
			}
			for _, ns := range h.NSIDs {
				k := ANAKey{h.Subsystem, h.Host, ns}
				if _, ok := chosen[k]; ok {
					continue
				}
				avoid := used
				if len(used) >= len(hn) {
					avoid = nil // more namespaces than nodes: reuse
				}
				n := fallback(1, hn, prev[k].NonOptimized, avoid)
				chosen[k] = n
				used[n] = true
				load[n]++
			}
		default:
			if len(h.NSIDs) == 0 {
				continue
			}
			first := ANAKey{h.Subsystem, h.Host, h.NSIDs[0]}
			hn := cand(h)
			if _, ok := chosen[first]; ok || len(hn) == 0 {
				continue
			}
			n := fallback(len(h.NSIDs), hn, prev[first].NonOptimized, nil)
			for _, ns := range h.NSIDs {
				chosen[ANAKey{h.Subsystem, h.Host, ns}] = n
			}
			load[n] += len(h.NSIDs)
		}
	}
	for _, h := range hosts {
		hn := cand(h)
		for _, ns := range h.NSIDs {
			k := ANAKey{h.Subsystem, h.Host, ns}
			if n, ok := chosen[k]; ok {
				out[k] = ANAPaths{Optimized: n, NonOptimized: after(hn, n, ANANonOptimized)}
			}
		}
	}
	return out
}

// less orders candidate optimized nodes: not in avoid, then least loaded,
// then lowest id.
func less(a, b uint64, load map[uint64]int, avoid map[uint64]bool) bool {
	if avoid[a] != avoid[b] {
		return !avoid[a]
	}
	if load[a] != load[b] {
		return load[a] < load[b]
	}
	return a < b
}

// after returns up to k nodes following n in the sorted ring nodes.
func after(nodes []uint64, n uint64, k int) []uint64 {
	i, _ := slices.BinarySearch(nodes, n)
	var out []uint64
	for j := 1; j < len(nodes) && len(out) < k; j++ {
		out = append(out, nodes[(i+j)%len(nodes)])
	}
	return out
}

// ANAState is the ANA state of one path, as the ANA log page codes it.
type ANAState uint8

// ANA states (NVMe base specification, Asymmetric Namespace Access).
const (
	ANAOptimized      ANAState = 0x01
	ANANonOptimizedSt ANAState = 0x02
	ANAInaccessible   ANAState = 0x03
)

// State returns node's state in p.
func (p ANAPaths) State(node uint64) ANAState {
	switch {
	case node == p.Optimized:
		return ANAOptimized
	case slices.Contains(p.NonOptimized, node):
		return ANANonOptimizedSt
	}
	return ANAInaccessible
}
