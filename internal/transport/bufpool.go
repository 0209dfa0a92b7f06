package transport

import (
	"math/bits"
	"sync"
)

// Payload buffers of the server side come from power-of-two size classes, from
// minClass (4 KiB) to MaxPayload, so that a 4 KiB write and a 4 MiB write reuse
// buffers of their own size.
const minClassShift = 12

var classPools [27 - minClassShift]sync.Pool // 4 KiB .. 64 MiB

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a buffer of length n (n <= MaxPayload) whose capacity is n's class.
func getBuf(n int) []byte {
	c := classOf(n)
	if c >= len(classPools) {
		return make([]byte, n)
	}
	if p, ok := classPools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, 1<<(c+minClassShift))
}

// putBuf returns a buffer obtained from getBuf. Foreign buffers are ignored.
func putBuf(b []byte) {
	c := classOf(cap(b))
	if c >= len(classPools) || cap(b) != 1<<(c+minClassShift) {
		return
	}
	b = b[:cap(b)]
	classPools[c].Put(&b)
}
