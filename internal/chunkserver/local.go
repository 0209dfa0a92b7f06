package chunkserver

import (
	"net"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// The local fast path (DESIGN §7): a front end running in this process (basalt
// chunkserver --nbd-listen/--nbd-socket) gives the ChunkServer to its volumes'
// clients as client.Config.Local. An attempt whose target is this chunkserver then
// reaches the handler through Go, as a frame from a connection would, but with no
// socket, no frame encoding and no copy of the reply: a read is made straight into
// the client's buffer.

// LocalID is this chunkserver's id (client.Local); 0 until it registered.
func (c *ChunkServer) LocalID() uint64 { return c.ID() }

// Go serves one client IO request in process (client.Local): read, write, trim or
// write-zeroes, validated exactly like a frame. done runs once, on a handler or
// raft goroutine (or before Go returns for a refused request).
func (c *ChunkServer) Go(call *transport.Call, done func(*transport.Call)) {
	rw := &localReply{call: call, done: done}
	hd := c.local.Load()
	if hd == nil { // not serving yet, or stopped: the client tries again later
		h := call.Header
		h.Status = api.StatusNotLeader
		rw.Reply(h, nil, nil)
		return
	}
	switch call.Header.Op {
	case transport.OpRead, transport.OpWrite, transport.OpTrim, transport.OpWriteZeroes:
		hd.serveIO(rw, call.Header, call.Payload, true)
	case transport.OpFlush, transport.OpPing:
		hd.reply(rw, call.Header, api.StatusOK, 0)
	default:
		hd.reply(rw, call.Header, api.StatusBadRequest, 0)
	}
}

// localReply is the transport.ReplyWriter of an in-process request.
type localReply struct {
	call *transport.Call
	done func(*transport.Call)
}

// Reply completes the call: payload (a read's data) is copied into the caller's
// buffer unless it already is that buffer (readBuffer).
func (r *localReply) Reply(h transport.Header, payload []byte, release func()) {
	n := len(payload)
	if n > 0 && (len(r.call.ReadBuf) == 0 || &payload[0] != &r.call.ReadBuf[0]) {
		n = copy(r.call.ReadBuf, payload)
	}
	if release != nil {
		release()
	}
	h.PayloadLen = uint32(n)
	h.Flags |= transport.FlagReply
	r.call.Reply = h
	r.done(r.call)
}

// Retain: the payload is the caller's buffer, valid until done anyway.
func (*localReply) Retain() {}

// RemoteAddr names the in-process caller.
func (*localReply) RemoteAddr() net.Addr { return localAddr{} }

// readBuffer is where a read of n bytes goes: the caller's own buffer.
func (r *localReply) readBuffer(n int) []byte {
	if len(r.call.ReadBuf) < n {
		return nil
	}
	return r.call.ReadBuf[:n]
}

type localAddr struct{}

func (localAddr) Network() string { return "local" }
func (localAddr) String() string  { return "local" }
