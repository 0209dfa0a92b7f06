package raftstore

import "sync"

// scheduler is the ready-queue of groups with work. A group is in the queue at most
// once, and handed to at most one worker at a time: a group signalled while a worker
// holds it is re-queued when the worker is done with it.
//
// INVARIANT: for every group g, at most one of g.queued and g.processing is true;
// g.requeue implies g.processing. All three are guarded by scheduler.mu.
type scheduler struct {
	mu      sync.Mutex
	cond    sync.Cond
	queue   []*group
	stopped bool
}

func newScheduler() *scheduler {
	s := &scheduler{}
	s.cond.L = &s.mu
	return s
}

// signal makes g ready: queued now, or after the worker holding it is done.
func (s *scheduler) signal(g *group) {
	s.mu.Lock()
	switch {
	case g.processing:
		g.requeue = true
	case !g.queued:
		g.queued = true
		s.queue = append(s.queue, g)
		s.cond.Signal()
	}
	s.mu.Unlock()
}

// pop takes up to max groups off the queue (all of them when max <= 0) and marks them
// processing. With wait it blocks until there is one or the scheduler stops; it
// returns nil only when stopped (wait) or empty (!wait).
func (s *scheduler) pop(max int, wait bool) []*group {
	s.mu.Lock()
	defer s.mu.Unlock()
	for wait && len(s.queue) == 0 && !s.stopped {
		s.cond.Wait()
	}
	if s.stopped || len(s.queue) == 0 {
		return nil
	}
	n := len(s.queue)
	if max > 0 && n > max {
		n = max
	}
	batch := make([]*group, n)
	copy(batch, s.queue[:n])
	rest := copy(s.queue, s.queue[n:])
	clear(s.queue[rest:])
	s.queue = s.queue[:rest]
	for _, g := range batch {
		g.queued = false
		g.processing = true
	}
	return batch
}

// done releases groups handed out by pop, re-queueing those signalled meanwhile.
func (s *scheduler) done(batch []*group) {
	s.mu.Lock()
	for _, g := range batch {
		g.processing = false
		if g.requeue {
			g.requeue = false
			g.queued = true
			s.queue = append(s.queue, g)
			s.cond.Signal()
		}
	}
	s.mu.Unlock()
}

func (s *scheduler) stop() {
	s.mu.Lock()
	s.stopped = true
	s.cond.Broadcast()
	s.mu.Unlock()
}
