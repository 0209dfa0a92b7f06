package nvmf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/bufpool"
	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/sockio"
)

// conn is one TCP connection: one queue (admin or I/O) of one controller.
//
// Goroutines: the reader (Serve) parses PDUs and runs commands, admin ones
// inline; the reader and the backend's completion callbacks queue PDUs
// (never blocking). With one command in flight and nobody writing, the
// queuing goroutine sends them itself with one non-blocking writev (no
// hand-off to another goroutine per IO at queue depth 1); anything else, and
// whatever such a write leaves, the writer goroutine sends, one writev per
// batch (after yielding once, so that the completions runnable then join
// it). Reader-owned: the fields up to ctrl; the out queue and the write
// side's owner are under omu.
type conn struct {
	s   *Server
	nc  net.Conn
	br  *bufio.Reader
	log *slog.Logger

	hbuf         [icLen + digestLen]byte // the header being read
	icDone       bool
	hdgst, ddgst bool
	qid          uint16
	sqsize       int // queue entries; commands in flight are bounded by it
	ctrl         *controller
	pending      map[uint16]*command // awaiting H2C data, by transfer tag
	nextTag      uint16
	maxCapsule   int                  // in-capsule data accepted
	noSQFlow     bool                 // Connect disabled SQ flow control: C2HData may carry SUCCESS
	att          *frontend.Attachment // of the command being started (io)
	ns           *namespace           // of the command being started (io)

	inflight atomic.Int32   // commands read and not yet answered (AERs included)
	wg       sync.WaitGroup // backend callbacks outstanding
	sqhd     atomic.Uint32

	w          *sockio.Writer // used by the write side's owner only
	omu        sync.Mutex
	out        [][]byte
	outDone    []func()      // run once out's buffers before them are written (or dropped)
	owner      writeOwner    // who writes the socket now
	oready     chan struct{} // signalled when the writer goroutine becomes the owner
	oclosed    bool
	broken     bool // a write failed: the rest is dropped
	writerDone chan struct{}
}

// writeOwner says who writes the socket: nobody, a goroutine queuing a
// response (inline), or the writer goroutine. Exactly one writes at a time,
// so the PDUs go out in the order they were queued.
type writeOwner uint8

const (
	ownerNone writeOwner = iota
	ownerInline
	ownerWriter
)

// command is one capsule being served.
type command struct {
	c    *conn
	sqe  *sqe
	data []byte // host-to-controller data (in capsule or by R2T) or nil
	// pooled is data's bufpool buffer: a write gives it back once the
	// backend is done with it (putData); any other command leaves it to
	// the garbage collector.
	pooled *[]byte
	got    int // H2C bytes received so far
	r2t    int // end of the range the current R2T asked for
	tag    uint16

	// Room for the PDUs a one-chunk command sends (the command lives
	// until they are written; no allocation of their own): its entry, a
	// C2HData header with both digests, a response with its digest, and
	// the pieces of the writev.
	entry sqe
	c2h   [dataHdrLen + 2*digestLen]byte
	rspb  [rspLen + digestLen]byte
	iov   [4][]byte
	rsent bool // rspb is used
}

func newConn(s *Server, nc net.Conn) *conn {
	remote := "unknown"
	if a := nc.RemoteAddr(); a != nil {
		remote = a.String()
	}
	return &conn{
		s:          s,
		nc:         nc,
		br:         bufio.NewReaderSize(sockio.NewReader(nc), 64<<10),
		w:          sockio.NewWriter(nc),
		log:        s.log.With("remote", remote),
		sqsize:     32,
		pending:    map[uint16]*command{},
		maxCapsule: max(8192, s.cfg.InCapsuleData),
		oready:     make(chan struct{}, 1),
		writerDone: make(chan struct{}),
	}
}

// Serve runs the connection to its end.
func (c *conn) Serve() {
	defer c.nc.Close()
	go c.writeLoop()
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.ConnectTimeout))
	err := c.readLoop()
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
	case errors.Is(err, ErrProtocol):
		c.log.Warn("nvmf: closing the connection after a protocol error", "qid", c.qid, "err", err)
	default:
		c.log.Debug("nvmf: connection ended", "qid", c.qid, "err", err)
	}
	c.wg.Wait() // every backend callback ran: buffers are ours again
	c.omu.Lock()
	c.oclosed = true
	if c.owner == ownerNone {
		c.owner = ownerWriter // it drains the queue and ends; else the owner hands over when done
	}
	c.omu.Unlock()
	c.signal()
	<-c.writerDone
	if c.ctrl != nil {
		if c.qid == 0 {
			c.ctrl.kill("admin queue disconnected")
		}
		c.ctrl.leave(c)
	}
}

// BeginShutdown stops reading; commands already read are answered.
func (c *conn) BeginShutdown() { c.nc.SetReadDeadline(time.Now()) }

// Close closes the socket at once.
func (c *conn) Close() { c.nc.Close() }

func (c *conn) protoErr(fes uint16, format string, args ...any) error {
	err := fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
	c.termReq(fes)
	return err
}

// termReq queues a C2HTermReq; the connection closes after it.
func (c *conn) termReq(fes uint16) {
	if !c.icDone {
		return // no PDU is valid before the ICResp; just close
	}
	h := make([]byte, dataHdrLen)
	binary.LittleEndian.PutUint16(h[8:], fes)
	c.queue(c.headerOnly(pduC2HTermReq, h))
}

// headerOnly frames a PDU without data: h is its header (the common header
// is filled in here), followed by the header digest when negotiated.
func (c *conn) headerOnly(typ uint8, h []byte) []byte {
	hlen := len(h)
	if !c.hdgst {
		putCH(h, typ, 0, uint8(hlen), 0, uint32(hlen))
		return h
	}
	putCH(h, typ, flagHDGST, uint8(hlen), 0, uint32(hlen+digestLen))
	return binary.LittleEndian.AppendUint32(h, crc32c(h))
}

// readLoop reads PDUs until the connection ends.
func (c *conn) readLoop() error {
	for {
		typ, flags, hdr, err := c.readHeader()
		if err != nil {
			return err
		}
		switch typ {
		case pduICReq:
			if err := c.icReq(hdr); err != nil {
				return err
			}
			continue
		case pduH2CTermReq:
			return fmt.Errorf("%w: host sent H2CTermReq, FES %#x", ErrProtocol, binary.LittleEndian.Uint16(hdr[8:]))
		}
		plen := int(binary.LittleEndian.Uint32(hdr[4:]))
		pdo := int(hdr[3])
		hd := 0
		if c.hdgst {
			hd = digestLen
		}
		dlen := 0
		if plen > len(hdr)+hd {
			dd := 0
			if c.ddgst {
				dd = digestLen
			}
			if pdo < len(hdr)+hd || pdo > plen {
				return c.protoErr(fesInvalidHeader, "PDO %d outside [%d, %d]", pdo, len(hdr)+hd, plen)
			}
			dlen = plen - pdo - dd
			if dlen <= 0 {
				return c.protoErr(fesInvalidHeader, "PDU length %d leaves no data after PDO %d", plen, pdo)
			}
			if _, err := c.br.Discard(pdo - len(hdr) - hd); err != nil {
				return err
			}
		}
		switch typ {
		case pduCapsuleCmd:
			err = c.capsule(hdr, flags, dlen)
		case pduH2CData:
			err = c.h2cData(hdr, flags, dlen)
		}
		if err != nil {
			return err
		}
	}
}

// readHeader reads one PDU header (and checks its digest); the data is left
// in the reader.
func (c *conn) readHeader() (typ, flags uint8, hdr []byte, err error) {
	ch := c.hbuf[:chLen]
	if _, err := io.ReadFull(c.br, ch); err != nil {
		return 0, 0, nil, err
	}
	typ, flags = ch[0], ch[1]
	hlen, plen := int(ch[2]), binary.LittleEndian.Uint32(ch[4:])
	want := 0
	switch typ {
	case pduICReq:
		if c.icDone {
			return 0, 0, nil, c.protoErr(fesSequence, "a second ICReq")
		}
		want = icLen
	case pduCapsuleCmd:
		want = capsuleLen
	case pduH2CData, pduH2CTermReq:
		want = dataHdrLen
	default:
		return 0, 0, nil, c.protoErr(fesInvalidHeader, "PDU type %#x from a host", typ)
	}
	if !c.icDone && typ != pduICReq {
		return 0, 0, nil, fmt.Errorf("%w: PDU type %#x before ICReq", ErrProtocol, typ)
	}
	if hlen != want {
		return 0, 0, nil, c.protoErr(fesInvalidHeader, "PDU type %#x with header length %d, want %d", typ, hlen, want)
	}
	hd := 0
	if c.hdgst && typ != pduICReq {
		hd = digestLen
	}
	maxPlen := uint32(want + hd + 256 + 2*digestLen)
	switch typ {
	case pduCapsuleCmd:
		maxPlen += uint32(c.maxCapsule)
	case pduH2CData:
		maxPlen += uint32(c.s.cfg.MaxH2CData)
	case pduH2CTermReq:
		maxPlen += maxTermData
	}
	if plen < uint32(want+hd) || plen > maxPlen || (typ == pduICReq && plen != icLen) {
		return 0, 0, nil, c.protoErr(fesInvalidHeader, "PDU type %#x with length %d", typ, plen)
	}
	if typ == pduH2CTermReq && plen > uint32(want+hd) {
		// Its data is the header the host objected to; read and drop it.
		if _, err := io.ReadFull(c.br, c.hbuf[chLen:want+hd]); err != nil {
			return 0, 0, nil, err
		}
		return typ, flags, c.hbuf[:want], nil
	}
	if _, err := io.ReadFull(c.br, c.hbuf[chLen:want+hd]); err != nil {
		return 0, 0, nil, err
	}
	hdr = c.hbuf[:want]
	if hd > 0 {
		if flags&flagHDGST == 0 {
			return 0, 0, nil, c.protoErr(fesInvalidHeader, "header digest flag missing")
		}
		if got, exp := binary.LittleEndian.Uint32(c.hbuf[want:]), crc32c(hdr); got != exp {
			return 0, 0, nil, c.protoErr(fesHeaderDigest, "header digest %#x, want %#x", got, exp)
		}
	}
	if c.ddgst && plen > uint32(want+hd) && typ != pduH2CTermReq && flags&flagDDGST == 0 {
		return 0, 0, nil, c.protoErr(fesInvalidHeader, "data digest flag missing")
	}
	return typ, flags, hdr, nil
}

// readData reads n bytes of PDU data into b and checks the data digest.
func (c *conn) readData(b []byte) error {
	if _, err := io.ReadFull(c.br, b); err != nil {
		return err
	}
	if c.ddgst {
		var d [digestLen]byte
		if _, err := io.ReadFull(c.br, d[:]); err != nil {
			return err
		}
		if got, exp := binary.LittleEndian.Uint32(d[:]), crc32c(b); got != exp {
			return c.protoErr(fesDataDigest, "data digest %#x, want %#x", got, exp)
		}
	}
	return nil
}

// icReq answers the connection's first PDU.
func (c *conn) icReq(h []byte) error {
	pfv := binary.LittleEndian.Uint16(h[8:])
	if pfv != 0 {
		return fmt.Errorf("%w: ICReq PFV %d", ErrProtocol, pfv)
	}
	c.hdgst, c.ddgst = h[11]&1 != 0, h[11]&2 != 0
	c.icDone = true
	r := make([]byte, icLen)
	putCH(r, pduICResp, 0, icLen, 0, icLen)
	r[10] = 0 // CPDA
	r[11] = h[11] & 3
	binary.LittleEndian.PutUint32(r[12:], uint32(c.s.cfg.MaxH2CData))
	c.queue(r)
	return nil
}

// capsule reads a command capsule and starts the command.
func (c *conn) capsule(hdr []byte, flags uint8, dlen int) error {
	if n := c.inflight.Add(1); int(n) > c.sqsize+4 {
		return c.protoErr(fesSequence, "%d commands in flight on a queue of %d", n, c.sqsize)
	}
	cmd := &command{c: c}
	cmd.entry.parse(hdr[chLen:])
	cmd.sqe = &cmd.entry
	s := cmd.sqe
	if c.ctrl != nil {
		c.ctrl.touch()
	}
	h2c := s.opcode&1 != 0
	if s.opcode == opFabrics {
		h2c = s.raw[4]&1 != 0
	}
	if dlen > 0 {
		// In-capsule data.
		if !h2c || s.sglType != sglInCapsule || s.sglAddr != 0 || int(s.sglLen) != dlen {
			return c.protoErr(fesInvalidHeader, "in-capsule data of %d bytes with SGL type %#x length %d offset %d",
				dlen, s.sglType, s.sglLen, s.sglAddr)
		}
		cmd.pooled = bufpool.Get(dlen)
		cmd.data = *cmd.pooled
		if err := c.readData(cmd.data); err != nil {
			return err
		}
		c.exec(cmd)
		return nil
	}
	if h2c && s.sglLen > 0 {
		if s.sglType != sglTransport {
			c.complete(cmd, scSGLInvalidType|dnr, 0, 0)
			return nil
		}
		limit := c.s.cfg.MaxTransfer
		if c.qid == 0 {
			limit = 8192
		}
		if int(s.sglLen) > limit {
			c.complete(cmd, scInvalidField|dnr, 0, 0)
			return nil
		}
		cmd.pooled = bufpool.Get(int(s.sglLen))
		cmd.data = *cmd.pooled
		for c.pending[c.nextTag] != nil {
			c.nextTag++
		}
		cmd.tag = c.nextTag
		c.nextTag++
		c.pending[cmd.tag] = cmd
		c.r2t(cmd)
		return nil
	}
	c.exec(cmd)
	return nil
}

// r2t asks for the next chunk of cmd's data.
func (c *conn) r2t(cmd *command) {
	n := min(len(cmd.data)-cmd.got, c.s.cfg.R2TChunk)
	cmd.r2t = cmd.got + n
	h := make([]byte, dataHdrLen, dataHdrLen+digestLen)
	binary.LittleEndian.PutUint16(h[8:], cmd.sqe.cid)
	binary.LittleEndian.PutUint16(h[10:], cmd.tag)
	binary.LittleEndian.PutUint32(h[12:], uint32(cmd.got))
	binary.LittleEndian.PutUint32(h[16:], uint32(n))
	c.queue(c.headerOnly(pduR2T, h))
}

// h2cData reads data the host sends for an R2T.
func (c *conn) h2cData(hdr []byte, flags uint8, dlen int) error {
	cid := binary.LittleEndian.Uint16(hdr[8:])
	tag := binary.LittleEndian.Uint16(hdr[10:])
	off := int(binary.LittleEndian.Uint32(hdr[12:]))
	n := int(binary.LittleEndian.Uint32(hdr[16:]))
	cmd := c.pending[tag]
	switch {
	case cmd == nil || cmd.sqe.cid != cid:
		return c.protoErr(fesInvalidHeader, "H2CData for unknown transfer tag %d / command %d", tag, cid)
	case n != dlen || n == 0:
		return c.protoErr(fesInvalidHeader, "H2CData length %d with %d bytes of data", n, dlen)
	case off != cmd.got || off+n > cmd.r2t:
		return c.protoErr(fesDataOutOfRange, "H2CData [%d, %d) for an R2T up to %d with %d received", off, off+n, cmd.r2t, cmd.got)
	}
	if err := c.readData(cmd.data[off : off+n]); err != nil {
		return err
	}
	cmd.got += n
	if cmd.got < cmd.r2t {
		return nil
	}
	if flags&flagLast == 0 {
		return c.protoErr(fesInvalidHeader, "the H2CData PDU that completes an R2T lacks the LAST flag")
	}
	if cmd.got < len(cmd.data) {
		c.r2t(cmd)
		return nil
	}
	delete(c.pending, tag)
	c.exec(cmd)
	return nil
}

// putData gives cmd's data buffer back to the pool; cmd.data is not used
// after.
func (cmd *command) putData() {
	if cmd.pooled != nil {
		bufpool.Put(cmd.pooled)
		cmd.pooled, cmd.data = nil, nil
	}
}

// complete queues cmd's response.
func (c *conn) complete(cmd *command, status uint16, dw0, dw1 uint32) {
	c.queue(c.cmdRsp(cmd, status, dw0, dw1))
	c.inflight.Add(-1)
}

// cmdRsp is rsp in cmd's own room (once per command; a second response,
// which no path sends, would get a buffer of its own).
func (c *conn) cmdRsp(cmd *command, status uint16, dw0, dw1 uint32) []byte {
	if cmd.rsent {
		return c.rsp(cmd.sqe.cid, status, dw0, dw1)
	}
	cmd.rsent = true
	return c.rspIn(cmd.rspb[:rspLen:rspLen+digestLen], cmd.sqe.cid, status, dw0, dw1)
}

func (c *conn) rsp(cid, status uint16, dw0, dw1 uint32) []byte {
	return c.rspIn(make([]byte, rspLen, rspLen+digestLen), cid, status, dw0, dw1)
}

// rspIn frames a response in b (rspLen long, room for the digest).
func (c *conn) rspIn(b []byte, cid, status uint16, dw0, dw1 uint32) []byte {
	q := b[chLen:]
	binary.LittleEndian.PutUint32(q[0:], dw0)
	binary.LittleEndian.PutUint32(q[4:], dw1)
	sqhd := c.sqhd.Add(1) % uint32(c.sqsize)
	binary.LittleEndian.PutUint16(q[8:], uint16(sqhd))
	binary.LittleEndian.PutUint16(q[10:], c.qid)
	binary.LittleEndian.PutUint16(q[12:], cid)
	binary.LittleEndian.PutUint16(q[14:], status<<1)
	return c.headerOnly(pduCapsuleRsp, b)
}

// completeData sends data to the host and then the response, or (SQ flow
// control disabled) the SUCCESS flag on the last C2HData PDU instead.
func (c *conn) completeData(cmd *command, data []byte) { c.completeDataThen(cmd, data, nil) }

// completeDataThen is completeData, then release (if set) once data is
// written to the socket or dropped: data may go back to a pool.
func (c *conn) completeDataThen(cmd *command, data []byte, release func()) {
	if cmd.sqe.sglLen == 0 || len(data) == 0 {
		if release != nil {
			release()
		}
		c.complete(cmd, scSuccess, 0, 0)
		return
	}
	if l := int(cmd.sqe.sglLen); len(data) > l {
		data = data[:l]
	}
	// The C2HData PDUs and the response are queued at once: one writev
	// when nothing else is queued.
	const chunk = 128 << 10
	bufs := cmd.iov[:0]
	if len(data) > chunk {
		bufs = make([][]byte, 0, 3*((len(data)+chunk-1)/chunk)+1)
	}
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		last := end == len(data)
		hd, dd := 0, 0
		flags := uint8(0)
		if c.hdgst {
			hd, flags = digestLen, flags|flagHDGST
		}
		if c.ddgst {
			dd, flags = digestLen, flags|flagDDGST
		}
		if last {
			flags |= flagLast
			if c.noSQFlow {
				flags |= flagSuccess
			}
		}
		seg := data[off:end]
		h := cmd.c2h[:dataHdrLen+hd+dd]
		if off > 0 {
			h = make([]byte, dataHdrLen+hd+dd)
		}
		pdo := dataHdrLen + hd
		putCH(h, pduC2HData, flags, dataHdrLen, uint8(pdo), uint32(pdo+len(seg)+dd))
		binary.LittleEndian.PutUint16(h[8:], cmd.sqe.cid)
		binary.LittleEndian.PutUint32(h[12:], uint32(off))
		binary.LittleEndian.PutUint32(h[16:], uint32(len(seg)))
		if hd > 0 {
			binary.LittleEndian.PutUint32(h[dataHdrLen:], crc32c(h[:dataHdrLen]))
		}
		bufs = append(bufs, h[:pdo], seg)
		if dd > 0 {
			binary.LittleEndian.PutUint32(h[pdo:], crc32c(seg))
			bufs = append(bufs, h[pdo:])
		}
	}
	if c.noSQFlow {
		c.sqhd.Add(1)
	} else {
		bufs = append(bufs, c.cmdRsp(cmd, scSuccess, 0, 0))
	}
	c.queueThen(release, bufs...)
	c.inflight.Add(-1)
}

// queue hands buffers to the writer; it never blocks.
func (c *conn) queue(bufs ...[]byte) { c.queueThen(nil, bufs...) }

// queueThen is queue, then done (if set) once the writer wrote these
// buffers and every one queued before them, or dropped them.
func (c *conn) queueThen(done func(), bufs ...[]byte) {
	c.omu.Lock()
	if c.oclosed {
		c.omu.Unlock()
		if done != nil {
			done()
		}
		return
	}
	// Inline only for the one command in flight (its response is being
	// queued): with more, more responses follow, and the writer goroutine's
	// one writev per batch costs less than a writev each.
	if c.owner == ownerNone && !c.broken && c.w.CanTry() && c.inflight.Load() <= 1 {
		c.owner = ownerInline
		c.omu.Unlock()
		c.writeInline(done, bufs)
		return
	}
	c.out = append(c.out, bufs...)
	if done != nil {
		c.outDone = append(c.outDone, done)
	}
	wake := c.owner == ownerNone
	if wake {
		c.owner = ownerWriter
	} // else the owner sends them before letting go
	c.omu.Unlock()
	if wake {
		c.signal()
	}
}

// writeInline sends bufs with one non-blocking writev on the calling
// goroutine, which owns the write side (ownerInline), and hands what is left,
// with what others queued meanwhile, to the writer goroutine.
func (c *conn) writeInline(done func(), bufs [][]byte) {
	n := c.w.TryWrite(bufs)
	c.omu.Lock()
	if n < sockio.Len(bufs) {
		// The rest goes first: it was queued before anything in out.
		rest := sockio.Advance(bufs, n)
		c.out = append(rest[:len(rest):len(rest)], c.out...)
		if done != nil {
			c.outDone = append([]func(){done}, c.outDone...)
		}
		c.owner = ownerWriter
		c.omu.Unlock()
		c.signal()
		return
	}
	wake := len(c.out) > 0 || c.oclosed
	if wake {
		c.owner = ownerWriter
	} else {
		c.owner = ownerNone
	}
	c.omu.Unlock()
	if wake {
		c.signal()
	}
	if done != nil {
		done()
	}
}

func (c *conn) signal() {
	select {
	case c.oready <- struct{}{}:
	default:
	}
}

// writeLoop sends queued buffers whenever it owns the write side, until the
// reader closed the queue and it is empty.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	// The out queue's two arrays take turns: no allocation per batch.
	var spare [][]byte
	var spareDone []func()
	for {
		<-c.oready
		// With other commands in flight, their completions are likely
		// runnable now (a chunkserver's batch of replies completes
		// several): let them queue their PDUs first, for one writev.
		if c.inflight.Load() > 1 {
			runtime.Gosched()
		}
		for {
			c.omu.Lock()
			if c.owner != ownerWriter {
				c.omu.Unlock()
				break // a stale signal: an inline writer owns it, or nobody
			}
			bufs, done, closed, broken := c.out, c.outDone, c.oclosed, c.broken
			if len(bufs) == 0 {
				c.owner = ownerNone
				c.omu.Unlock()
				if closed {
					return
				}
				break
			}
			c.out, c.outDone = spare[:0], spareDone[:0]
			c.omu.Unlock()
			if !broken && !c.write(bufs) {
				c.omu.Lock()
				c.broken = true
				c.omu.Unlock()
				c.nc.Close() // the reader ends too
			}
			clear(bufs) // keep no released buffer reachable
			for _, f := range done {
				f()
			}
			clear(done)
			spare, spareDone = bufs[:0], done[:0]
		}
	}
}

// write sends bufs: what the socket takes at once, then the rest waiting
// for it under the write deadline (set only then, and cleared after: most
// batches never wait, and an expired deadline would fail every TryWrite).
func (c *conn) write(bufs [][]byte) bool {
	if n := c.w.TryWrite(bufs); n > 0 {
		if bufs = sockio.Advance(bufs, n); sockio.Len(bufs) == 0 {
			return true
		}
	}
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	_, err := c.w.Write(bufs)
	if err == nil {
		c.nc.SetWriteDeadline(time.Time{})
	}
	return err == nil
}
