package chunkserver

import "sync"

// writeGate orders the writes a replica proposes against its
// compare-and-writes (caw.go). Every write, trim and write-zeroes holds its
// byte range in the gate, shared, from before it is proposed until its
// callback ran; a compare-and-write holds its range exclusively from before
// its read barrier until its own write's callback ran. Shared holders of
// overlapping ranges run together; an exclusive one waits for the
// overlapping holders already in, and holds back every overlapping newcomer
// (first come, first served: a waiting exclusive entry also holds back the
// shared ones that arrive after it, so a stream of writes cannot starve it).
//
// The common path — a write, with no compare-and-write around — is one lock
// and an append to a small slice, and one lock and a swap-delete to leave.
//
// INVARIANT: no two entries of active conflict (overlap, one of them
// exclusive); a queued entry conflicts with an active entry or with a queued
// entry before it; excl counts the exclusive entries active or queued.
type writeGate struct {
	mu     sync.Mutex
	next   uint64
	active []gateEntry
	queued []*gateWaiter
	excl   int
}

// gateSpan is a byte range [off, end) of one volume.
type gateSpan struct{ vol, off, end uint64 }

func (a gateSpan) overlaps(b gateSpan) bool {
	return a.vol == b.vol && a.off < b.end && b.off < a.end
}

type gateEntry struct {
	gateSpan
	excl bool
	id   uint64
}

func (a gateEntry) conflicts(b gateEntry) bool {
	return (a.excl || b.excl) && a.gateSpan.overlaps(b.gateSpan)
}

// gateWaiter is an entry waiting to enter: fn runs once it is in (set by
// then; admitted is true if it got in before then was called).
type gateWaiter struct {
	gateEntry
	admitted bool
	fn       func()
}

// enter asks to hold s (exclusively if excl). It returns the entry's id, and
// nil when it is in already; otherwise the caller must hand the returned
// waiter to then, with what to do once it is in.
func (g *writeGate) enter(s gateSpan, excl bool) (uint64, *gateWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	e := gateEntry{gateSpan: s, excl: excl, id: g.next}
	if excl {
		g.excl++
	}
	if g.excl == 0 || !g.blockedLocked(e, len(g.queued)) {
		g.active = append(g.active, e)
		return e.id, nil
	}
	w := &gateWaiter{gateEntry: e}
	g.queued = append(g.queued, w)
	return e.id, w
}

// then runs fn once w is in: now, on the caller's goroutine, if it is in
// already; else on the goroutine of the leave that lets it in.
func (g *writeGate) then(w *gateWaiter, fn func()) {
	g.mu.Lock()
	if !w.admitted {
		w.fn = fn
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	fn()
}

// blockedLocked reports whether e conflicts with an active entry or one of
// the first n queued ones.
func (g *writeGate) blockedLocked(e gateEntry, n int) bool {
	for _, a := range g.active {
		if e.conflicts(a) {
			return true
		}
	}
	for _, w := range g.queued[:n] {
		if e.conflicts(w.gateEntry) {
			return true
		}
	}
	return false
}

// leave ends the holding of entry id and lets in the waiters it held back.
func (g *writeGate) leave(id uint64) {
	g.mu.Lock()
	for i, a := range g.active {
		if a.id != id {
			continue
		}
		if a.excl {
			g.excl--
		}
		last := len(g.active) - 1
		g.active[i] = g.active[last]
		g.active = g.active[:last]
		break
	}
	if len(g.queued) == 0 {
		g.mu.Unlock()
		return
	}
	var run []func()
	kept := 0
	for i, w := range g.queued {
		// Against the active entries and the waiters before it that stay.
		blocked := false
		for _, a := range g.active {
			if w.conflicts(a) {
				blocked = true
				break
			}
		}
		for _, q := range g.queued[:kept] {
			if blocked {
				break
			}
			blocked = w.conflicts(q.gateEntry)
		}
		if blocked {
			g.queued[kept] = g.queued[i]
			kept++
			continue
		}
		g.active = append(g.active, w.gateEntry)
		w.admitted = true
		if w.fn != nil {
			run = append(run, w.fn)
		}
	}
	clear(g.queued[kept:])
	g.queued = g.queued[:kept]
	g.mu.Unlock()
	for _, fn := range run {
		fn()
	}
}
