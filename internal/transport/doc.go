// Package transport is basalt's data plane on the wire: binary frames over TCP,
// pipelined, for client IO (client library → chunkserver) and for Raft traffic
// between chunkservers. Processes in one network namespace use an abstract Unix socket named
// after the server's TCP address instead (local.go); the frames are the same.
// Sockets are read and written with raw system calls (package sockio).
//
// # Frames
//
// The frame format — an 80-byte header (api.Header), then PayloadLen bytes of
// payload — is part of the public wire API and is specified in package api
// (pkg/api), with its ops and flags; this package moves frames.
//
// A receiver checks only what keeps the stream in sync — magic, version, the payload
// bound, and request-vs-reply direction — and closes the connection on a violation,
// since it can no longer find the next frame. The meaning of the other fields is the
// handler's to check, and a bad value gets a Status, not a closed connection.
//
// # Pipelining and ordering
//
// A connection carries any number of requests in flight. Requests are written in the
// order Conn.Go/Send were called (each side's write side drains a FIFO queue, one
// owner at a time), and the server reads and hands them to its Handler in that order. Replies are
// written in the order the handler produced them, which need not be request order:
// the client matches them to calls by ID. Nothing orders two requests beyond that —
// a client wanting "B after A completed" waits for A's reply.
//
// Each side's writer takes every frame queued at that moment and sends them in one
// writev (sockio.Writer): headers are encoded into one scratch buffer, payloads are
// passed as their own iovecs, never copied — a payload may itself be several
// pieces (Call.Vec, SendAsync), each its own iovec. A frame queued while nothing is being
// written and no other request is in flight on the connection (for a request:
// and the previous write carried one frame alone; for a reply: and the reader
// has no further request buffered) is written by the queuing goroutine itself:
// one non-blocking writev (syscall.RawConn), no wake-up of the writer goroutine.
// Whatever the socket does not take at once — part of a frame included — and
// every frame queued meanwhile go to the writer goroutine, which finishes them in
// order with blocking writes; so a caller never waits for the network, and under
// load the batching is as before. Both readers read through a 32 KiB
// buffer, so frames that arrive together (pipelined requests, a reply header and
// its payload, raft batches) cost one read syscall; a payload larger than the
// buffer goes straight to its destination. The client's reader reads a reply's
// header, then its payload into the call's ReadBuf. The server's reader reads a
// request's payload into a pooled buffer (internal/bufpool) that goes back to
// the pool when ServeFrame returns, unless the handler called Retain; or,
// when the handler is a PayloadAllocator that asks for it, into a buffer of
// the handler's own, at an offset it chooses (room for a header in front, or
// exactly the payload's size), which the server never reuses and names during
// ServeFrame (PayloadBufferer).
//
// # Flow control
//
// The server bounds the requests of one connection that were read but not yet
// answered (ServerConfig.MaxInFlight, default 256). At the bound its reader stops
// reading; TCP then pushes back to the client. Peer-traffic frames (OpRaft, which
// gets no reply, and OpSnapshot, whose sender waits for each reply anyway) take no
// slot: ServeFrame runs on the reader goroutine, so a handler that is slow with them
// already slows the reading, and an unanswered one can never pin a slot.
// Likewise a handler that blocks stalls its connection (and only it).
//
// # Failure
//
// A client connection that fails (read or write error, protocol violation, Close)
// fails every call in flight and every later call with an error wrapping ErrClosed;
// it is never reused — the owner dials a new one. Per-call deadlines are the
// caller's: Do takes a context, Go callers run their own timers and Abort the call.
// The writer holds a call's payload until its frame is written, and a frame
// cannot be taken back half written: a call aborted while its frame is being
// written completes when that write ends, and if it has not ended 2 s later
// (the peer stopped reading: a server whose requests hang does at MaxInFlight)
// the connection is closed.
// After a call's done callback ran, the Conn never touches its buffers again, even
// if a reply for it arrives later (it is read and discarded).
//
// A ConnCache is that owner for callers that talk to many servers (the client
// library, keyed by chunkserver id; the scrubber, keyed by address): one Conn per
// key, dialled on first use by a short-lived goroutine that every Get for the key
// waits on, and dialled again once it died; after a failed dial the key may fail
// fast for a while (RedialInterval) so callers move on to another replica.
//
// # Goroutines
//
// Conn: a reader (owns the read side of the socket) and a writer goroutine. The
// write side (header scratch, the batch being written) has one owner at a time,
// marked under Conn.mu: a goroutine in Go/Send/SendAsync writing inline, or the
// writer goroutine after a handoff. Call state (pending map, queue, per-call
// writer state) is guarded by Conn.mu; the lock is never held across IO or a done
// callback, and a Go call's done never runs inside Go (finished calls a sending
// goroutine comes across are left to the writer goroutine). Server: one accept
// loop per Serve; per connection a reader (runs the Handler) and a writer
// goroutine; reply queue and write-side owner guarded by the connection's mu.
package transport
