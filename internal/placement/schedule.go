package placement

import (
	"slices"
	"sort"
)

// This file holds the scheduler's decisions as pure functions: which member
// of which copyset moves where (repair and balancing) and which leaders are
// transferred. The MDS gathers the inputs (from etcd and heartbeats), calls
// these, and carries the results out; simulations and unit tests call them
// over random topologies.

// Copyset is one copyset as the scheduler sees it.
type Copyset struct {
	// ID identifies the copyset to the caller (the copyset id within its
	// pool, or a Raft group id); the functions only hand it back.
	ID      uint64
	Members []uint64 // chunkserver ids, as listed in the copyset record
	Leader  uint64   // current leader as heartbeats report it; 0 = unknown
	// Busy: a move or leader transfer of this copyset is in flight; it is
	// left alone.
	Busy bool
	// Bad lists the members to replace, most urgent first: dead past the
	// grace period, a replica stopped by a disk error, a chunkserver whose
	// disk is in trouble.
	Bad []uint64
}

// Move replaces member From of copyset Copyset by To.
type Move struct {
	Copyset  uint64
	From, To uint64
}

// Transfer hands the leadership of copyset Copyset from From to To.
type Transfer struct {
	Copyset  uint64
	From, To uint64
}

// Pool is the input of Repairs and Balance: one pool's copysets and the
// chunkservers around them.
type Pool struct {
	Replicas int
	// Nodes are every registered chunkserver, up or down: the failure-domain
	// level is decided over all of them (as Place does), so a replacement
	// keeps the rule the pool was placed with.
	Nodes []Node
	// Targets are the chunkservers that may receive a replica: online, with
	// a healthy disk.
	Targets  map[uint64]bool
	Copysets []Copyset
	// Load is the number of copysets (of every pool) each chunkserver is a
	// member of; nil = count this pool's. Repairs and Balance update it as
	// they plan moves, so several pools can be planned in a row.
	Load map[uint64]int
}

// Budget bounds the moves in flight: at most Total at once in the whole
// cluster, and at most PerNode at once involving any one chunkserver (as the
// receiver of the new replica, or as the copyset's leader, which streams the
// data). Zero or negative limits allow nothing.
type Budget struct {
	Total, PerNode int
	total          int
	node           map[uint64]int
}

// NewBudget returns an empty budget with the given limits.
func NewBudget(total, perNode int) *Budget {
	return &Budget{Total: total, PerNode: perNode, node: map[uint64]int{}}
}

// Use accounts a move in flight that involves nodes (0s are ignored).
func (b *Budget) Use(nodes ...uint64) {
	b.total++
	for _, n := range uniq(nodes) {
		b.node[n]++
	}
}

// Fits reports whether one more move involving nodes stays within limits.
func (b *Budget) Fits(nodes ...uint64) bool {
	if b.total >= b.Total {
		return false
	}
	for _, n := range uniq(nodes) {
		if b.node[n] >= b.PerNode {
			return false
		}
	}
	return true
}

// InFlight returns the moves accounted so far, in total and per chunkserver.
func (b *Budget) InFlight() (total int, perNode map[uint64]int) {
	return b.total, maps(b.node)
}

// Full reports whether no further move fits at all.
func (b *Budget) Full() bool { return b.total >= b.Total }

func uniq(nodes []uint64) []uint64 {
	out := make([]uint64, 0, len(nodes))
	for _, n := range nodes {
		if n != 0 && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func maps(m map[uint64]int) map[uint64]int {
	out := make(map[uint64]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// domains maps each node to its failure domain at the level Place would use
// for the pool's nodes and replica count.
func (p *Pool) domains() map[uint64]string {
	level, _, err := Domains(p.Nodes, p.Replicas)
	if err != nil {
		level = DomainServer // too few domains: still never two members on one server
	}
	out := make(map[uint64]string, len(p.Nodes))
	for _, n := range p.Nodes {
		if level == DomainZone {
			out[n.ID] = n.Zone
		} else {
			out[n.ID] = n.Zone + "\x00" + n.Server
		}
	}
	return out
}

func (p *Pool) load() map[uint64]int {
	if p.Load == nil {
		p.Load = map[uint64]int{}
		for _, c := range p.Copysets {
			for _, m := range c.Members {
				p.Load[m]++
			}
		}
	}
	return p.Load
}

// pairs counts, for every two chunkservers, the copysets of the pool they
// share (scatter width bookkeeping).
func (p *Pool) pairs() map[[2]uint64]int {
	out := map[[2]uint64]int{}
	for _, c := range p.Copysets {
		for _, a := range c.Members {
			for _, b := range c.Members {
				if a != b {
					out[[2]uint64{a, b}]++
				}
			}
		}
	}
	return out
}

// Replacement returns the target that takes from's place in a copyset with
// members, or 0 if none fits: a target that is not a member, in a failure
// domain none of the remaining members uses, least loaded; ties go to the
// one sharing the fewest copysets with the remaining members (scatter
// width), then to the lowest id.
func replacement(members []uint64, from uint64, targets []uint64, dom map[uint64]string,
	load map[uint64]int, pairs map[[2]uint64]int, fits func(uint64) bool) uint64 {
	used := map[string]bool{}
	for _, m := range members {
		if m != from {
			used[dom[m]] = true
		}
	}
	var best uint64
	bestShared := 0
	for _, id := range targets {
		d, known := dom[id]
		if !known || slices.Contains(members, id) || used[d] || !fits(id) {
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
	return best
}

func allIn(ids []uint64, set map[uint64]bool) bool {
	for _, id := range ids {
		if !set[id] {
			return false
		}
	}
	return true
}

func (p *Pool) sortedTargets() []uint64 {
	out := make([]uint64, 0, len(p.Targets))
	for id, ok := range p.Targets {
		if ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (p *Pool) apply(c *Copyset, m Move, pairs map[[2]uint64]int, load map[uint64]int) {
	for _, o := range c.Members {
		if o == m.From || o == m.To {
			continue
		}
		pairs[[2]uint64{m.From, o}]--
		pairs[[2]uint64{o, m.From}]--
		pairs[[2]uint64{m.To, o}]++
		pairs[[2]uint64{o, m.To}]++
	}
	load[m.From]--
	load[m.To]++
	i := slices.Index(c.Members, m.From)
	c.Members = slices.Clone(c.Members)
	c.Members[i] = m.To
	slices.Sort(c.Members)
	c.Busy = true
}

// Repairs plans the replacement of Bad members, in copyset order, while b
// has room: one move per copyset at a time, only where a leader is known
// (the leader carries the change out: add a learner on the target, catch it
// up, promote it, remove the bad member), the target chosen by the rules of
// replacement among p.Targets. Busy copysets are skipped (a caller whose
// move in flight failed — its target went bad — passes the copyset as not
// Busy, with that target among Bad).
// Every planned move is added to b (target and leader), and applied to
// p.Copysets (members replaced, Busy set) and p.Load, so that a following
// Balance over the same Pool sees it.
func Repairs(p Pool, b *Budget) []Move {
	dom := p.domains()
	load := p.load()
	pairs := p.pairs()
	targets := p.sortedTargets()
	var out []Move
	for i := range p.Copysets {
		if b.Full() {
			break
		}
		c := &p.Copysets[i]
		if len(c.Bad) == 0 || c.Leader == 0 || c.Busy {
			continue
		}
		for _, from := range c.Bad {
			to := replacement(c.Members, from, targets, dom, load, pairs,
				func(id uint64) bool { return b.Fits(id, c.Leader) })
			if to == 0 {
				continue
			}
			m := Move{Copyset: c.ID, From: from, To: to}
			p.apply(c, m, pairs, load)
			b.Use(to, c.Leader)
			out = append(out, m)
			break
		}
	}
	return out
}

// Balance plans moves that even out the number of this pool's copysets per
// target chunkserver, while b has room: repeatedly the most loaded target
// gives a copyset to the least loaded one that can take it (its failure
// domain unused by the copyset's other members), while that narrows the
// gap (loads differ by 2 or more). Only copysets whose members are all
// targets, with a known leader, not Busy and without Bad members move: a
// member down or in disk trouble is Repairs' business. Among the copysets the donor could
// give, the one whose move adds the most scatter width wins, then the
// lowest index. The result is deterministic. Like Repairs, it applies its
// moves to p.Copysets and p.Load and adds them to b.
func Balance(p Pool, b *Budget) []Move {
	dom := p.domains()
	pairs := p.pairs()
	targets := p.sortedTargets()
	if len(targets) < 2 {
		return nil
	}
	// Loads of this pool only: balancing is per pool.
	load := map[uint64]int{}
	for _, id := range targets {
		load[id] = 0
	}
	for _, c := range p.Copysets {
		for _, m := range c.Members {
			if _, ok := load[m]; ok {
				load[m]++
			}
		}
	}
	var out []Move
	for !b.Full() {
		byLoad := slices.Clone(targets)
		sort.SliceStable(byLoad, func(i, j int) bool { return load[byLoad[i]] > load[byLoad[j]] })
		found := false
	search:
		for _, from := range byLoad { // most loaded first
			for k := len(byLoad) - 1; k >= 0; k-- { // least loaded first
				to := byLoad[k]
				if load[from]-load[to] < 2 {
					break
				}
				best, bestGain := -1, 0
				for i := range p.Copysets {
					c := &p.Copysets[i]
					if c.Busy || len(c.Bad) > 0 || c.Leader == 0 || !slices.Contains(c.Members, from) ||
						slices.Contains(c.Members, to) || !allIn(c.Members, p.Targets) || !b.Fits(to, c.Leader) {
						continue
					}
					ok, gain := true, 0
					for _, o := range c.Members {
						if o == from {
							continue
						}
						if dom[o] == dom[to] {
							ok = false
							break
						}
						if pairs[[2]uint64{to, o}] == 0 {
							gain++
						}
						if pairs[[2]uint64{from, o}] == 1 {
							gain-- // from loses its only copyset with o
						}
					}
					if ok && (best < 0 || gain > bestGain) {
						best, bestGain = i, gain
					}
				}
				if best < 0 {
					continue
				}
				c := &p.Copysets[best]
				m := Move{Copyset: c.ID, From: from, To: to}
				p.apply(c, m, pairs, load)
				b.Use(to, c.Leader)
				if p.Load != nil {
					p.Load[from]--
					p.Load[to]++
				}
				out = append(out, m)
				found = true
				break search
			}
		}
		if !found {
			break
		}
	}
	return out
}

// LeaderTransfers plans leader transfers that even out the number of
// copysets each target chunkserver leads, over copysets of every pool (their
// IDs must be distinct): while some target leads at least two more than
// another member of one of its copysets could, it hands one copyset to the
// member of that copyset that leads the fewest. At most max transfers; Busy
// copysets and copysets with Bad members or no leader are left alone, and
// only targets receive leadership. Deterministic: donors by most leaders
// then id, copysets by ID, receivers by fewest leaders then id.
func LeaderTransfers(copysets []Copyset, targets map[uint64]bool, max int) []Transfer {
	leads := map[uint64]int{}
	for id, ok := range targets {
		if ok {
			leads[id] = 0
		}
	}
	cs := slices.Clone(copysets)
	sort.Slice(cs, func(i, j int) bool { return cs[i].ID < cs[j].ID })
	for _, c := range cs {
		if c.Leader != 0 {
			leads[c.Leader]++
		}
	}
	ids := make([]uint64, 0, len(leads))
	for id := range leads {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var out []Transfer
	moved := map[uint64]bool{}
	for len(out) < max {
		donors := slices.Clone(ids)
		sort.SliceStable(donors, func(i, j int) bool { return leads[donors[i]] > leads[donors[j]] })
		found := false
		for _, from := range donors {
			bestC, bestTo := -1, uint64(0)
			for i, c := range cs {
				if c.Leader != from || c.Busy || len(c.Bad) > 0 || moved[c.ID] {
					continue
				}
				for _, m := range c.Members {
					if m == from || !targets[m] || leads[from]-leads[m] < 2 {
						continue
					}
					if bestTo == 0 || leads[m] < leads[bestTo] || (leads[m] == leads[bestTo] && m < bestTo) {
						bestC, bestTo = i, m
					}
				}
			}
			if bestC < 0 {
				continue
			}
			c := &cs[bestC]
			out = append(out, Transfer{Copyset: c.ID, From: from, To: bestTo})
			leads[from]--
			leads[bestTo]++
			c.Leader = bestTo
			moved[c.ID] = true
			found = true
			break
		}
		if !found && len(out)+2 <= max {
			found = twoHopTransfer(cs, ids, leads, targets, moved, &out)
		}
		if !found {
			break
		}
	}
	return out
}

// twoHopTransfer evens leaders when no single transfer can: no copyset of the
// most-loaded target has a member leading two fewer (with 4 chunkservers and 3
// replicas every copyset leaves one out). The donor hands a copyset to a member
// leading one fewer (via), and via hands another of its copysets to a member
// leading at least two fewer than the donor; via's count stays the same.
func twoHopTransfer(cs []Copyset, ids []uint64, leads map[uint64]int, targets, moved map[uint64]bool, out *[]Transfer) bool {
	donors := slices.Clone(ids)
	sort.SliceStable(donors, func(i, j int) bool { return leads[donors[i]] > leads[donors[j]] })
	usable := func(c *Copyset, leader uint64) bool {
		return c.Leader == leader && !c.Busy && len(c.Bad) == 0 && !moved[c.ID]
	}
	for _, from := range donors {
		for i := range cs {
			c1 := &cs[i]
			if !usable(c1, from) {
				continue
			}
			for _, via := range c1.Members {
				if via == from || !targets[via] || leads[via] != leads[from]-1 {
					continue
				}
				for j := range cs {
					c2 := &cs[j]
					if j == i || !usable(c2, via) {
						continue
					}
					for _, to := range c2.Members {
						if to == via || to == from || !targets[to] || leads[from]-leads[to] < 2 {
							continue
						}
						*out = append(*out, Transfer{Copyset: c1.ID, From: from, To: via}, Transfer{Copyset: c2.ID, From: via, To: to})
						c1.Leader, c2.Leader = via, to
						moved[c1.ID], moved[c2.ID] = true, true
						leads[from]--
						leads[to]++
						return true
					}
				}
			}
		}
	}
	return false
}
