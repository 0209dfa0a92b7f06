package chunkserver

import (
	"bytes"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

var _ client.Local = (*ChunkServer)(nil)

// goLocal runs one request through ChunkServer.Go and waits for its answer.
func goLocal(t *testing.T, c *ChunkServer, call *transport.Call) *transport.Call {
	t.Helper()
	ch := make(chan *transport.Call, 1)
	c.Go(call, func(done *transport.Call) { ch <- done })
	select {
	case got := <-ch:
		if got != call {
			t.Fatal("done got another call")
		}
		return got
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
		return nil
	}
}

// TestLocalGo: the in-process path answers NOT_LEADER before the data plane
// serves, then writes through the handler and reads straight into the caller's
// buffer, with the statuses a frame would get.
func TestLocalGo(t *testing.T) {
	e := newHandlerEnv(t)
	c := &ChunkServer{}
	if r := goLocal(t, c, &transport.Call{Header: ioHdr(transport.OpRead, 0, 4096), ReadBuf: make([]byte, 4096)}); r.Reply.Status != api.StatusNotLeader || r.Reply.Hint != 0 {
		t.Fatalf("before serving: %v hint %d, want NOT_LEADER without a hint", r.Reply.Status, r.Reply.Hint)
	}
	c.local.Store(e.hd)

	data := bytes.Repeat([]byte("basalt!!"), 512)
	off := uint64(3*hChunk + 8192)
	w := goLocal(t, c, &transport.Call{Header: ioHdr(transport.OpWrite, off, uint32(len(data))), Payload: data})
	if w.Err != nil || w.Reply.Status != api.StatusOK {
		t.Fatalf("write: %v %v", w.Err, w.Reply.Status)
	}
	buf := make([]byte, len(data))
	r := goLocal(t, c, &transport.Call{Header: ioHdr(transport.OpRead, off, uint32(len(data))), ReadBuf: buf})
	if r.Err != nil || r.Reply.Status != api.StatusOK || int(r.Reply.PayloadLen) != len(data) || !r.Reply.IsReply() {
		t.Fatalf("read: %v %v len %d", r.Err, r.Reply.Status, r.Reply.PayloadLen)
	}
	if !bytes.Equal(buf, data) {
		t.Fatal("read data differs from the write")
	}
	// Validation is the handler's: a piece crossing a chunk is refused.
	bad := goLocal(t, c, &transport.Call{Header: ioHdr(transport.OpRead, hChunk-512, 1024), ReadBuf: make([]byte, 1024)})
	if bad.Reply.Status != api.StatusOutOfRange {
		t.Fatalf("crossing read: %v, want OUT_OF_RANGE", bad.Reply.Status)
	}
	// And the same data is there for a frame from a connection.
	if _, p := e.do(e.dial(), ioHdr(transport.OpRead, off, uint32(len(data))), nil); !bytes.Equal(p, data) {
		t.Fatal("a remote read differs from the local write")
	}
}

// TestLocalReplyReadBuffer: a read is made in the caller's buffer, and a
// payload that is not that buffer is copied into it.
func TestLocalReplyReadBuffer(t *testing.T) {
	buf := make([]byte, 8)
	var got *transport.Call
	call := &transport.Call{ReadBuf: buf}
	lr := &localReply{call: call, done: func(c *transport.Call) { got = c }}
	rb := lr.readBuffer(8)
	if &rb[0] != &buf[0] {
		t.Fatal("readBuffer is not the caller's buffer")
	}
	if lr.readBuffer(9) != nil {
		t.Fatal("readBuffer larger than the caller's buffer")
	}
	released := false
	lr.Reply(transport.Header{Op: transport.OpRead}, []byte("abcdefgh"), func() { released = true })
	if got != call || !released || string(buf) != "abcdefgh" || call.Reply.PayloadLen != 8 {
		t.Fatalf("reply: got %v released %v buf %q len %d", got != nil, released, buf, call.Reply.PayloadLen)
	}
}
