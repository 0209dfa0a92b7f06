package transport

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
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
}

// Handler serves the frames of a Server.
type Handler interface {
	// ServeFrame handles one request. payload is valid only until ServeFrame returns
	// unless the handler calls rw.Retain. The handler answers (now or later, from any
	// goroutine) with rw.Reply; OpRaft frames get no reply; OpSnapshot frames may
	// be answered (the sender decides by waiting or not).
	// ServeFrame runs on the connection's reader goroutine: while it runs, no further
	// frame of that connection is read.
	ServeFrame(rw ReplyWriter, h Header, payload []byte)
}

// ReplyWriter answers the requests of one connection.
type ReplyWriter interface {
	// Reply queues a reply. h: the request header with Status/Hint set; PayloadLen and
	// FlagReply are set by the writer. payload is not copied: it must stay untouched
	// until release (may be nil) is called, after the frame was written or dropped.
	// Reply never blocks; call it once per request.
	Reply(h Header, payload []byte, release func())
	// Retain, called during ServeFrame, hands the current payload to the handler:
	// it stays valid after ServeFrame returns and is never reused by the server.
	Retain()
	RemoteAddr() net.Addr
}

// OneWay reports whether frames of op are peer traffic that does not count
// against ServerConfig.MaxInFlight: OpRaft (never answered) and OpSnapshot (answered
// or not, as the snapshot protocol decides).
func (o Op) OneWay() bool { return o == OpRaft || o == OpSnapshot }

// Server accepts connections and hands their frames to a Handler.
//
// Goroutines: one accept loop per Serve call; per connection a reader (reads a
// header, then the payload into a pooled buffer, calls ServeFrame) and a writer
// (batches queued replies into one writev).
type Server struct {
	cfg ServerConfig
	h   Handler
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[*serverConn]struct{}
	wg     sync.WaitGroup // accept loops and connection goroutines
}

// NewServer returns a server that passes frames to h.
func NewServer(cfg ServerConfig, h Handler) *Server {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxPayload <= 0 || cfg.MaxPayload > MaxPayload {
		cfg.MaxPayload = MaxPayload
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{
		cfg:   cfg,
		h:     h,
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
	sc := &serverConn{
		s:       s,
		nc:      nc,
		br:      bufio.NewReaderSize(nc, readBufferSize),
		log:     s.log.With("remote", nc.RemoteAddr().String()),
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
	h       Header
	payload []byte
	release func()
}

// serverConn is one connection of a Server; it is the ReplyWriter of its frames.
//
// INVARIANT: len(slots) is the number of requests read and not yet answered
// (their reply not yet written or dropped); the reader blocks while it is full.
type serverConn struct {
	s     *Server
	nc    net.Conn
	br    *bufio.Reader // the reader's: frames that arrive together cost one read
	log   *slog.Logger
	slots chan struct{}

	retained bool // reader goroutine only: set by Retain during ServeFrame

	closeOnce sync.Once
	closing   chan struct{} // closed when the connection is being torn down

	mu     sync.Mutex
	wake   *sync.Cond
	closed bool
	queue  []reply
}

func (sc *serverConn) RemoteAddr() net.Addr { return sc.nc.RemoteAddr() }

func (sc *serverConn) Retain() { sc.retained = true }

func (sc *serverConn) Reply(h Header, payload []byte, release func()) {
	h.Flags |= FlagReply
	h.PayloadLen = uint32(len(payload))
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		sc.done(h, release)
		return
	}
	sc.queue = append(sc.queue, reply{h: h, payload: payload, release: release})
	if len(sc.queue) == 1 {
		sc.wake.Signal()
	}
	sc.mu.Unlock()
}

// done finishes one reply: its slot is freed and its payload released.
func (sc *serverConn) done(h Header, release func()) {
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
		close(sc.closing)
		_ = sc.nc.Close()
		sc.mu.Lock()
		sc.closed = true
		sc.wake.Broadcast()
		sc.mu.Unlock()
		s := sc.s
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
	})
}

func (sc *serverConn) readLoop() {
	defer sc.s.wg.Done()
	var hb [HeaderSize]byte
	for {
		if _, err := io.ReadFull(sc.br, hb[:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil // a clean close between frames
			}
			sc.close(err)
			return
		}
		h, err := DecodeHeader(hb[:])
		if err == nil && int(h.PayloadLen) > sc.s.cfg.MaxPayload {
			err = ErrTooLarge
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
		if h.PayloadLen > 0 {
			payload = getBuf(int(h.PayloadLen))
			if _, err := io.ReadFull(sc.br, payload); err != nil {
				putBuf(payload)
				sc.close(err) // EOF mid-frame
				return
			}
		}
		sc.retained = false
		sc.s.h.ServeFrame(sc, h, payload)
		if payload != nil && !sc.retained {
			putBuf(payload)
		}
	}
}

func (sc *serverConn) writeLoop() {
	defer sc.s.wg.Done()
	var (
		batch, spare []reply
		hdrs         []byte
		bufs         net.Buffers
	)
	for {
		sc.mu.Lock()
		for len(sc.queue) == 0 && !sc.closed {
			sc.wake.Wait()
		}
		if sc.closed {
			batch, sc.queue = sc.queue, nil
			sc.mu.Unlock()
			for _, r := range batch {
				sc.done(r.h, r.release)
			}
			return
		}
		batch, sc.queue = sc.queue, spare[:0]
		sc.mu.Unlock()

		if need := len(batch) * HeaderSize; cap(hdrs) < need {
			hdrs = make([]byte, need)
		}
		hdrs = hdrs[:len(batch)*HeaderSize]
		bufs = bufs[:0]
		for i := range batch {
			hb := hdrs[i*HeaderSize : (i+1)*HeaderSize]
			batch[i].h.Encode(hb)
			bufs = append(bufs, hb)
			if len(batch[i].payload) > 0 {
				bufs = append(bufs, batch[i].payload)
			}
		}
		wb := bufs
		_, err := wb.WriteTo(sc.nc)
		clear(bufs)
		for _, r := range batch {
			sc.done(r.h, r.release)
		}
		clear(batch)
		spare = batch[:0]
		if err != nil {
			sc.close(err)
		}
	}
}
