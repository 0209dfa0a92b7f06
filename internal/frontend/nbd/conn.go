package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/bufpool"
	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/sockio"
	"github.com/basalt-storage/basalt/pkg/api"
)

const (
	// shutdownGrace is how long a connection keeps answering new requests with
	// NBD_ESHUTDOWN after Shutdown, so requests already sent are not lost silently.
	shutdownGrace = 100 * time.Millisecond
	// lingerTimeout bounds the wait for the client's close after a graceful end.
	lingerTimeout = time.Second
)

// conn is one client connection. See doc.go for its state machine and goroutines.
type conn struct {
	s   *Server
	nc  net.Conn      // the socket: deadlines and Close act on it
	br  *bufio.Reader // owned by the reader goroutine (the handshake's, then the reader's)
	log *slog.Logger

	// TLS (tls.go). policy is the listener's; stream is what the protocol
	// speaks through: nc, or after NBD_OPT_STARTTLS tls (set by the
	// handshake, read-only afterwards).
	policy TLSPolicy
	stream net.Conn
	tls    *tls.Conn
	peer   string // the TLS client's identity, for logs

	// Counters owned by the reader goroutine.
	nreq      int64 // requests parsed (DISC excluded)
	nrejected int64 // answered with an error by validation or shutdown

	// Set by the handshake, read-only afterwards.
	export      string
	att         *frontend.Attachment // detached when serve ends
	backend     frontend.Backend     // att.Backend()
	size        int64                // the export's size; grows (grown), owned by the reading goroutine
	sizeChecked time.Time            // when grown last re-read it
	readOnly    bool
	write       *frontend.WriteGate // Config.MayWrite's answer for this connection
	tflags      uint16
	minBlock    uint32 // every offset and length is a multiple
	prefBlock   uint32
	maxPayload  uint32 // the largest READ or WRITE

	// replies carries finished requests to the writer. Its capacity is
	// MaxInFlight and every queued request holds an in-flight slot, so a send
	// never blocks (backend completion callbacks must not block).
	replies    chan *request
	writerDone chan struct{}
	w          *sockio.Writer // owned by the writer goroutine

	// mu guards the fields below; cond signals slot and byte releases.
	mu            sync.Mutex
	cond          sync.Cond
	inflight      int   // requests parsed and not yet released by the writer
	inflightBytes int64 // payload bytes held by those requests
	shutdown      bool  // Server.Shutdown was called
	transmitting  bool  // handshake done; the read deadline is the shutdown signal
}

func newConn(s *Server, nc net.Conn) *conn {
	policy := TLSOff
	if pc, ok := nc.(policyConn); ok {
		nc, policy = pc.Conn, pc.p
	}
	remote := "unknown"
	if a := nc.RemoteAddr(); a != nil {
		remote = a.String()
	}
	c := &conn{
		s:      s,
		nc:     nc,
		stream: nc,
		policy: policy,
		br:     bufio.NewReaderSize(sockio.NewReader(nc), 64<<10),
		w:      sockio.NewWriter(nc),
		log:    s.log.With("remote", remote),
	}
	c.cond.L = &c.mu
	return c
}

// Serve runs the connection to its end on the calling goroutine (the reader).
func (c *conn) Serve() {
	defer c.nc.Close()
	res, err := c.handshake()
	if res != handshakeTransmit {
		if err != nil && !errors.Is(err, io.EOF) {
			c.log.Debug("nbd: handshake ended", "err", err)
		}
		return
	}
	defer c.att.Detach() // after the last backend callback (waitIdle below)
	c.mu.Lock()
	if c.shutdown {
		c.mu.Unlock()
		return
	}
	c.transmitting = true
	c.nc.SetDeadline(time.Time{})
	c.mu.Unlock()
	c.log.Info("nbd: client connected", "size", c.size, "flags", c.tflags, "tls", c.tls != nil)
	if c.tls != nil && c.s.cfg.TLSRecheck != nil {
		stop, done := make(chan struct{}), make(chan struct{})
		go c.recheckLoop(stop, done)
		defer func() { close(stop); <-done }()
	}

	c.replies = make(chan *request, c.s.cfg.MaxInFlight)
	c.writerDone = make(chan struct{})
	go c.writeLoop()

	st, err := c.readLoop()
	if st != endGraceful {
		// Hard disconnect: replies are pointless; closing makes the writer drop them.
		c.nc.Close()
	}
	c.waitIdle()
	close(c.replies)
	<-c.writerDone
	if st == endGraceful {
		c.linger()
	}
	c.log.Info("nbd: client disconnected", "end", st.String(), "requests", c.nreq, "rejected", c.nrejected, "err", err)
}

// linger half-closes the socket after the last reply and reads until the
// client closes too (bounded by lingerTimeout). Closing with unread data in the
// receive queue would make the kernel reset the connection, which can destroy
// replies the client has not read yet.
// Close ends the connection at once (Server.Close, or Shutdown past its deadline).
func (c *conn) Close() { c.nc.Close() }

func (c *conn) linger() {
	cw, ok := c.stream.(interface{ CloseWrite() error })
	if !ok {
		return
	}
	if cw.CloseWrite() != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
	io.Copy(io.Discard, c.br)
}

// BeginShutdown is called by Server.Shutdown (holding frontend.Conns' lock).
func (c *conn) BeginShutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shutdown = true
	if c.transmitting {
		// Requests read from now on are answered NBD_ESHUTDOWN; after the grace
		// period the reader's next read fails and the connection drains.
		c.nc.SetReadDeadline(time.Now().Add(shutdownGrace))
	} else {
		c.nc.Close()
	}
}

func (c *conn) shuttingDown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shutdown
}

type readEnd int

const (
	endGraceful readEnd = iota // NBD_CMD_DISC or shutdown: answer what is in flight
	endHard                    // EOF, I/O error or protocol violation: drop replies
)

func (e readEnd) String() string {
	if e == endGraceful {
		return "graceful"
	}
	return "hard"
}

// readLoop parses requests, validates them and submits them to the backend until
// the client disconnects or breaks the protocol.
func (c *conn) readLoop() (readEnd, error) {
	var hdr [requestHeaderLen]byte
	for {
		c.acquireSlot()
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			c.releaseSlot(0)
			if c.shuttingDown() && errors.Is(err, os.ErrDeadlineExceeded) {
				return endGraceful, nil
			}
			return endHard, err
		}
		if m := binary.BigEndian.Uint32(hdr[0:]); m != requestMagic {
			c.releaseSlot(0)
			return endHard, fmt.Errorf("%w: request magic %#x", ErrProtocol, m)
		}
		flags := binary.BigEndian.Uint16(hdr[4:])
		typ := binary.BigEndian.Uint16(hdr[6:])
		off := binary.BigEndian.Uint64(hdr[16:])
		length := binary.BigEndian.Uint32(hdr[24:])
		if typ == cmdDisc {
			c.releaseSlot(0)
			return endGraceful, nil
		}

		c.nreq++
		r := c.s.getRequest()
		r.c = c
		if c.s.cfg.Metrics != nil {
			r.start = time.Now()
		}
		r.typ = typ
		r.length = length
		copy(r.cookie[:], hdr[8:16])
		errno := c.validate(flags, typ, off, length)
		if errno == 0 && (typ == cmdWrite || typ == cmdTrim || typ == cmdWriteZeroes) {
			errno = c.mayWrite()
		}

		if typ == cmdWrite {
			if length > c.maxPayload {
				// The payload cannot be skipped safely: answer, then close.
				r.errno = EINVAL
				c.replies <- r
				return endGraceful, fmt.Errorf("%w: write payload of %d bytes", ErrProtocol, length)
			}
			if errno != 0 {
				if _, err := io.CopyN(io.Discard, c.br, int64(length)); err != nil {
					c.release(r)
					return c.endAfter(err)
				}
			} else {
				c.acquireBytes(r, int64(length))
				r.buf = bufpool.Get(int(length))
				if _, err := io.ReadFull(c.br, *r.buf); err != nil {
					// Never submitted: a torn write changes nothing.
					c.release(r)
					return c.endAfter(err)
				}
			}
		}
		if errno == 0 && c.shuttingDown() {
			errno = ESHUTDOWN
		}
		if errno != 0 {
			c.nrejected++
			r.errno = errno
			c.replies <- r
			continue
		}

		b := c.backend
		if c.s.cfg.Metrics != nil {
			r.submitted = time.Now()
		}
		switch typ {
		case cmdRead:
			c.acquireBytes(r, int64(length))
			r.buf = bufpool.Get(int(length))
			b.Submit(api.OpRead, *r.buf, int64(off), int64(length), r.doneFn)
		case cmdWrite:
			b.Submit(api.OpWrite, *r.buf, int64(off), int64(length), r.doneFn)
		case cmdFlush:
			b.Submit(api.OpFlush, nil, 0, 0, r.doneFn)
		case cmdTrim:
			b.Submit(api.OpTrim, nil, int64(off), int64(length), r.doneFn)
		case cmdWriteZeroes:
			b.Submit(api.OpWriteZeroes, nil, int64(off), int64(length), r.doneFn)
		default:
			panic("nbd: validate let an unknown command through")
		}
	}
}

// endAfter classifies a read error in the middle of a request.
func (c *conn) endAfter(err error) (readEnd, error) {
	if c.shuttingDown() && errors.Is(err, os.ErrDeadlineExceeded) {
		return endGraceful, nil
	}
	return endHard, err
}

// grown re-reads the export's size for a request past its end: a volume
// may grow while attached, and a client told of the new size (Linux's
// NBD_SET_SIZE ioctl on an ioctl-configured /dev/nbdN, which the CSI node
// plugin issues for online expansion) sends IO there. At most once a second,
// so that a client probing past the end cannot keep the MDS busy.
func (c *conn) grown() int64 {
	if time.Since(c.sizeChecked) < time.Second {
		return c.size
	}
	c.sizeChecked = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := c.att.Backend()
	if b.Check(ctx) == nil {
		if n := b.Info().Size; n > c.size {
			c.log.Info("nbd: the export grew", "old_size", c.size, "size", n)
			c.size = n
		}
	}
	return c.size
}

// validate checks a request against the export before anything touches the
// backend (nbdkit's validate_request is the model). It returns 0 or the NBD
// error value to answer with.
func (c *conn) validate(flags, typ uint16, off uint64, length uint32) uint32 {
	switch typ {
	case cmdRead, cmdWrite, cmdFlush, cmdTrim, cmdWriteZeroes:
	default:
		return EINVAL // unknown, or not advertised (CACHE, BLOCK_STATUS)
	}
	var allowed uint16
	if c.tflags&flagSendFUA != 0 {
		allowed |= cmdFlagFUA // valid on every command once negotiated
	}
	if typ == cmdWriteZeroes {
		allowed |= cmdFlagNoHole
	}
	if flags&^allowed != 0 {
		return EINVAL
	}
	if typ == cmdFlush {
		if off != 0 || length != 0 || c.tflags&flagSendFlush == 0 {
			return EINVAL
		}
		return 0
	}
	if length == 0 {
		return EINVAL
	}
	size := uint64(c.size)
	if off > size || uint64(length) > size-off {
		size = uint64(c.grown())
	}
	if off > size || uint64(length) > size-off {
		if typ == cmdWrite || typ == cmdWriteZeroes {
			return ENOSPC
		}
		return EINVAL
	}
	if m := uint64(c.minBlock); m > 1 && (off%m != 0 || uint64(length)%m != 0) {
		return EINVAL
	}
	if (typ == cmdRead || typ == cmdWrite) && length > c.maxPayload {
		return EINVAL
	}
	if c.readOnly && typ != cmdRead {
		return EPERM
	}
	if (typ == cmdTrim && c.tflags&flagSendTrim == 0) || (typ == cmdWriteZeroes && c.tflags&flagSendWriteZeroes == 0) {
		return EINVAL // not advertised: the backend cannot do it
	}
	return 0
}

// mayWrite asks the connection's write gate (Config.MayWrite) before a
// request that writes: 0, EPERM (this node may not write the volume: it was
// published to another) or EIO (no answer yet, the MDS away).
func (c *conn) mayWrite() uint32 {
	switch ok, err := c.write.Allow(); {
	case err != nil:
		return EIO
	case !ok:
		return EPERM
	}
	return 0
}

// acquireSlot blocks while MaxInFlight requests are outstanding.
func (c *conn) acquireSlot() {
	c.mu.Lock()
	for c.inflight >= c.s.cfg.MaxInFlight {
		c.cond.Wait()
	}
	c.inflight++
	c.mu.Unlock()
}

// acquireBytes blocks while the payload budget is spent; a request always
// proceeds when nothing else holds bytes, so one maximal request never deadlocks.
func (c *conn) acquireBytes(r *request, n int64) {
	c.mu.Lock()
	for c.inflightBytes > 0 && c.inflightBytes+n > c.s.cfg.MaxInFlightBytes {
		c.cond.Wait()
	}
	c.inflightBytes += n
	c.mu.Unlock()
	r.bytes = n
}

func (c *conn) releaseSlot(bytes int64) {
	c.mu.Lock()
	c.inflight--
	c.inflightBytes -= bytes
	c.mu.Unlock()
	c.cond.Broadcast()
}

// waitIdle returns when every in-flight request was answered (or dropped).
func (c *conn) waitIdle() {
	c.mu.Lock()
	for c.inflight > 0 {
		c.cond.Wait()
	}
	c.mu.Unlock()
}

// release returns a request's buffer, slot and struct.
func (c *conn) release(r *request) {
	if r.buf != nil {
		bufpool.Put(r.buf)
	}
	c.releaseSlot(r.bytes)
	*r = request{doneFn: r.doneFn}
	c.s.reqPool.Put(r)
}

// writeLoop is the connection's only writer in transmission: it takes every
// reply that is ready, writes the batch with one writev and releases it.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	var (
		batch  = make([]*request, 0, c.s.cfg.MaxInFlight)
		iov    = make(net.Buffers, 0, 2*c.s.cfg.MaxInFlight)
		broken bool
	)
	for r := range c.replies {
		batch = append(batch[:0], r)
	drain:
		for len(batch) < cap(batch) {
			select {
			case r, ok := <-c.replies:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		if !broken {
			iov = iov[:0]
			for _, r := range batch {
				binary.BigEndian.PutUint32(r.hdr[0:], simpleReplyMagic)
				binary.BigEndian.PutUint32(r.hdr[4:], r.errno)
				copy(r.hdr[8:], r.cookie[:])
				iov = append(iov, r.hdr[:])
				if r.typ == cmdRead && r.errno == 0 {
					iov = append(iov, (*r.buf)[:r.length])
				}
			}
			c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
			_, err := c.w.Write(iov)
			clear(iov) // keep no released buffer reachable
			if err != nil {
				broken = true
				c.log.Debug("nbd: writing replies failed; dropping the rest", "err", err)
				c.nc.Close() // wakes the reader
			}
			if c.s.cfg.Metrics != nil {
				c.s.cfg.Metrics.replied(batch, time.Now())
			}
		}
		for _, r := range batch {
			c.release(r)
		}
	}
}

// request is one transmission request from parse to reply. Pooled per Server.
type request struct {
	c      *conn
	doneFn func(error) // r.complete, bound once per pooled struct
	hdr    [replyHeaderLen]byte
	cookie [8]byte
	typ    uint16
	length uint32
	errno  uint32
	buf    *[]byte // read destination or write source; nil for other commands
	bytes  int64   // payload bytes accounted in c.inflightBytes
	// Metrics only (zero without Config.Metrics): header parsed, handed to the
	// backend, backend done.
	start, submitted, finished time.Time
}

// complete is the backend's done callback: it may run on any goroutine.
func (r *request) complete(err error) {
	c := r.c
	if c.s.cfg.Metrics != nil {
		r.finished = time.Now()
	}
	if err != nil {
		err = c.att.Classify(err)
		r.errno = errnoOf(err)
		c.log.Debug("nbd: backend error", "cmd", r.typ, "err", err, "errno", r.errno)
	}
	c.replies <- r
}
