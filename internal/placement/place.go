package placement

import (
	"errors"
	"fmt"
	"sort"
)

// Errors returned by Place.
var (
	// ErrBadArgument reports a replica or copyset count out of range, or a
	// node list with a zero or duplicate id.
	ErrBadArgument = errors.New("placement: bad argument")
	// ErrNotEnoughDomains reports that the nodes span fewer zones and fewer
	// servers than the replica count, so no copyset can have its members in
	// distinct failure domains.
	ErrNotEnoughDomains = errors.New("placement: not enough failure domains")
)

// Node is one chunkserver as placement sees it: an id and its failure domains.
type Node struct {
	ID     uint64 // chunkserver id, never 0
	Zone   string // failure domain
	Server string // host name: the failure domain inside a zone
}

// CopysetsPerNode is the target number of copyset replicas one chunkserver
// hosts when the pool's copyset count is left to its default.
const CopysetsPerNode = 100

// DefaultCopysets returns the default copyset count of a pool on nodes
// chunkservers with the given replica count: about CopysetsPerNode replicas
// per chunkserver, so nodes*CopysetsPerNode/replicas, at least 1.
func DefaultCopysets(nodes, replicas int) int {
	if replicas <= 0 || nodes <= 0 {
		return 1
	}
	return max(1, nodes*CopysetsPerNode/replicas)
}

// DomainLevel names the failure domain Place separates replicas by.
type DomainLevel int

const (
	// DomainZone: the members of a copyset are in distinct zones.
	DomainZone DomainLevel = iota
	// DomainServer: the members are on distinct servers (there are fewer
	// zones than replicas). A (zone, server) pair is one server.
	DomainServer
)

func (l DomainLevel) String() string {
	if l == DomainZone {
		return "zone"
	}
	return "server"
}

// Domains returns the failure-domain level Place would use for nodes and
// replicas, and how many domains of that level exist. It fails with
// ErrNotEnoughDomains if neither zones nor servers are numerous enough.
func Domains(nodes []Node, replicas int) (DomainLevel, int, error) {
	zones := map[string]bool{}
	servers := map[[2]string]bool{}
	for _, n := range nodes {
		zones[n.Zone] = true
		servers[[2]string{n.Zone, n.Server}] = true
	}
	switch {
	case len(zones) >= replicas:
		return DomainZone, len(zones), nil
	case len(servers) >= replicas:
		return DomainServer, len(servers), nil
	}
	return DomainServer, len(servers), fmt.Errorf("%w: %d replicas need %d zones or servers, have %d zones and %d servers",
		ErrNotEnoughDomains, replicas, replicas, len(zones), len(servers))
}

// Place chooses the members of copysets copysets, each of replicas distinct
// chunkservers, and returns them indexed by copyset id; each member list is
// sorted by id. The result is a pure function of its arguments (the order of
// nodes does not matter).
//
// Rules, in priority order:
//  1. the members of a copyset are in distinct failure domains (Domains);
//  2. every chunkserver holds about the same number of copysets: each member
//     is chosen among the least-loaded candidates, so max-min <= 1 whenever
//     the failure domains allow it (they do not when, say, one zone has
//     fewer chunkservers than the others and every copyset needs a member in
//     every zone);
//  3. among equally loaded candidates, one whose failure domain is so far
//     below its share of replicas that it needs a member in every remaining
//     copyset wins (a domain gives at most one member to each copyset);
//  4. scatter width: then the candidate that shares a copyset with the
//     fewest of the already chosen members wins, so each chunkserver's set
//     of peers grows as wide as the copyset count allows; a final pass
//     swaps members of one failure domain between copysets while that
//     adds distinct peer pairs (loads and domains stay as they are).
//
// Ties are broken by a rotating order of ids, so that the result spreads
// evenly yet stays deterministic.
func Place(nodes []Node, copysets, replicas int) ([][]uint64, error) {
	if replicas <= 0 || copysets <= 0 {
		return nil, fmt.Errorf("%w: replicas %d, copysets %d must be positive", ErrBadArgument, replicas, copysets)
	}
	if len(nodes) < replicas {
		return nil, fmt.Errorf("%w: %d replicas need %d chunkservers, have %d",
			ErrNotEnoughDomains, replicas, replicas, len(nodes))
	}
	ns := append([]Node(nil), nodes...)
	sort.Slice(ns, func(i, j int) bool { return ns[i].ID < ns[j].ID })
	for i := range ns {
		if ns[i].ID == 0 || (i > 0 && ns[i].ID == ns[i-1].ID) {
			return nil, fmt.Errorf("%w: node id %d is zero or duplicate", ErrBadArgument, ns[i].ID)
		}
	}
	level, _, err := Domains(ns, replicas)
	if err != nil {
		return nil, err
	}
	domain := make([]int, len(ns)) // node index -> domain index
	domIdx := map[[2]string]int{}
	for i, n := range ns {
		k := [2]string{n.Zone, ""}
		if level == DomainServer {
			k[1] = n.Server
		}
		d, ok := domIdx[k]
		if !ok {
			d = len(domIdx)
			domIdx[k] = d
		}
		domain[i] = d
	}

	n := len(ns)
	domSize := make([]int, len(domIdx))
	for i := range ns {
		domSize[domain[i]]++
	}
	domLoad := make([]int, len(domIdx))
	load := make([]int, n)
	pairs := make([][]int, n) // pairs[a][b]: copysets shared by a and b
	for i := range pairs {
		pairs[i] = make([]int, n)
	}
	out := make([][]uint64, copysets)
	set := make([][]int, copysets) // node indexes per copyset
	chosen := make([]int, 0, replicas)
	usedDom := map[int]bool{}
	for c := range copysets {
		chosen = chosen[:0]
		clear(usedDom)
		for range replicas {
			best := -1
			var bestNew, bestShared, bestDeficit int
			for k := range n {
				i := (k + c) % n // rotate the tie-break order per copyset
				if usedDom[domain[i]] {
					continue
				}
				newPeers, shared := 0, 0
				for _, j := range chosen {
					if pairs[i][j] == 0 {
						newPeers++
					}
					shared += pairs[i][j]
				}
				// A domain far below its share must be used now: each
				// copyset can take only one member from it.
				// How far the domain lags behind its proportional
				// share after this copyset (scaled by n).
				// Lags within one replica count as equal.
				deficit := floorDiv(domSize[domain[i]]*(c+1)*replicas-domLoad[domain[i]]*n, n)
				better := best < 0 || deficit > bestDeficit ||
					(deficit == bestDeficit && load[i] < load[best])
				if !better && deficit == bestDeficit && load[i] == load[best] {
					switch {
					case newPeers != bestNew:
						better = newPeers > bestNew
					default:
						better = shared < bestShared
					}
				}
				if better {
					best, bestNew, bestShared, bestDeficit = i, newPeers, shared, deficit
				}
			}
			// Domains guaranteed enough distinct domains, so best >= 0.
			for _, j := range chosen {
				pairs[best][j]++
				pairs[j][best]++
			}
			chosen = append(chosen, best)
			usedDom[domain[best]] = true
			load[best]++
			domLoad[domain[best]]++
		}
		set[c] = append([]int(nil), chosen...)
	}
	if replicas > 1 {
		improveScatter(set, pairs, domain)
	}
	for c, m := range set {
		members := make([]uint64, len(m))
		for k, i := range m {
			members[k] = ns[i].ID
		}
		sort.Slice(members, func(a, b int) bool { return members[a] < members[b] })
		out[c] = members
	}
	return out, nil
}

// ScatterWidth returns, for each chunkserver id appearing in copysets, the
// number of distinct other chunkservers it shares at least one copyset with:
// how many disks take part when its data is re-replicated.
func ScatterWidth(copysets [][]uint64) map[uint64]int {
	peers := map[uint64]map[uint64]bool{}
	for _, m := range copysets {
		for _, a := range m {
			if peers[a] == nil {
				peers[a] = map[uint64]bool{}
			}
			for _, b := range m {
				if a != b {
					peers[a][b] = true
				}
			}
		}
	}
	out := make(map[uint64]int, len(peers))
	for id, p := range peers {
		out[id] = len(p)
	}
	return out
}

func floorDiv(a, b int) int {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// swapWindow bounds how many later copysets improveScatter pairs with each
// copyset, keeping it O(copysets × swapWindow × replicas³) per pass.
const swapWindow = 64

// improveScatter raises the number of distinct peer pairs by swapping two
// members of the same failure domain between two copysets, when that
// strictly helps. A swap keeps every load and every domain rule intact.
// pairs[a][b] counts the copysets a and b share and is kept up to date.
func improveScatter(set [][]int, pairs [][]int, domain []int) {
	// move replaces x by y in copyset m and returns the change in the
	// number of distinct pairs.
	move := func(m []int, pos, y int) int {
		x, delta := m[pos], 0
		for k, o := range m {
			if k == pos {
				continue
			}
			pairs[x][o]--
			pairs[o][x]--
			if pairs[x][o] == 0 {
				delta--
			}
			if pairs[y][o] == 0 {
				delta++
			}
			pairs[y][o]++
			pairs[o][y]++
		}
		m[pos] = y
		return delta
	}
	has := func(m []int, x int) bool {
		for _, o := range m {
			if o == x {
				return true
			}
		}
		return false
	}
	c := len(set)
	for pass := 0; pass < 4; pass++ {
		improved := false
		for a := range c {
			for off := 1; off <= min(c-1, swapWindow); off++ {
				b := (a + off) % c
				for i := range set[a] {
					for j := range set[b] {
						x, y := set[a][i], set[b][j]
						if x == y || domain[x] != domain[y] || has(set[a], y) || has(set[b], x) {
							continue
						}
						d := move(set[a], i, y) + move(set[b], j, x)
						if d > 0 {
							improved = true
							continue
						}
						move(set[b], j, y) // undo
						move(set[a], i, x)
					}
				}
			}
		}
		if !improved {
			return
		}
	}
}
