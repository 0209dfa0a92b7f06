package client

import (
	"slices"
	"sync"
)

// seqCounter numbers a writer's write, trim and write-zeroes pieces to one
// copyset (api.Header.Seq: every attempt of a piece carries the same number,
// so the copyset applies it once) and tells the lowest number still
// outstanding (api.Header.Settled: the copyset refuses anything below it
// should a copy of it arrive late).
//
// INVARIANT: open is ascending and holds exactly the numbers taken and not yet
// released.
type seqCounter struct {
	mu   sync.Mutex
	last uint64   // the last number taken; numbers start at 1
	open []uint64 // taken, not released
}

// take numbers a new piece.
func (c *seqCounter) take() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last++
	c.open = append(c.open, c.last)
	return c.last
}

// settled is the lowest number still outstanding (or the next one to take):
// no piece numbered below it will be sent again.
func (c *seqCounter) settled() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.open) > 0 {
		return c.open[0]
	}
	return c.last + 1
}

// release: the piece numbered s is done and sends nothing more.
func (c *seqCounter) release(s uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := slices.BinarySearch(c.open, s); ok {
		c.open = slices.Delete(c.open, i, i+1)
	}
}
