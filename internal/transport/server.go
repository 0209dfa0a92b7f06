package transport

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/bufpool"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/sockio"
	"github.com/basalt-storage/basalt/pkg/api"
)

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("transport: server closed")

// DefaultMaxInFlight is ServerConfig.MaxInFlight's default.
const DefaultMaxInFlight = 256

// ServerConfig configures a Server.
type ServerConfig struct {
	// MaxInFlight bounds the requests (frames that expect a reply) of one connection
	// that were read but not yet answered. At the bound the connection's reader stops
	// reading until a reply went out, so a fast client fills its socket buffers
	// instead of the server's memory. Default DefaultMaxInFlight.
	MaxInFlight int
	// MaxPayload bounds a request's payload; a larger one closes the connection.
	// Default (and upper limit) MaxPayload.
	MaxPayload int
	Logger     *slog.Logger // default slog.Default()

	// Security: the handshake every connection makes before its first frame
	// is read (security.go); the zero value is ModeNone.
	Security Security
	// HandshakeTimeout bounds the handshake (default DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// MaxConns bounds the open connections; more are closed as they are
	// accepted (default DefaultMaxConns).
	MaxConns int
	// FrameTimeout bounds the time from a frame's first byte to its last: a
	// peer that starts a frame and stalls (slow loris) is disconnected. Idle
	// time between frames is not bounded. Default DefaultFrameTimeout.
	FrameTimeout time.Duration
}

// Defaults of ServerConfig's limits.
const (
	DefaultMaxConns     = 4096
	DefaultFrameTimeout = 60 * time.Second
)

// Handler serves the frames of a Server.
type Handler interface {
	// ServeFrame handles one request. payload is valid only until ServeFrame returns
	// unless the handler calls rw.Retain. The handler answers (now or later, from any
	// goroutine) with rw.Reply; OpRaft frames get no reply; OpSnapshot frames may
	// be answered (the sender decides by waiting or not).
	// ServeFrame runs on the connection's reader goroutine: while it runs, no further
	// frame of that connection is read.
	ServeFrame(rw ReplyWriter, h api.Header, payload []byte)
}

// PayloadAllocator is an optional ability of a Handler: it provides the
// buffers some frames' payloads are read into. A handler that keeps a payload
// beyond ServeFrame gets a buffer of exactly the payload's size this way
// (instead of a pooled one of the next power of two), and one that puts a
// header in front of a payload gets room for it (no copy of the payload).
type PayloadAllocator interface {
	// AllocPayload returns the buffer the n-byte payload of frame h is read
	// into, at (*buf)[off:off+n], or nil for a pooled buffer of the server's.
	// For a payload larger than StagedPayload it is asked once half the
	// payload arrived: a buffer of about off+n bytes then (not one rounded
	// up to a pool class) keeps what a peer that stalls makes the server
	// hold within twice what arrived.
	// A buffer it returned belongs to the handler: the server never reuses
	// it, and during ServeFrame the ReplyWriter's PayloadBuffer names it.
	AllocPayload(h api.Header, n int) (buf *[]byte, off int)
}

// PayloadBufferer is the ability of a Server's ReplyWriter to name the
// buffer a frame's payload was read into.
type PayloadBufferer interface {
	// PayloadBuffer returns, during ServeFrame, what the handler's
	// AllocPayload gave for the frame's payload, or nil.
	PayloadBuffer() (buf *[]byte, off int)
}

// ConnState is the ability of a Server's ReplyWriter to keep a handler's
// state for its connection (what a client attached to it, say); it lives
// as long as the connection.
type ConnState interface {
	State() *atomic.Value
}

// ConnDone is the ability of a Server's ReplyWriter to tell when its
// connection goes: Done is closed once the connection is being torn down
// (the peer closed it or died, an error, the server's Close).
type ConnDone interface {
	Done() <-chan struct{}
}

// ReplyWriter answers the requests of one connection.
type ReplyWriter interface {
	// Reply queues a reply. h: the request header with Status/Hint set; PayloadLen and
	// FlagReply are set by the writer. payload is not copied: it must stay untouched
	// until release (may be nil) is called, after the frame was written or dropped —
	// possibly before Reply returns, on the calling goroutine.
	// Reply never blocks; call it once per request.
	Reply(h api.Header, payload []byte, release func())
	// Retain, called during ServeFrame, hands the current payload to the handler:
	// it stays valid after ServeFrame returns and is never reused by the server.
	Retain()
	RemoteAddr() net.Addr
}

// Server accepts connections and hands their frames to a Handler.
//
// Goroutines: one accept loop per Serve call; per connection a reader (reads a
// header, then the payload into a pooled buffer, calls ServeFrame) and a writer.
// A Reply made while nobody writes is sent by the replying goroutine itself with
// one non-blocking writev; the writer goroutine takes over what that left and
// batches the replies queued meanwhile into one writev each time.
type Server struct {
	cfg   ServerConfig
	h     Handler
	alloc PayloadAllocator // h, if it is one
	log   *slog.Logger

	mu      sync.Mutex
	closed  bool
	lns     map[net.Listener]struct{}
	conns   map[*serverConn]struct{}
	wg      sync.WaitGroup // accept loops and connection goroutines
	lastLog time.Time      // last refused-connection log line (under mu)
	refused int            // connections refused since then

	staging atomic.Int64 // frames whose payload is being read by readStaged (tests)
}

// logRefused logs a refused connection (over the cap, a failed handshake)
// at most every 10 s.
func (s *Server) logRefused(msg string, args ...any) {
	s.mu.Lock()
	s.refused++
	now := time.Now()
	if now.Sub(s.lastLog) < 10*time.Second {
		s.mu.Unlock()
		return
	}
	n := s.refused
	s.lastLog, s.refused = now, 0
	s.mu.Unlock()
	s.log.Warn(msg, append(args, "refused_since_last_log", n)...)
}

// NewServer returns a server that passes frames to h. It panics on a
// secure Security without TLS (a wiring bug; Security.check).
func NewServer(cfg ServerConfig, h Handler) *Server {
	if err := cfg.Security.check(); err != nil || (cfg.Security.Mode != ModeNone && cfg.Security.TLS == nil) {
		panic(fmt.Sprintf("transport: server security: %v (a secure mode needs Security.TLS)", err))
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxPayload <= 0 || cfg.MaxPayload > api.MaxPayload {
		cfg.MaxPayload = api.MaxPayload
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.FrameTimeout <= 0 {
		cfg.FrameTimeout = DefaultFrameTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	alloc, _ := h.(PayloadAllocator)
	return &Server{
		cfg:   cfg,
		h:     h,
		alloc: alloc,
		log:   log,
		lns:   make(map[net.Listener]struct{}),
		conns: make(map[*serverConn]struct{}),
	}
}

// Serve accepts connections on ln until Close (then it returns ErrServerClosed) or
// until ln is closed by someone else; other accept errors (out of file descriptors)
// are logged and retried with a backoff.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				s.mu.Lock()
				delete(s.lns, ln)
				s.mu.Unlock()
				return err
			}
			// EMFILE, ECONNABORTED and the like pass: keep serving the data plane.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("transport: accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.ServeConn(nc)
	}
}

// ServeConn serves one established connection (Serve calls it for each accepted
// one; tests use it with pipes). It returns at once.
func (s *Server) ServeConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	remote := nc.RemoteAddr()
	if uc, ok := nc.(*net.UnixConn); ok {
		_ = uc.SetWriteBuffer(localSendBuffer)
		remote = localAddr(localConns.Add(1))
	}
	sc := &serverConn{
		s:       s,
		nc:      nc,
		remote:  remote,
		br:      bufio.NewReaderSize(sockio.NewReader(nc), readBufferSize),
		log:     s.log.With("remote", remote.String()),
		raw:     sockio.NewWriter(nc),
		slots:   make(chan struct{}, s.cfg.MaxInFlight),
		closing: make(chan struct{}),
	}
	sc.wake = sync.NewCond(&sc.mu)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.mu.Unlock()
		_ = nc.Close()
		s.logRefused("transport: connection refused: too many open connections", "remote", remote.String(), "max", s.cfg.MaxConns)
		return
	}
	s.conns[sc] = struct{}{}
	s.wg.Add(2)
	s.mu.Unlock()
	go sc.readLoop()
	go sc.writeLoop()
}

// Close stops accepting, closes every connection and waits for the server's
// goroutines to end. Replies queued later are dropped (their release still runs).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	lns := s.lns
	conns := s.conns
	s.lns = map[net.Listener]struct{}{}
	s.conns = map[*serverConn]struct{}{}
	s.mu.Unlock()
	for ln := range lns {
		_ = ln.Close()
	}
	for sc := range conns {
		sc.close(nil)
	}
	s.wg.Wait()
	return nil
}

// readBufferSize is the read buffer of every connection (both ends): pipelined
// frames and raft batches that arrive together are read with one syscall; a
// payload larger than it is read straight into its buffer.
const readBufferSize = 32 << 10

type reply struct {
	h       api.Header
	payload []byte
	release func()
}

// serverConn is one connection of a Server; it is the ReplyWriter of its frames.
//
// INVARIANT: len(slots) is the number of requests read and not yet answered
// (their reply not yet written or dropped); the reader blocks while it is full.
// INVARIANT: queue is non-empty only while writing; handoff implies writing.
type serverConn struct {
	s      *Server
	nc     net.Conn
	remote net.Addr      // a same-host connection's is a number (see localAddr)
	br     *bufio.Reader // the reader's: frames that arrive together cost one read
	log    *slog.Logger
	raw    *sockio.Writer // inline replies only when raw.CanTry
	slots  chan struct{}

	// peer is the verified identity of the other end (authed: the server's
	// Security is not ModeNone); set by the reader before the first frame.
	peer   identity.Identity
	authed bool
	// state is the handler's per-connection state (ConnState).
	state atomic.Value

	retained bool    // reader goroutine only: set by Retain during ServeFrame
	owned    *[]byte // reader goroutine only: AllocPayload's buffer of the frame being served
	ownedOff int
	more     atomic.Bool // the reader has the next frame's header buffered already

	closeOnce sync.Once
	closing   chan struct{} // closed when the connection is being torn down

	mu      sync.Mutex
	wake    *sync.Cond // signalled on handoff and close
	closed  bool
	queue   []reply
	writing bool // the write side has an owner: a replying goroutine or the writer
	handoff bool // the owner is the writer goroutine

	// The write side, used only by its current owner.
	batch, spare []reply
	hdrs         []byte
	ihdr         [api.HeaderSize]byte // a replying goroutine's header
	bufs         net.Buffers
	rest         net.Buffers // unwritten tail of bufs a replying goroutine handed off
}

func (sc *serverConn) RemoteAddr() net.Addr { return sc.remote }

func (sc *serverConn) Retain() { sc.retained = true }

// State implements ConnState.
func (sc *serverConn) State() *atomic.Value { return &sc.state }

// Done: ConnDone.
func (sc *serverConn) Done() <-chan struct{} { return sc.closing }

// Peer implements Peer.
func (sc *serverConn) Peer() (identity.Identity, bool) { return sc.peer, sc.authed }

// handshake runs the server's security handshake, and switches the reader
// and writer to the connection it returns (TLS in ModeEncrypted). Nothing is
// written before it ends, so the writer is not in use yet.
func (sc *serverConn) handshake() error {
	sec := sc.s.cfg.Security
	if sec.Mode == ModeNone {
		return nil
	}
	fc, peer, err := serverHandshake(sc.nc, sec, sc.s.cfg.HandshakeTimeout)
	if err != nil {
		return err
	}
	sc.peer, sc.authed = peer, true
	if fc != sc.nc {
		sc.br = bufio.NewReaderSize(sockio.NewReader(fc), readBufferSize)
		sc.mu.Lock()
		sc.raw = sockio.NewWriter(fc)
		sc.mu.Unlock()
	}
	sc.log = sc.log.With("peer", peer.String())
	return nil
}

func (sc *serverConn) PayloadBuffer() (*[]byte, int) { return sc.owned, sc.ownedOff }

func (sc *serverConn) Reply(h api.Header, payload []byte, release func()) {
	h.Flags |= api.FlagReply
	h.PayloadLen = uint32(len(payload))
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		sc.done(h, release)
		return
	}
	r := reply{h: h, payload: payload, release: release}
	// Inline only for the one request in flight, and only when the reader has
	// no further frame at hand: under load the writer goroutine's batches (one
	// writev for many replies, one wake-up) cost less than a writev per reply.
	if sc.writing || !sc.raw.CanTry() || len(sc.slots) > 1 || sc.more.Load() {
		sc.queue = append(sc.queue, r)
		if !sc.writing {
			sc.writing, sc.handoff = true, true
			sc.wake.Signal()
		} // else the owner writes it before going idle
		sc.mu.Unlock()
		return
	}
	// Nobody writes: send it from here without waiting for the socket.
	sc.writing = true
	sc.mu.Unlock()
	h.Encode(sc.ihdr[:])
	sc.bufs = append(sc.bufs[:0], sc.ihdr[:])
	if len(payload) > 0 {
		sc.bufs = append(sc.bufs, payload)
	}
	n := sc.raw.TryWrite(sc.bufs)
	sc.mu.Lock()
	if n < sockio.Len(sc.bufs) {
		sc.batch = append(sc.spare[:0], r)
		sc.rest = sockio.Advance(sc.bufs, n)
		sc.handoff = true
		sc.wake.Signal()
		sc.mu.Unlock()
		return
	}
	clear(sc.bufs)
	if len(sc.queue) > 0 || sc.closed {
		sc.handoff = true
		sc.wake.Signal()
	} else {
		sc.writing = false
	}
	sc.mu.Unlock()
	sc.done(h, release)
}

// encodeBatch encodes sc.batch's headers into sc.hdrs and lists its frames in sc.bufs.
func (sc *serverConn) encodeBatch() {
	if need := len(sc.batch) * api.HeaderSize; cap(sc.hdrs) < need {
		sc.hdrs = make([]byte, need)
	}
	sc.hdrs = sc.hdrs[:len(sc.batch)*api.HeaderSize]
	sc.bufs = sc.bufs[:0]
	for i := range sc.batch {
		hb := sc.hdrs[i*api.HeaderSize : (i+1)*api.HeaderSize]
		sc.batch[i].h.Encode(hb)
		sc.bufs = append(sc.bufs, hb)
		if len(sc.batch[i].payload) > 0 {
			sc.bufs = append(sc.bufs, sc.batch[i].payload)
		}
	}
}

// batchDone finishes the replies of sc.batch, written or not.
func (sc *serverConn) batchDone() {
	clear(sc.bufs)
	for _, r := range sc.batch {
		sc.done(r.h, r.release)
	}
	clear(sc.batch)
	sc.spare, sc.batch = sc.batch[:0], nil
}

// done finishes one reply: its slot is freed and its payload released.
func (sc *serverConn) done(h api.Header, release func()) {
	if !h.Op.OneWay() {
		select {
		case <-sc.slots:
		default: // a second reply to one request: nothing to free
		}
	}
	if release != nil {
		release()
	}
}

// close tears the connection down once; cause nil means a deliberate close.
func (sc *serverConn) close(cause error) {
	sc.closeOnce.Do(func() {
		if cause != nil {
			sc.log.Debug("transport: closing connection", "err", cause)
		}
		// Out of the count first: once the peer sees the close, its
		// connection no longer counts against MaxConns.
		s := sc.s
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		close(sc.closing)
		_ = sc.nc.Close()
		sc.mu.Lock()
		sc.closed = true
		sc.wake.Broadcast()
		sc.mu.Unlock()
	})
}

func (sc *serverConn) readLoop() {
	defer sc.s.wg.Done()
	if err := sc.handshake(); err != nil {
		sc.s.logRefused("transport: connection refused: security handshake failed", "remote", sc.remote.String(), "err", err)
		sc.close(err)
		return
	}
	var hb [api.HeaderSize]byte
	frameTimeout := sc.s.cfg.FrameTimeout
	for {
		// Wait for a frame as long as it takes; from its first byte on, the
		// rest must come within FrameTimeout (armed only when the frame is not
		// all buffered already: no cost for the small frames of the fast path).
		if _, err := sc.br.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil // a clean close between frames
			}
			sc.close(err)
			return
		}
		armed := false
		if sc.br.Buffered() < api.HeaderSize {
			_ = sc.nc.SetReadDeadline(time.Now().Add(frameTimeout))
			armed = true
		}
		if _, err := io.ReadFull(sc.br, hb[:]); err != nil {
			sc.close(err)
			return
		}
		h, err := api.DecodeHeader(hb[:])
		if err == nil && int(h.PayloadLen) > sc.s.cfg.MaxPayload {
			err = api.ErrFrameTooLarge
		}
		if err == nil && h.IsReply() {
			err = ErrProtocol
		}
		if err != nil {
			sc.close(err)
			return
		}
		if !h.Op.OneWay() {
			select {
			case sc.slots <- struct{}{}:
			case <-sc.closing:
				return
			}
		}
		var payload []byte
		var pooled *[]byte
		sc.retained = false
		if !armed && int(h.PayloadLen) > sc.br.Buffered() {
			_ = sc.nc.SetReadDeadline(time.Now().Add(frameTimeout))
			armed = true
		}
		if h.PayloadLen > 0 {
			n := int(h.PayloadLen)
			// A large payload not here yet is taken as it arrives: the
			// announced length alone reserves no memory (a peer that
			// announces 64 MiB and sends 10 bytes holds stagedStep).
			if n > StagedPayload && sc.br.Buffered() < n {
				// readStaged fills the handler's buffer (allocPayload), asked
				// for once half the payload is here, or a pooled one.
				var err error
				if pooled, payload, err = sc.readStaged(h, n); err != nil {
					sc.close(err) // EOF or the frame deadline mid-frame
					return
				}
			} else {
				if payload = sc.allocPayload(h, n); payload == nil {
					pooled = bufpool.Get(n)
					payload = *pooled
				}
				if _, err := io.ReadFull(sc.br, payload); err != nil {
					if pooled != nil {
						bufpool.Put(pooled)
					}
					sc.close(err) // EOF mid-frame
					return
				}
			}
		}
		if armed {
			_ = sc.nc.SetReadDeadline(time.Time{})
		}
		if m := sc.br.Buffered() >= api.HeaderSize; m != sc.more.Load() {
			sc.more.Store(m)
		}
		sc.s.h.ServeFrame(sc, h, payload)
		sc.owned = nil
		if pooled != nil && !sc.retained {
			bufpool.Put(pooled)
		}
	}
}

// stagedStep: a payload larger than stagedStep+stagedSlack that has not
// arrived yet is read into a buffer that starts at no more than stagedStep
// bytes and doubles as the bytes arrive (readStaged), never more than twice
// what arrived; smaller ones are read straight into their buffer. The cost: one
// copy of such a payload (amortized) while growing; its last step is the
// handler's AllocPayload buffer, if it gives one, so there is no copy after.
// stagedSlack is room for the headers of a frame that carries one 256 KiB
// write (a raft frame of one such entry is 256 KiB and a few hundred bytes),
// which is then read without a copy.
const (
	stagedStep  = 256 << 10
	stagedSlack = 16 << 10
)

// StagedPayload: a payload larger than this that has not arrived yet is
// read in steps (see stagedStep and PayloadAllocator).
const StagedPayload = stagedStep + stagedSlack

// allocPayload returns the handler's buffer for frame h's n-byte payload
// (PayloadAllocator), or nil. Called at most once per frame.
func (sc *serverConn) allocPayload(h api.Header, n int) []byte {
	if sc.s.alloc == nil {
		return nil
	}
	buf, off := sc.s.alloc.AllocPayload(h, n)
	if buf == nil {
		return nil
	}
	if off < 0 || len(*buf) < off+n {
		panic(fmt.Sprintf("transport: AllocPayload gave %d bytes, payload at %d, for a %d-byte payload", len(*buf), off, n))
	}
	sc.owned, sc.ownedOff, sc.retained = buf, off, true
	return (*buf)[off : off+n]
}

// readStaged reads frame h's n-byte payload (n > stagedStep) into a pooled
// buffer that grows with what arrived (see stagedStep) and returns it, of
// length n; or, when the handler gives a buffer for it (allocPayload, asked
// once the buffer would grow to n), returns that buffer, filled.
func (sc *serverConn) readStaged(h api.Header, n int) (*[]byte, []byte, error) {
	sc.s.staging.Add(1)
	defer sc.s.staging.Add(-1)
	// The first step is n halved until it is at most stagedStep, so the
	// doubling reaches n/2 exactly: the last copy (into the handler's buffer)
	// is of half the payload, not of up to all of it.
	first := n
	for first > stagedStep {
		first = (first + 1) / 2
	}
	buf := bufpool.Get(first)
	got := 0
	for {
		m, err := io.ReadFull(sc.br, (*buf)[got:])
		got += m
		if err != nil {
			bufpool.Put(buf)
			return nil, nil, err
		}
		if got == n {
			return buf, *buf, nil
		}
		if 2*got >= n {
			if p := sc.allocPayload(h, n); p != nil {
				copy(p, (*buf)[:got])
				bufpool.Put(buf)
				if _, err := io.ReadFull(sc.br, p[got:]); err != nil {
					return nil, nil, err
				}
				return nil, p, nil
			}
			// No buffer of the handler's: the next step is the last.
		}
		next := bufpool.Get(min(2*got, n))
		copy(*next, (*buf)[:got])
		bufpool.Put(buf)
		buf = next
	}
}

// writeLoop owns the socket's write side while handoff is set.
func (sc *serverConn) writeLoop() {
	defer sc.s.wg.Done()
	for {
		sc.mu.Lock()
		for !sc.handoff && !(sc.closed && !sc.writing) {
			sc.wake.Wait()
		}
		if !sc.handoff { // closed, nobody writing: nothing is queued
			sc.mu.Unlock()
			return
		}
		if sc.rest != nil {
			// A replying goroutine's batch, partly written: finish it first.
			sc.mu.Unlock()
			rest := sc.rest
			sc.rest = nil
			sc.writeBatch(rest)
			continue
		}
		if sc.closed {
			sc.batch, sc.queue = sc.queue, nil
			sc.writing, sc.handoff = false, false
			sc.mu.Unlock()
			sc.batchDone()
			return
		}
		if len(sc.queue) == 0 {
			sc.writing, sc.handoff = false, false
			sc.mu.Unlock()
			continue
		}
		sc.batch, sc.queue = sc.queue, sc.spare[:0]
		sc.mu.Unlock()
		sc.encodeBatch()
		sc.writeBatch(sc.bufs)
	}
}

// writeBatch writes bufs (sc.batch's frames), waiting for the socket, and
// finishes sc.batch.
func (sc *serverConn) writeBatch(bufs net.Buffers) {
	_, err := sc.raw.Write(bufs)
	sc.batchDone()
	if err != nil {
		sc.close(err)
	}
}
