package raftstore

import (
	"encoding/binary"
	"time"

	"go.etcd.io/raft/v3"
)

// read starts the read barriers that arrived this round (see doc.go, "Reads").
func (g *group) read(reads []*readReq) {
	if !g.isLeader {
		err := g.notLeader()
		for _, r := range reads {
			r.finish(err)
		}
		return
	}
	now := g.h.now()
	g.lastReadAt, g.readSeen = now, true
	if now < g.leaseUntil {
		// Lease read: no other leader can exist before leaseUntil, so everything
		// committed anywhere is committed here; wait for it to be applied.
		commit := g.rn.BasicStatus().GetCommit()
		g.h.stats.leaseReads.Add(uint64(len(reads)))
		for _, r := range reads {
			r.index, r.term = commit, g.term
			g.waiting = append(g.waiting, r)
		}
		g.serveReads()
		return
	}
	g.h.stats.indexReads.Add(uint64(len(reads)))
	g.readIndex(reads)
}

// readIndex asks raft to confirm leadership with a quorum (ReadOnlySafe heartbeat
// round). Its answer, a ReadState, also renews the lease.
func (g *group) readIndex(reads []*readReq) {
	key := g.h.propSeq.Add(1)
	g.readIdx[key] = &readIndexReq{start: g.h.now(), term: g.term, reads: reads}
	g.rn.ReadIndex(encodeSeq(key))
}

// maybeRenewLease starts a lease renewal on a leader that served reads lately and
// whose lease runs out within half its length, so that busy groups never fall back
// to ReadIndex.
func (g *group) maybeRenewLease() {
	if !g.isLeader {
		return
	}
	now := g.h.now()
	d := g.h.leaseDur
	if fr := time.Duration(g.fastReadAt.Load()); fr != 0 && (!g.readSeen || fr > g.lastReadAt) {
		g.lastReadAt, g.readSeen = fr, true // reads served by ReadBarrier's fast path
	}
	if !g.readSeen || now-g.lastReadAt > 2*d {
		return
	}
	if g.renewAt != 0 && now-g.renewAt < d {
		return // one in flight
	}
	if g.leaseUntil-now > d/2 {
		return
	}
	g.renewAt = now
	g.readIndex(nil)
}

// handleReadStates takes raft's answers to ReadIndex: the lease is extended from the
// moment the request was issued, and its reads wait for the read index to apply.
func (g *group) handleReadStates(states []raft.ReadState) {
	for _, rs := range states {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		key := binary.BigEndian.Uint64(rs.RequestCtx)
		ri := g.readIdx[key]
		if ri == nil {
			continue
		}
		delete(g.readIdx, key)
		if ri.reads == nil {
			g.renewAt = 0
		}
		if !g.isLeader || ri.term != g.term {
			err := g.notLeader()
			for _, r := range ri.reads {
				r.finish(err)
			}
			continue
		}
		// A quorum acknowledged a heartbeat sent after ri.start in this term: those
		// followers refuse votes for an election timeout after receiving it. A
		// transfer started since then may elect another leader at once: no lease.
		if ri.start > g.transferAt {
			if until := ri.start + g.h.leaseDur; until > g.leaseUntil {
				g.leaseUntil = until
			}
		}
		for _, r := range ri.reads {
			r.index, r.term = rs.Index, ri.term
			g.waiting = append(g.waiting, r)
		}
	}
	g.serveReads()
}

// serveReads answers the waiting reads whose index has been applied.
func (g *group) serveReads() {
	if len(g.waiting) == 0 {
		return
	}
	var ready []*readReq
	kept := g.waiting[:0]
	for _, r := range g.waiting {
		if r.index <= g.applied {
			ready = append(ready, r)
		} else {
			kept = append(kept, r)
		}
	}
	clear(g.waiting[len(kept):])
	g.waiting = kept
	// A read waits in g.waiting only within one term: losing leadership or
	// the term fails it (failAll), so r.term is still this leader's term.
	for _, r := range ready {
		r.finish(nil)
	}
}
