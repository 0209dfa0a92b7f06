package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/sockio"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Errors of the client side. A call that fails because its connection died carries
// an error wrapping ErrClosed (and the cause); errors.Is(err, ErrClosed) tells.
var (
	// ErrClosed: the connection is closed or died; no reply will come on it.
	ErrClosed = errors.New("transport: connection closed")
	// ErrShortBuffer: the reply announced more payload than Call.ReadBuf can hold.
	// The payload was skipped; the connection stays usable.
	ErrShortBuffer = errors.New("transport: reply payload larger than ReadBuf")
	// ErrAborted: the call was given up by Abort (or Do's context) before its reply.
	ErrAborted = errors.New("transport: call aborted")
	// ErrProtocol: the peer sent something a client never expects (a request frame).
	ErrProtocol = errors.New("transport: protocol violation")
)

// ConnConfig configures a client connection.
type ConnConfig struct {
	Logger *slog.Logger // default slog.Default()
	// Security: the handshake Dial makes before the connection is used
	// (security.go); Allow names the roles accepted as the server.
	Security Security
}

// Call is one request and, when it completes, its reply. A Call may be reused once
// its done callback ran.
type Call struct {
	Header  api.Header // ID and PayloadLen are assigned by Conn
	Payload []byte     // request payload (write data, raft batch), sent without copying
	// Vec is more request payload after Payload, in pieces: each is written
	// from where it lies (one iovec each), never copied or gathered first.
	Vec     [][]byte
	ReadBuf []byte     // reply payload is read straight into it; len must be >= reply PayloadLen
	Reply   api.Header // filled on completion
	Err     error      // transport error (conn closed, aborted); a non-OK Reply.Status is not an Err

	// Owned by the Conn between Go and done, guarded by Conn.mu.
	done     func(*Call)
	wstate   uint8 // wsIdle, wsQueued, wsWriting
	finished bool  // the result is decided; done runs once wstate is wsIdle
	oneWay   bool  // Send: finished as soon as written
	// done may run on the goroutine that queued the call, once its write is
	// done (Send's own wake-up, SendAsync without done); other dones never run
	// inside Go, whose caller may hold a lock that done takes.
	inlineDone bool
}

const (
	wsIdle    uint8 = iota // not held by the writer (written, never queued, or skipped)
	wsQueued               // in Conn.queue
	wsWriting              // in the batch being written: Payload is being read
)

// Conn is the client end of one connection (TCP or same-host): many calls in flight, replies
// matched by ID, in any order.
//
// Goroutines: a reader owns the socket's read side and reads each reply's payload
// straight into its call's ReadBuf. The write side has one owner at a time
// (writing): a goroutine that queues a call while nobody owns it sends the call
// itself with one non-blocking writev; whatever the socket did not take, and any
// call queued meanwhile, goes to the writer goroutine (handoff), which writes with
// the usual blocking writev of everything queued (header and payload buffers, no
// copy of the payload) until the queue is empty.
//
// INVARIANT: a call's done runs exactly once, only when finished && wstate == wsIdle,
// so once done ran the Conn never again touches Payload or ReadBuf.
// INVARIANT: a call is in pending iff it was accepted by Go, has no reply yet, was
// not aborted and the conn is alive; the reader removes it before filling ReadBuf.
// INVARIANT: queue is non-empty only while writing; handoff implies writing.
type Conn struct {
	nc  net.Conn
	br  *bufio.Reader // the reader's: frames that arrive together cost one read
	log *slog.Logger
	raw *sockio.Writer // inline writes only when raw.CanTry

	mu       sync.Mutex
	wake     *sync.Cond // signalled on handoff, deferred calls, and when err is set
	err      error      // non-nil once dead; wraps ErrClosed
	nextID   uint64
	pending  map[uint64]*Call
	queue    []*Call
	writing  bool    // the write side has an owner: a sending goroutine or the writer
	handoff  bool    // the owner is the writer goroutine
	busy     bool    // the last write had company (frames queued behind it or batched with it)
	written  uint64  // batches written (or failed): Abort's measure of a stuck write
	deferred []*Call // finished by a sending goroutine; their done runs on the writer

	// The write side, used only by its current owner.
	batch []*Call     // calls being written
	spare []*Call     // the previous batch slice, reused
	hdrs  []byte      // header scratch
	bufs  net.Buffers // the batch's frames
	rest  net.Buffers // unwritten tail of bufs a sending goroutine handed off

	readerDone chan struct{}
	writerDone chan struct{}

	peer   identity.Identity // the server, verified by the handshake (authed)
	authed bool
}

// Dial connects to addr (see LocalName) and starts the connection's goroutines.
func Dial(ctx context.Context, addr string, cfg ConnConfig) (*Conn, error) {
	if err := cfg.Security.check(); err != nil {
		return nil, err
	}
	nc, err := connect(ctx, addr)
	if err != nil {
		return nil, err
	}
	if cfg.Security.Mode == ModeNone {
		return NewConn(nc, cfg), nil
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	fc, peer, err := clientHandshake(ctx, nc, cfg.Security)
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	c := newConn(nc, fc, cfg)
	c.peer, c.authed = peer, true
	return c, nil
}

// NewConn runs the client protocol over an established connection (tests,
// in-process pipes). A *net.TCPConn gets TCP_NODELAY.
func NewConn(nc net.Conn, cfg ConnConfig) *Conn {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return newConn(nc, nc, cfg)
}

// newConn runs the client protocol over fc, which is nc or a TLS
// connection over it; closing the Conn closes nc.
func newConn(nc, fc net.Conn, cfg ConnConfig) *Conn {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Conn{
		nc:         nc,
		br:         bufio.NewReaderSize(sockio.NewReader(fc), readBufferSize),
		log:        log.With("remote", nc.RemoteAddr().String()),
		raw:        sockio.NewWriter(fc),
		pending:    make(map[uint64]*Call),
		readerDone: make(chan struct{}),
		writerDone: make(chan struct{}),
	}
	c.wake = sync.NewCond(&c.mu)
	go c.readLoop()
	go c.writeLoop()
	return c
}

// Peer is the verified identity of the server; ok is false without a
// security handshake (ModeNone, NewConn).
func (c *Conn) Peer() (id identity.Identity, ok bool) { return c.peer, c.authed }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Err returns nil while the connection is usable, and the reason it died after.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Go starts call and returns at once. done runs exactly once, on a connection
// goroutine (keep it short, never block in it); when the connection is already dead
// it runs on a new goroutine with call.Err set.
func (c *Conn) Go(call *Call, done func(*Call)) {
	call.done = done
	call.Err = nil
	call.Reply = api.Header{}
	call.finished = false
	call.oneWay = false
	call.inlineDone = false
	c.enqueue(call)
}

func (c *Conn) enqueue(call *Call) {
	c.mu.Lock()
	if c.err != nil {
		call.Err = c.err
		call.finished = true
		call.wstate = wsIdle
		c.mu.Unlock()
		go call.done(call)
		return
	}
	c.nextID++
	call.Header.ID = c.nextID
	call.Header.PayloadLen = uint32(len(call.Payload) + sockio.Len(call.Vec))
	call.Header.Flags &^= api.FlagReply
	if !call.oneWay {
		c.pending[call.Header.ID] = call
	}
	call.wstate = wsQueued
	c.queue = append(c.queue, call)
	switch {
	case c.writing: // the owner writes it before going idle
		c.mu.Unlock()
	case !c.raw.CanTry() || c.busy || len(c.pending) > 1:
		// With other calls in flight, or frames coming in bursts, more are
		// likely to follow: the writer goroutine's one writev for all of them
		// costs less than a writev each, and its wake-up is paid once per batch.
		c.writing, c.handoff = true, true
		c.wake.Signal()
		c.mu.Unlock()
	default:
		c.writing = true
		c.writeInline(call)
	}
}

// writeInline sends the queue (just call: it was empty, nobody was writing) with
// one non-blocking writev on the calling goroutine, and hands the write side to
// the writer goroutine if anything is left. Called with c.mu held and writing
// set by the caller; releases c.mu.
func (c *Conn) writeInline(call *Call) {
	if skipped := c.takeBatchLocked(); len(skipped) > 0 {
		panic("transport: a call finished before Go returned")
	}
	c.mu.Unlock()
	c.encodeBatch()
	n := c.raw.TryWrite(c.bufs)

	c.mu.Lock()
	if n < sockio.Len(c.bufs) {
		// The writer goroutine finishes these frames first, so the order holds.
		c.rest = sockio.Advance(c.bufs, n)
		c.handoff = true
		c.wake.Signal()
		c.mu.Unlock()
		return
	}
	clear(c.bufs)
	runHere := false
	for _, cl := range c.batch {
		cl.wstate = wsIdle
		if cl.oneWay {
			cl.finished = true
		}
		switch {
		case !cl.finished:
		case cl == call && cl.inlineDone:
			runHere = true
		default: // answered or aborted already; done must not run inside Go
			c.deferred = append(c.deferred, cl)
			c.wake.Signal()
		}
	}
	c.releaseBatchLocked()
	if len(c.queue) > 0 || c.err != nil {
		c.busy = true
		c.handoff = true
		c.wake.Signal()
	} else {
		c.writing = false
	}
	c.mu.Unlock()
	if runHere {
		call.done(call)
	}
}

// takeBatchLocked moves the queue to c.batch; calls finished before they went out
// (aborted) are left out and returned to be completed.
func (c *Conn) takeBatchLocked() (skipped []*Call) {
	c.batch, c.queue = c.queue, c.spare[:0]
	n := 0
	for _, call := range c.batch {
		if call.finished {
			call.wstate = wsIdle
			skipped = append(skipped, call)
			continue
		}
		call.wstate = wsWriting
		c.batch[n] = call
		n++
	}
	clear(c.batch[n:])
	c.batch = c.batch[:n]
	return skipped
}

func (c *Conn) releaseBatchLocked() {
	c.written++
	clear(c.batch)
	c.spare, c.batch = c.batch[:0], nil
}

// encodeBatch encodes c.batch into c.hdrs and lists its frames in c.bufs.
func (c *Conn) encodeBatch() {
	if need := len(c.batch) * api.HeaderSize; cap(c.hdrs) < need {
		c.hdrs = make([]byte, need)
	}
	c.hdrs = c.hdrs[:len(c.batch)*api.HeaderSize]
	c.bufs = c.bufs[:0]
	for i, call := range c.batch {
		hb := c.hdrs[i*api.HeaderSize : (i+1)*api.HeaderSize]
		call.Header.Encode(hb)
		c.bufs = append(c.bufs, hb)
		if len(call.Payload) > 0 {
			c.bufs = append(c.bufs, call.Payload)
		}
		for _, p := range call.Vec {
			if len(p) > 0 {
				c.bufs = append(c.bufs, p)
			}
		}
	}
}

// Do runs call and waits for its reply, or for ctx. When ctx ends first, the call
// is aborted and Do returns once the Conn let go of the call's buffers.
func (c *Conn) Do(ctx context.Context, call *Call) error {
	ch := make(chan struct{})
	c.Go(call, func(*Call) { close(ch) })
	select {
	case <-ch:
	case <-ctx.Done():
		c.Abort(call, ctx.Err())
		<-ch
	}
	return call.Err
}

// Abort gives up call (started with Go on c) with an error wrapping ErrAborted and
// cause. If the reply is already being received, the call completes normally
// instead. Either way done runs exactly once, possibly before Abort returns, and
// a reply arriving later is skipped. If the call's frame is being written, done
// runs once that write ends; should it not end within abortWriteGrace, the
// connection is closed (failing its other calls too): the peer is not taking
// the bytes, and a frame cannot be taken back half written.
func (c *Conn) Abort(call *Call, cause error) {
	c.mu.Lock()
	if call.finished || c.pending[call.Header.ID] != call {
		c.mu.Unlock()
		return
	}
	delete(c.pending, call.Header.ID)
	call.Err = fmt.Errorf("%w: %w", ErrAborted, cause)
	if call.wstate == wsWriting {
		// Its batch is the one being written: written moves on when it was.
		n, id := c.written, call.Header.ID
		time.AfterFunc(abortWriteGrace, func() {
			c.mu.Lock()
			stuck := c.written == n
			c.mu.Unlock()
			if stuck {
				c.fail(fmt.Errorf("request %d aborted (%w) and still not written %v later", id, cause, abortWriteGrace))
			}
		})
	}
	c.finishLocked(call)
}

// abortWriteGrace is how long the write of an aborted call's frame may still
// take before the connection is given up: an aborted call waited for its
// caller's timeout already, so a write still unfinished means a peer that
// stopped reading (a server whose requests hang stops at MaxInFlight).
const abortWriteGrace = 2 * time.Second

// Send writes a one-way frame (no reply is expected) and returns once it was
// written (payload may be reused then) or the connection failed.
func (c *Conn) Send(h api.Header, payload []byte) error {
	ch := make(chan struct{})
	call := &Call{Header: h, Payload: payload, oneWay: true, inlineDone: true, done: func(*Call) { close(ch) }}
	c.enqueue(call)
	<-ch
	return call.Err
}

// SendAsync queues a one-way frame whose payload is the concatenation of
// pieces and returns at once, without waiting for the write; done (may be
// nil) runs once it was written or the connection failed, on a connection
// goroutine. The pieces are written from where they lie (no copy) and must
// stay untouched until then.
func (c *Conn) SendAsync(h api.Header, pieces [][]byte, done func(error)) {
	call := &Call{Header: h, Vec: pieces, oneWay: true}
	if done == nil {
		call.done, call.inlineDone = noDone, true
	} else {
		call.done = func(cl *Call) { done(cl.Err) }
	}
	c.enqueue(call)
}

func noDone(*Call) {}

// Close closes the connection; calls in flight fail with an error wrapping ErrClosed.
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	return nil
}

// finishLocked marks call finished and, if the writer does not hold it, runs done.
// It is called with c.mu held and releases it.
func (c *Conn) finishLocked(call *Call) {
	call.finished = true
	run := call.wstate == wsIdle
	c.mu.Unlock()
	if run {
		call.done(call)
	}
}

// fail kills the connection with cause (once) and fails every pending call.
func (c *Conn) fail(cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if errors.Is(cause, ErrClosed) {
		c.err = cause
	} else {
		c.err = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	c.wake.Broadcast()
	var ready []*Call
	for id, call := range c.pending {
		delete(c.pending, id)
		call.Err = c.err
		call.finished = true
		if call.wstate == wsIdle {
			ready = append(ready, call)
		}
	}
	c.mu.Unlock()
	_ = c.nc.Close()
	if cause != ErrClosed {
		c.log.Debug("transport: connection failed", "err", cause)
	}
	for _, call := range ready {
		call.done(call)
	}
}

// writeLoop owns the socket's write side while handoff is set, and runs the done
// callbacks sending goroutines may not run.
func (c *Conn) writeLoop() {
	defer close(c.writerDone)
	var ready, deferred []*Call
	for {
		c.mu.Lock()
		for !c.handoff && len(c.deferred) == 0 && (c.err == nil || c.writing) {
			c.wake.Wait()
		}
		deferred, c.deferred = c.deferred, deferred[:0]
		ready = append(ready, deferred...)
		clear(deferred)
		if !c.handoff {
			exit := c.err != nil && !c.writing
			c.mu.Unlock()
			ready = runDone(ready)
			if exit {
				return
			}
			continue
		}
		if c.rest != nil {
			// A sending goroutine's batch, partly written: finish it first.
			c.mu.Unlock()
			ready = runDone(ready)
			rest := c.rest
			c.rest = nil
			_, err := c.raw.Write(rest)
			ready = c.batchWritten(err, ready)
			continue
		}
		if c.err != nil {
			// Release whatever is queued: fail() already decided pending calls.
			for _, call := range c.queue {
				call.wstate = wsIdle
				if !call.finished {
					call.Err = c.err
					call.finished = true
				}
				ready = append(ready, call)
			}
			c.queue = nil
			c.writing, c.handoff = false, false
			c.mu.Unlock()
			runDone(ready)
			return
		}
		if len(c.queue) == 0 {
			c.writing, c.handoff = false, false
			c.mu.Unlock()
			ready = runDone(ready)
			continue
		}
		ready = append(ready, c.takeBatchLocked()...)
		c.busy = len(c.batch) > 1
		c.mu.Unlock()
		ready = runDone(ready)

		c.encodeBatch()
		_, err := c.raw.Write(c.bufs)
		ready = c.batchWritten(err, ready)
	}
}

// batchWritten completes the writer goroutine's write of c.batch; ready is
// returned empty for reuse.
func (c *Conn) batchWritten(err error, ready []*Call) []*Call {
	clear(c.bufs)
	c.mu.Lock()
	for _, call := range c.batch {
		call.wstate = wsIdle
		if call.oneWay {
			call.finished = true
			if err != nil {
				call.Err = fmt.Errorf("%w: %w", ErrClosed, err)
			}
		}
		if call.finished {
			ready = append(ready, call)
		}
	}
	c.releaseBatchLocked()
	c.mu.Unlock()
	ready = runDone(ready)
	if err != nil {
		c.fail(err)
		// Loop once more to drain the queue under c.err.
	}
	return ready
}

// runDone runs the done callbacks of calls and returns the slice emptied.
func runDone(calls []*Call) []*Call {
	for _, call := range calls {
		call.done(call)
	}
	clear(calls)
	return calls[:0]
}

// readLoop owns the socket's read side.
func (c *Conn) readLoop() {
	defer close(c.readerDone)
	var hb [api.HeaderSize]byte
	for {
		if _, err := io.ReadFull(c.br, hb[:]); err != nil {
			c.fail(err)
			return
		}
		h, err := api.DecodeHeader(hb[:])
		if err != nil {
			c.fail(err)
			return
		}
		if !h.IsReply() {
			c.fail(fmt.Errorf("%w: request frame (op %d) on a client connection", ErrProtocol, h.Op))
			return
		}
		c.mu.Lock()
		call := c.pending[h.ID]
		if call != nil {
			delete(c.pending, h.ID)
		}
		c.mu.Unlock()

		n := int(h.PayloadLen)
		switch {
		case call == nil || n > len(call.ReadBuf):
			if n > 0 {
				if _, err := io.CopyN(io.Discard, c.br, int64(n)); err != nil {
					c.failCall(call, err)
					c.fail(err)
					return
				}
			}
			if call != nil {
				call.Reply = h
				call.Err = fmt.Errorf("%w: %d > %d bytes", ErrShortBuffer, n, len(call.ReadBuf))
			}
		case n > 0:
			if _, err := io.ReadFull(c.br, call.ReadBuf[:n]); err != nil {
				c.failCall(call, err)
				c.fail(err)
				return
			}
			call.Reply = h
		default:
			call.Reply = h
		}
		if call != nil {
			c.mu.Lock()
			c.finishLocked(call)
		}
	}
}

// failCall completes a call the reader had taken out of pending with a conn error.
func (c *Conn) failCall(call *Call, err error) {
	if call == nil {
		return
	}
	c.mu.Lock()
	call.Err = fmt.Errorf("%w: %w", ErrClosed, err)
	c.finishLocked(call)
}
