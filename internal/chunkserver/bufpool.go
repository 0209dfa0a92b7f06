package chunkserver

import (
	"math/bits"
	"sync"
)

// Read buffers come from power-of-two size classes, 4 KiB up to 64 MiB.
const (
	minBufShift = 12
	maxBufShift = 26
)

var bufPools [maxBufShift - minBufShift + 1]sync.Pool

func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

// getBuf returns a buffer of length n (contents undefined).
func getBuf(n int) []byte {
	c := bufClass(n)
	if c >= len(bufPools) {
		return make([]byte, n)
	}
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, 1<<(c+minBufShift))
}

// putBuf returns a buffer from getBuf to its pool.
func putBuf(b []byte) {
	c := bufClass(cap(b))
	if c >= len(bufPools) || cap(b) != 1<<(c+minBufShift) {
		return
	}
	b = b[:cap(b)]
	bufPools[c].Put(&b)
}
