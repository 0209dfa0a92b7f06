package nbd

import (
	"bytes"
	"testing"
	"time"
)

// TestInlineReplyHandedOff: a read reply far larger than the socket buffers is
// written inline by the completing goroutine as far as the socket takes it; the
// writer goroutine finishes it, and the next replies follow it intact and in
// order, while the client reads nothing for a while.
func TestInlineReplyHandedOff(t *testing.T) {
	const big = 8 << 20
	disk := newMem(16 << 20)
	data := make([]byte, len(disk.data))
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	copy(disk.data, data)
	ts := startServer(t, Config{Exports: memExports{"disk": disk}})
	c := open(t, ts.sock, "disk")

	c.send(cmdRead, 0, 1, 0, big, nil)
	// The backend completes on the reader goroutine: it must come back to read
	// the next requests even though the reply does not fit the socket.
	deadline := time.Now().Add(5 * time.Second)
	for !ts.handedOff() {
		if time.Now().After(deadline) {
			t.Fatal("the writer goroutine never took over the reply that did not fit")
		}
		time.Sleep(time.Millisecond)
	}
	c.send(cmdRead, 0, 2, big, 4096, nil)
	c.send(cmdWrite, 0, 3, 4096, 4, []byte("abcd"))
	for disk.submitted.Load() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 requests submitted: the reader is stuck behind a reply", disk.submitted.Load())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)

	lens := map[uint64]int{1: big, 2: 4096, 3: 0}
	for _, want := range []struct {
		cookie uint64
		data   []byte
	}{{1, data[:big]}, {2, data[big : big+4096]}, {3, nil}} {
		cookie, errno, got := c.reply(func(ck uint64) int { return lens[ck] })
		if cookie != want.cookie || errno != 0 || !bytes.Equal(got, want.data) {
			t.Fatalf("reply cookie %d errno %d (%d bytes); want cookie %d, %d bytes intact",
				cookie, errno, len(got), want.cookie, len(want.data))
		}
	}
}

// handedOff reports whether some connection's writer goroutine owns its write side.
func (ts *testServer) handedOff() bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for c := range ts.active {
		c.wmu.Lock()
		h := c.handoff
		c.wmu.Unlock()
		if h {
			return true
		}
	}
	return false
}
