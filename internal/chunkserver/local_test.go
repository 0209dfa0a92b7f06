package chunkserver

import (
	"bytes"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

var _ client.Local = (*ChunkServer)(nil)

// goLocal runs one request through ChunkServer.Go and waits for its reply.
func goLocal(t *testing.T, c *ChunkServer, req api.Header, payload, readBuf []byte) api.Header {
	t.Helper()
	ch := make(chan api.Header, 1)
	c.Go(req, payload, readBuf, func(reply api.Header) { ch <- reply })
	select {
	case got := <-ch:
		return got
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
		return api.Header{}
	}
}

// TestLocalGo: the in-process path answers NOT_LEADER before the data plane
// serves, then writes through the handler and reads straight into the caller's
// buffer, with the statuses a frame would get.
func TestLocalGo(t *testing.T) {
	e := newHandlerEnv(t)
	c := &ChunkServer{}
	if r := goLocal(t, c, ioHdr(api.OpRead, 0, 4096), nil, make([]byte, 4096)); r.Status != api.StatusNotLeader || r.Hint != 0 {
		t.Fatalf("before serving: %v hint %d, want NOT_LEADER without a hint", r.Status, r.Hint)
	}
	c.local.Store(e.hd)

	data := bytes.Repeat([]byte("basalt!!"), 512)
	off := uint64(3*hChunk + 8192)
	if w := goLocal(t, c, ioHdr(api.OpWrite, off, uint32(len(data))), data, nil); w.Status != api.StatusOK {
		t.Fatalf("write: %v", w.Status)
	}
	buf := make([]byte, len(data))
	r := goLocal(t, c, ioHdr(api.OpRead, off, uint32(len(data))), nil, buf)
	if r.Status != api.StatusOK || int(r.PayloadLen) != len(data) || !r.IsReply() {
		t.Fatalf("read: %v len %d", r.Status, r.PayloadLen)
	}
	if !bytes.Equal(buf, data) {
		t.Fatal("read data differs from the write")
	}
	// Validation is the handler's: a piece crossing a chunk is refused.
	if bad := goLocal(t, c, ioHdr(api.OpRead, hChunk-512, 1024), nil, make([]byte, 1024)); bad.Status != api.StatusOutOfRange {
		t.Fatalf("crossing read: %v, want OUT_OF_RANGE", bad.Status)
	}
	// And the same data is there for a frame from a connection.
	if _, p := e.do(e.dial(), ioHdr(api.OpRead, off, uint32(len(data))), nil); !bytes.Equal(p, data) {
		t.Fatal("a remote read differs from the local write")
	}
}

// TestLocalReplyReadBuffer: a read is made in the caller's buffer, and a
// payload that is not that buffer is copied into it.
func TestLocalReplyReadBuffer(t *testing.T) {
	buf := make([]byte, 8)
	var got *api.Header
	lr := &localReply{readBuf: buf, done: func(reply api.Header) { got = &reply }}
	rb := lr.readBuffer(8)
	if &rb[0] != &buf[0] {
		t.Fatal("readBuffer is not the caller's buffer")
	}
	if lr.readBuffer(9) != nil {
		t.Fatal("readBuffer larger than the caller's buffer")
	}
	released := false
	lr.Reply(api.Header{Op: api.OpRead}, []byte("abcdefgh"), func() { released = true })
	if got == nil || !released || string(buf) != "abcdefgh" || got.PayloadLen != 8 || !got.IsReply() {
		t.Fatalf("reply: got %v released %v buf %q", got, released, buf)
	}
}

// TestLocalCompareAndWrite: the in-process path serves compare-and-write as
// a frame gets it; the caller's buffer is free again once the answer came
// (the handler keeps its own copy while it waits for the barrier).
func TestLocalCompareAndWrite(t *testing.T) {
	e := newHandlerEnv(t)
	c := &ChunkServer{}
	c.local.Store(e.hd)
	off := uint64(3*hChunk + 8192)
	buf := append(make([]byte, 512), bytes.Repeat([]byte{'x'}, 512)...)
	if r := goLocal(t, c, cawHdr(off, 512, 0), buf, nil); r.Status != api.StatusOK {
		t.Fatalf("compare-and-write zeros→x: %v", r.Status)
	}
	if r := goLocal(t, c, cawHdr(off, 512, 0), buf, nil); r.Status != api.StatusMiscompare || r.Hint != 0 {
		t.Fatalf("again: %v hint %d, want MISCOMPARE at 0", r.Status, r.Hint)
	}
	if _, p := e.do(e.dial(), ioHdr(api.OpRead, off, 512), nil); !bytes.Equal(p, buf[512:]) {
		t.Fatal("a remote read does not see the compare-and-write")
	}
}
