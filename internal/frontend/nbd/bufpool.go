package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from power-of-two size classes, 4 KiB to 32 MiB, each a
// sync.Pool of *[]byte. A buffer is taken when a read or write request is parsed
// and returned after its reply was written (or dropped).
const (
	minBufShift = 12 // 4 KiB
	maxBufShift = 25 // 32 MiB
)

var bufPools [maxBufShift - minBufShift + 1]sync.Pool

// bufClass returns the pool index for n bytes (n <= 1<<maxBufShift).
func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

// getBuf returns a pooled buffer with len n. n must be in [1, 32 MiB].
func getBuf(n int) *[]byte {
	c := bufClass(n)
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<(c+minBufShift))
	return &b
}

// putBuf returns a buffer from getBuf to its pool.
func putBuf(p *[]byte) {
	c := bufClass(cap(*p))
	bufPools[c].Put(p)
}
