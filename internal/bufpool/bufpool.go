package bufpool

import (
	"math/bits"
	"sync"
)

// The size classes: 1<<minShift (4 KiB) to 1<<maxShift (64 MiB) bytes.
const (
	minShift = 12
	maxShift = 26
)

// MaxPooled is the largest buffer the pool keeps.
const MaxPooled = 1 << maxShift

var pools [maxShift - minShift + 1]sync.Pool // of *[]byte, cap 1<<(class+minShift)

// class returns the size class of n bytes: the smallest that holds n.
func class(n int) int {
	if n <= 1<<minShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minShift
}

// Get returns a buffer of length n (contents undefined) whose capacity is
// n's class size, or, above MaxPooled, exactly n.
func Get(n int) *[]byte {
	c := class(n)
	if c >= len(pools) {
		b := make([]byte, n)
		return &b
	}
	if p, ok := pools[c].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<(c+minShift))
	return &b
}

// Put returns a buffer to its class's pool; nobody may use it afterwards.
// A buffer whose capacity is not a class size (one Get did not pool, or from
// elsewhere) is dropped for the garbage collector.
//
// Under the race detector Put fills the buffer with Poison first, so that a
// use after Put (a payload kept past its frame, data aliased into a raft
// entry) shows as garbage in the tests at once, not only once the buffer
// serves another request.
func Put(p *[]byte) {
	c := class(cap(*p))
	if c >= len(pools) || cap(*p) != 1<<(c+minShift) {
		return
	}
	if raceEnabled {
		b := (*p)[:cap(*p)]
		for i := range b {
			b[i] = Poison
		}
	}
	pools[c].Put(p)
}

// Poison is what Put fills a buffer with under the race detector.
const Poison = 0xdb
