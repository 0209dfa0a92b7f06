package chunkserver

import (
	"net"

	"github.com/basalt-storage/basalt/pkg/api"
)

// The local fast path (docs/design.md §7): a front end running in this process (basalt
// chunkserver --nbd-listen/--nbd-socket) gives the ChunkServer to its volumes'
// clients as client.Config.Local. An attempt whose target is this chunkserver then
// reaches the handler through Go, as a frame from a connection would, but with no
// socket, no frame encoding and no copy of the reply: a read is made straight into
// the client's buffer.

// LocalID is this chunkserver's id (client.Local); 0 until it registered.
func (c *ChunkServer) LocalID() uint64 { return c.ID() }

// Go serves one client IO request in process (client.Local): read, write, trim,
// write-zeroes, mapped, compare-and-write or fence, validated exactly like a frame. done runs once, on a handler or
// raft goroutine (or before Go returns for a refused request).
func (c *ChunkServer) Go(req api.Header, payload, readBuf []byte, done func(reply api.Header)) {
	rw := &localReply{readBuf: readBuf, done: done}
	hd := c.local.Load()
	if hd == nil { // not serving yet, or stopped: the client tries again later
		req.Status = api.StatusNotLeader
		rw.Reply(req, nil, nil)
		return
	}
	switch req.Op {
	case api.OpRead, api.OpWrite, api.OpTrim, api.OpWriteZeroes, api.OpMapped, api.OpCompareAndWrite:
		hd.serveIO(rw, req, payload, nil, true)
	case api.OpFence:
		hd.fence(rw, req, true)
	case api.OpFlush, api.OpPing:
		hd.reply(rw, req, api.StatusOK, 0)
	default:
		hd.reply(rw, req, api.StatusBadRequest, 0)
	}
}

// localReply is the transport.ReplyWriter of an in-process request.
type localReply struct {
	readBuf []byte // a read's destination, the caller's buffer
	done    func(reply api.Header)
}

// Reply completes the request: payload (a read's data) is copied into the
// caller's buffer unless it already is that buffer (readBuffer).
func (r *localReply) Reply(h api.Header, payload []byte, release func()) {
	n := len(payload)
	if n > 0 && (len(r.readBuf) == 0 || &payload[0] != &r.readBuf[0]) {
		n = copy(r.readBuf, payload)
	}
	if release != nil {
		release()
	}
	h.PayloadLen = uint32(n)
	h.Flags |= api.FlagReply
	r.done(h)
}

// Retain: the payload is the caller's buffer, valid until done anyway.
func (*localReply) Retain() {}

// RemoteAddr names the in-process caller.
func (*localReply) RemoteAddr() net.Addr { return localAddr{} }

// readBuffer is where a read of n bytes goes: the caller's own buffer.
func (r *localReply) readBuffer(n int) []byte {
	if len(r.readBuf) < n {
		return nil
	}
	return r.readBuf[:n]
}

type localAddr struct{}

func (localAddr) Network() string { return "local" }
func (localAddr) String() string  { return "local" }
