package iscsi

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi/scsi"
	"github.com/basalt-storage/basalt/internal/sockio"
)

const (
	// maxQueued bounds the PDUs the reader queues for the writer on its own
	// account (R2Ts, NOP-Ins, rejects); past it the reader waits.
	maxQueued = 1024
	// lingerTimeout bounds the wait for the initiator's close after a logout.
	lingerTimeout = time.Second
)

// errLogout ends the reader after a successful logout.
var errLogout = errors.New("iscsi: logged out")

// conn is one TCP connection and, after login, its session (one connection
// per session). See doc.go for its goroutines.
type conn struct {
	s   *Server
	nc  net.Conn
	br  *bufio.Reader // owned by the reader goroutine
	log *slog.Logger

	// Set by the login (reader goroutine), read-only afterwards.
	isid          [6]byte
	tsih          uint16    // set by Server.register, under its mu
	since         time.Time // logged in; set by Server.register, under its mu
	loginITT      uint32
	initiator     string
	target        string
	volume        string
	discovery     bool
	key           sessionKey
	registered    bool
	att           *frontend.Attachment
	lu            *scsi.LU
	headerDigest  bool
	dataDigest    bool
	peerMaxData   int // the initiator's MaxRecvDataSegmentLength
	maxBurst      int
	firstBurst    int
	initialR2T    bool
	immediateData bool

	// statSN is the reader's during login and the writer's afterwards.
	statSN   uint32
	expCmdSN atomic.Uint32
	active   atomic.Int32 // non-immediate commands received and not yet answered
	shutdown atomic.Bool  // BeginShutdown was called

	// Reader-owned.
	rp          pdu // the PDU being read, reused (readPDUInto)
	nextTTT     uint32
	textPending map[uint32][]byte // Text responses still to send, by TTT

	// skipCmdSN holds CmdSNs an ABORT TASK named before their command
	// arrived (RFC 7143 11.5.1 b): the command is counted, not run. At most
	// one window's worth; reader-owned.
	skipCmdSN map[uint32]bool

	// mu guards the fields below; cond signals queue changes.
	mu      sync.Mutex
	cond    sync.Cond
	queue   []*outItem
	spare   []*outItem // the writer's last batch, emptied: the next queue
	queued  int        // reader-originated PDUs in queue
	stopped bool
	bytes   int64            // data buffer bytes charged by tasks in flight
	tasks   map[uint32]*task // by ITT
	free    []*task          // released tasks, for the reader to reuse
}

// outItem is a batch of PDUs for the writer, which stamps their sequence
// numbers, and what to do once they are written.
type outItem struct {
	pdus    []*pdu
	release func()
	reader  bool // counted in conn.queued
}

// task is one SCSI command. Its data-phase fields are the reader's until
// executing is set; then only complete touches the task. Tasks are reused
// (conn.newTask): once released, a task is touched only by the reader that
// takes it again, so nothing may keep a task past its release — a waiter
// keeps its done channel (conn.waitChans), not the task.
type task struct {
	c         *conn
	doneFn    func(scsi.Result) // t.executed, bound once per task struct
	releaseFn func()            // t.release, bound once per task struct
	aborted   atomic.Bool
	started   atomic.Bool // executing, for abortTasks on another goroutine

	// Guarded by conn.mu.
	released bool          // the response was written (or dropped)
	done     chan struct{} // made by a waiter (waitChans), closed on release

	taskState // zeroed for each command
}

// taskState is a task's per-command state.
type taskState struct {
	itt, cmdSN  uint32
	lun         [8]byte
	counted     bool // counted in conn.active
	cmd         *scsi.Command
	edtl        int
	readFlag    bool
	buf         []byte // Data-Out buffer: the CDB's bytes
	wanted      int
	got         int // Data-Out bytes received (contiguous, from offset 0)
	unsolEnd    int // unsolicited data ends here
	unsolDone   bool
	r2tOut      bool // an R2T is outstanding
	r2tEnd      int
	ttt         uint32
	r2tSN       uint32
	dataSN      uint32 // the DataSN the next Data-Out must carry (0 at each sequence's start)
	seqErr      bool   // a Data-Out came with the wrong DataSN: the rest of its sequence is dropped
	charge      int64
	executing   bool
	overflowOut int // Data-Out bytes the CDB wanted beyond the EDTL

	cmdv scsi.Command // t.cmd points here once decoded
	res  scsi.Result  // the answer, held until its PDUs are written
	// The response: a 4 KiB read's is one Data-In PDU carrying the status.
	out  outItem
	pduv [2]pdu
	pdus [2]*pdu
}

// newTask returns a task for a command read now: a released one, reset, or
// a new one. Called by the reader only.
func (c *conn) newTask() *task {
	c.mu.Lock()
	var t *task
	if n := len(c.free); n > 0 {
		t = c.free[n-1]
		c.free[n-1] = nil
		c.free = c.free[:n-1]
		t.released, t.done = false, nil
	}
	c.mu.Unlock()
	if t == nil {
		t = &task{c: c}
		t.doneFn = t.executed
		t.releaseFn = t.release
		return t
	}
	t.aborted.Store(false)
	t.started.Store(false)
	t.taskState = taskState{}
	return t
}

// executed is the LU's done callback (any goroutine).
func (t *task) executed(r scsi.Result) { t.c.complete(t, r) }

// release runs once t's response was written (or dropped): its buffers go
// back, its waiters wake, and the task is free for the reader to reuse.
func (t *task) release() {
	c := t.c
	if t.res.Release != nil {
		t.res.Release() // the Data-In PDUs are written (or dropped)
	}
	// Keep no buffer reachable from the free list. Only what the reader
	// never reads of a task it may still hold (executing, counted, cmdSN:
	// see dataOut and taskMgmt) is cleared here; newTask resets the rest.
	t.buf, t.res, t.out, t.pduv, t.pdus = nil, scsi.Result{}, outItem{}, [2]pdu{}, [2]*pdu{}
	c.mu.Lock()
	c.bytes -= t.charge
	t.released = true
	if t.done != nil {
		close(t.done)
	}
	c.free = append(c.free, t)
	c.mu.Unlock()
}

// waitChans returns channels that close when the tasks are released (none
// for one already released). Called by the reader, which alone reuses
// tasks, while the tasks it names cannot have been reused.
func (c *conn) waitChans(ts []*task) []chan struct{} {
	var chs []chan struct{}
	c.mu.Lock()
	for _, t := range ts {
		if ch := t.doneChan(); ch != nil {
			chs = append(chs, ch)
		}
	}
	c.mu.Unlock()
	return chs
}

// doneChan is the channel that closes when t is released, nil if it was
// already. c.mu must be held.
func (t *task) doneChan() chan struct{} {
	if t.released {
		return nil
	}
	if t.done == nil {
		t.done = make(chan struct{})
	}
	return t.done
}

func newConn(s *Server, nc net.Conn) *conn {
	remote := "unknown"
	if nc != nil && nc.RemoteAddr() != nil {
		remote = nc.RemoteAddr().String()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	c := &conn{
		// Raw reads (package sockio): the runtime does not track them.
		s: s, nc: nc, br: bufio.NewReaderSize(sockio.NewReader(nc), 64<<10),
		log:         s.log.With("remote", remote),
		peerMaxData: 8192, maxBurst: 262144, firstBurst: 65536,
		initialR2T: true, immediateData: true,
		tasks: map[uint32]*task{}, textPending: map[uint32][]byte{}, skipCmdSN: map[uint32]bool{},
	}
	c.cond.L = &c.mu
	return c
}

// BeginShutdown ends the connection gracefully: the reader stops, the
// commands it read are answered, then the socket closes (frontend.Conn).
func (c *conn) BeginShutdown() {
	c.shutdown.Store(true)
	c.nc.SetReadDeadline(time.Now())
}

// Close ends the connection at once (frontend.Conn).
func (c *conn) Close() { c.nc.Close() }

// Serve runs the connection to its end on the calling goroutine (frontend.Conn).
func (c *conn) Serve() {
	defer c.nc.Close()
	if err := c.login(); err != nil {
		var lf *loginFailure
		if !errors.As(err, &lf) && !errors.Is(err, io.EOF) {
			c.log.Warn("iscsi: login failed; closing the connection", "err", err)
		}
		if c.lu != nil {
			c.s.closeLU(c.volume, c.lu)
		}
		if c.att != nil {
			c.att.Detach()
		}
		return
	}
	if c.registered {
		defer c.s.unregister(c.key, c)
	}
	if c.att != nil {
		defer c.att.Detach() // after every task completed (below)
	}
	if c.lu != nil {
		defer c.s.closeLU(c.volume, c.lu)
	}
	c.log.Info("iscsi: logged in", "discovery", c.discovery, "header_digest", c.headerDigest,
		"data_digest", c.dataDigest, "tsih", c.tsih)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeLoop()
	}()
	err := c.readLoop()
	if c.shutdown.Load() {
		c.dropIdle() // then the commands in flight are answered before the close
	} else if !errors.Is(err, errLogout) {
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			c.log.Warn("iscsi: closing the connection", "err", err)
		}
		c.nc.Close()
	}
	c.abortAll()
	c.waitTasks()
	c.mu.Lock()
	c.stopped = true
	c.cond.Broadcast()
	c.mu.Unlock()
	<-writerDone
	if errors.Is(err, errLogout) {
		c.linger()
	}
	c.log.Info("iscsi: connection closed", "end", endReason(err))
}

func endReason(err error) string {
	switch {
	case errors.Is(err, errLogout):
		return "logout"
	case errors.Is(err, io.EOF):
		return "initiator closed"
	}
	return err.Error()
}

func (c *conn) linger() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
		io.Copy(io.Discard, c.br)
	}
}

// maxCmdSN is the last CmdSN the initiator may send now.
func (c *conn) maxCmdSN(exp uint32) uint32 {
	free := int32(c.s.cfg.MaxCommands) - c.active.Load()
	return exp + uint32(max(free, 0)) - 1
}

// enqueue hands PDUs to the writer. Reader-originated batches wait while
// too many are queued; completions never wait.
func (c *conn) enqueue(it *outItem) {
	c.mu.Lock()
	if it.reader {
		for c.queued >= maxQueued && !c.stopped {
			c.cond.Wait()
		}
		c.queued += len(it.pdus)
	}
	c.queue = append(c.queue, it)
	c.cond.Broadcast()
	c.mu.Unlock()
}

func (c *conn) send(reader bool, pdus ...*pdu) {
	c.enqueue(&outItem{pdus: pdus, reader: reader})
}

// writeLoop writes queued PDUs until the connection stops and the queue is
// empty, each batch with one writev (package sockio: raw calls the runtime
// does not track) of the PDUs' headers and their data where it lies. A write
// failure closes the socket; later PDUs are dropped.
func (c *conn) writeLoop() {
	w := sockio.NewWriter(c.nc)
	var (
		hdrs   []byte   // the batch's headers, digests and pads
		pieces []wpiece // what to write, in order
		iov    [][]byte
	)
	failed := false
	for {
		c.mu.Lock()
		for len(c.queue) == 0 && !c.stopped {
			c.cond.Wait()
		}
		items := c.queue
		c.queue = c.spare[:0]
		c.spare = nil
		for _, it := range items {
			if it.reader {
				c.queued -= len(it.pdus)
			}
		}
		stop := c.stopped && len(items) == 0
		c.cond.Broadcast()
		c.mu.Unlock()
		if stop {
			return
		}
		if !failed {
			hdrs, pieces = hdrs[:0], pieces[:0]
			for _, it := range items {
				for _, p := range it.pdus {
					c.stamp(p)
					hdrs, pieces = c.appendWire(hdrs, pieces, p)
				}
			}
			// hdrs is complete: only now may slices of it be taken.
			iov = iov[:0]
			for _, pc := range pieces {
				if pc.data != nil {
					iov = append(iov, pc.data)
				} else {
					iov = append(iov, hdrs[pc.start:pc.end])
				}
			}
			c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
			_, err := w.Write(iov)
			clear(iov) // keep no released buffer reachable
			clear(pieces)
			if err != nil {
				failed = true
				c.log.Warn("iscsi: write failed; closing the connection", "err", err)
				c.nc.Close()
			}
		}
		for _, it := range items {
			if it.release != nil {
				it.release()
			}
		}
		clear(items)
		c.mu.Lock()
		c.spare = items
		c.mu.Unlock()
	}
}

// wpiece is one piece of a batch: a PDU's data segment, or bytes
// [start, end) of the batch's header buffer.
type wpiece struct {
	data       []byte
	start, end int
}

// appendWire appends p's wire form to a batch: its header (BHS, AHS, header
// digest), pad and data digest to hdrs, the pieces to write to pieces.
func (c *conn) appendWire(hdrs []byte, pieces []wpiece, p *pdu) ([]byte, []wpiece) {
	n := len(p.data)
	start := len(hdrs)
	hdrs = append(hdrs, p.bhs[:]...)
	hdrs = append(hdrs, p.ahs...)
	h := hdrs[start:]
	h[4] = byte(len(p.ahs) / 4)
	h[5], h[6], h[7] = byte(n>>16), byte(n>>8), byte(n)
	if c.headerDigest {
		d := digest(hdrs[start:])
		hdrs = append(hdrs, d[:]...)
	}
	pieces = append(pieces, wpiece{start: start, end: len(hdrs)})
	if n == 0 {
		return hdrs, pieces
	}
	pieces = append(pieces, wpiece{data: p.data})
	start = len(hdrs)
	pad := zeroPad[:pad4(n)-n]
	hdrs = append(hdrs, pad...)
	if c.dataDigest {
		d := digest(p.data, pad)
		hdrs = append(hdrs, d[:]...)
	}
	if len(hdrs) > start {
		pieces = append(pieces, wpiece{start: start, end: len(hdrs)})
	}
	return hdrs, pieces
}

// stamp sets a target PDU's StatSN, ExpCmdSN and MaxCmdSN as it is written.
func (c *conn) stamp(p *pdu) {
	switch p.opcode() {
	case opSCSIResp, opTaskResp, opTextResp, opLogoutResp:
		p.put32(24, c.statSN)
		c.statSN++
	case opNopIn:
		p.put32(24, c.statSN)
		if p.itt() != reservedTag {
			c.statSN++
		}
	case opDataIn:
		if p.bhs[1]&0x01 != 0 {
			p.put32(24, c.statSN)
			c.statSN++
		}
	default: // R2T, Reject
		p.put32(24, c.statSN)
	}
	exp := c.expCmdSN.Load()
	p.put32(28, exp)
	p.put32(32, c.maxCmdSN(exp))
}

// readLoop reads and dispatches PDUs in full feature phase.
func (c *conn) readLoop() error {
	p := &c.rp
	for {
		err := readPDUInto(c.br, p, c.headerDigest, c.dataDigest, c.s.cfg.MaxRecvDataSegment)
		if errors.Is(err, errDataDigest) {
			c.log.Warn("iscsi: data digest mismatch; rejecting the PDU", "opcode", fmt.Sprintf("%#x", p.opcode()))
			c.reject(p, rejectDataDigest)
			continue
		}
		if err != nil {
			return err
		}
		if err := c.dispatch(p); err != nil {
			return err
		}
	}
}

func (c *conn) dispatch(p *pdu) error {
	op := p.opcode()
	if c.discovery {
		switch op {
		case opTextReq, opNopOut, opLogoutReq:
		default:
			c.reject(p, rejectProtocolError)
			return nil
		}
	}
	switch op {
	case opSCSICmd:
		c.scsiCommand(p)
	case opDataOut:
		return c.dataOut(p)
	case opNopOut:
		c.nopOut(p)
	case opTaskMgmt:
		return c.taskMgmt(p)
	case opTextReq:
		c.textRequest(p)
	case opLogoutReq:
		return c.logout(p)
	case opLoginReq:
		c.reject(p, rejectProtocolError)
	default: // SNACK (error recovery level 0) and anything unknown
		c.reject(p, rejectNotSupported)
	}
	return nil
}

func (c *conn) reject(p *pdu, reason byte) {
	r := &pdu{data: append([]byte(nil), p.bhs[:]...)}
	r.bhs[0] = opReject
	r.bhs[1] = 0x80
	r.bhs[2] = reason
	r.put32(16, reservedTag)
	c.send(true, r)
}

// acceptCmdSN advances ExpCmdSN for a non-immediate command in order and
// reports whether to run it; an out-of-order or duplicate command is ignored
// (RFC 7143 4.2.2.1).
func (c *conn) acceptCmdSN(p *pdu) bool {
	if p.immediate() {
		return true
	}
	sn, exp := p.u32(24), c.expCmdSN.Load()
	if sn != exp {
		c.log.Debug("iscsi: ignoring a command out of the CmdSN window", "cmdsn", sn, "expcmdsn", exp)
		return false
	}
	c.expCmdSN.Store(exp + 1)
	if c.skipCmdSN[sn] {
		delete(c.skipCmdSN, sn) // aborted before it arrived: received, never run
		c.log.Debug("iscsi: dropping a command that ABORT TASK named before it arrived", "cmdsn", sn)
		return false
	}
	return true
}

func (c *conn) scsiCommand(p *pdu) {
	if !c.acceptCmdSN(p) {
		return
	}
	c.mu.Lock()
	_, dup := c.tasks[p.itt()]
	c.mu.Unlock()
	if dup || p.itt() == reservedTag {
		// An ITT must name one task of the session (RFC 7143 10.19): a second
		// task under a tag in use would hide the first from TMFs, Data-Out
		// and the wait at the session's end. Its CmdSN counts; it never runs.
		c.log.Warn("iscsi: rejecting a command whose task tag is in use", "itt", p.itt())
		c.reject(p, rejectInvalidField)
		return
	}
	t := c.newTask()
	t.itt, t.cmdSN, t.edtl = p.itt(), p.u32(24), int(p.u32(20))
	copy(t.lun[:], p.bhs[8:16])
	t.readFlag = p.bhs[1]&0x40 != 0
	writeFlag := p.bhs[1]&0x20 != 0
	if !p.immediate() {
		t.counted = true
		c.active.Add(1)
	}
	cdb := p.bhs[32:48]
	if ext := p.extendedCDB(); ext != nil {
		cdb = append(append([]byte(nil), cdb...), ext...)
	}
	if t.lun != [8]byte{} && cdb[0] != 0xa0 && cdb[0] != 0x12 {
		// LOGICAL UNIT NOT SUPPORTED (only REPORT LUNS and INQUIRY answer for
		// a LUN that does not exist).
		c.complete(t, scsi.Result{Status: scsi.StatusCheckCondition, Sense: &scsi.Sense{Key: scsi.KeyIllegalRequest, ASC: 0x25}})
		return
	}
	if sense := scsi.DecodeInto(&t.cmdv, cdb, c.lu.BlockSize()); sense != nil {
		c.complete(t, scsi.Result{Status: scsi.StatusCheckCondition, Sense: sense})
		return
	}
	cmd := &t.cmdv
	t.cmd = cmd
	edtl := t.edtl
	if !writeFlag {
		edtl = 0
	}
	if cmd.DataOut > 0 && edtl < cmd.DataOut {
		// The initiator sends less than the CDB calls for (RFC 7143 11.4.5.2,
		// as libiscsi's residual tests expect): a plain write writes the whole
		// blocks it gets, with an overflow residual.
		t.overflowOut = cmd.DataOut - edtl
		if !cmd.Truncate(edtl, c.lu.BlockSize()) {
			asc, ascq := byte(0x24), byte(0) // INVALID FIELD IN CDB
			if edtl%c.lu.BlockSize() != 0 {
				asc, ascq = 0x0e, 0x03 // INVALID FIELD IN INFORMATION UNIT
			}
			c.complete(t, scsi.Result{Status: scsi.StatusCheckCondition,
				Sense: &scsi.Sense{Key: scsi.KeyIllegalRequest, ASC: asc, ASCQ: ascq}})
			return
		}
	}
	if cmd.ExactData() && edtl != cmd.DataOut {
		// WRITE SAME and COMPARE AND WRITE: the data must be exactly what
		// the CDB calls for.
		c.complete(t, scsi.Result{Status: scsi.StatusCheckCondition,
			Sense: &scsi.Sense{Key: scsi.KeyIllegalRequest, ASC: 0x24}})
		return
	}
	if s := c.lu.DataOutTooLong(cmd); s != nil {
		// Refused before its data is received or room made for it.
		c.complete(t, scsi.Result{Status: scsi.StatusCheckCondition, Sense: s})
		return
	}
	t.wanted = cmd.DataOut
	if len(p.data) > 0 && (!writeFlag || !c.immediateData || len(p.data) > t.edtl || len(p.data) > c.firstBurst) {
		c.reject(p, rejectProtocolError)
		c.complete(t, scsi.Result{Status: scsi.StatusCheckCondition, Sense: &scsi.Sense{Key: scsi.KeyAbortedCommand}})
		return
	}
	t.charge = int64(t.wanted)
	if cmd.Dir == scsi.DirIn {
		t.charge = int64(min(cmd.DataIn, c.lu.MaxTransfer()))
	}
	c.mu.Lock()
	full := c.bytes > 0 && c.bytes+t.charge > c.s.cfg.MaxSessionBytes
	if !full {
		c.bytes += t.charge
		c.tasks[t.itt] = t
	}
	c.mu.Unlock()
	if full {
		t.charge = 0
		c.complete(t, scsi.Result{Status: scsi.StatusTaskSetFull})
		return
	}
	if t.wanted == 0 {
		c.execute(t)
		return
	}
	t.buf = make([]byte, t.wanted)
	copy(t.buf, p.data)
	t.got = len(p.data)
	t.unsolEnd = t.got
	if !c.initialR2T {
		t.unsolEnd = min(c.firstBurst, t.edtl)
	}
	// F on the command: no unsolicited Data-Out follows.
	t.unsolDone = t.got >= t.unsolEnd || p.final()
	c.advance(t)
}

// advance runs a write whose data is complete, or asks for more.
func (c *conn) advance(t *task) {
	if t.got >= t.wanted {
		c.execute(t)
		return
	}
	if !t.unsolDone || t.r2tOut {
		return
	}
	t.r2tOut = true
	t.dataSN = 0
	t.r2tEnd = min(t.got+c.maxBurst, t.wanted)
	c.nextTTT++
	if c.nextTTT == reservedTag {
		c.nextTTT = 0
	}
	t.ttt = c.nextTTT
	r := &pdu{}
	r.bhs[0] = opR2T
	r.bhs[1] = 0x80
	copy(r.bhs[8:16], t.lun[:])
	r.put32(16, t.itt)
	r.put32(20, t.ttt)
	r.put32(36, t.r2tSN)
	r.put32(40, uint32(t.got))
	r.put32(44, uint32(t.r2tEnd-t.got))
	t.r2tSN++
	c.send(true, r)
}

func (c *conn) dataOut(p *pdu) error {
	c.mu.Lock()
	t := c.tasks[p.itt()]
	c.mu.Unlock()
	if t == nil || t.executing {
		// The command was already answered (an early CHECK CONDITION): its
		// remaining data is dropped.
		return nil
	}
	ttt, off, n := p.u32(20), int(p.u32(40)), len(p.data)
	if t.seqErr {
		// The rest of a sequence with a lost PDU: dropped until its last.
		if p.final() {
			c.failData(t)
		}
		return nil
	}
	if ttt == reservedTag {
		if t.unsolDone {
			return fmt.Errorf("%w: unsolicited Data-Out after the unsolicited data ended", ErrMalformed)
		}
	} else if !t.r2tOut || ttt != t.ttt {
		return fmt.Errorf("%w: Data-Out for an R2T that was not sent", ErrMalformed)
	}
	if sn := p.u32(36); sn != t.dataSN {
		// A sequence error: a Data-Out PDU was lost (RFC 7143 7.9), which at
		// ErrorRecoveryLevel 0 (no recovery R2T) ends the task with CHECK
		// CONDITION once its sequence's last PDU is in (7.8); nothing of it
		// is written, and the connection lives on.
		c.log.Warn("iscsi: Data-Out with the wrong DataSN; failing the command", "itt", t.itt, "datasn", sn, "expected", t.dataSN)
		t.seqErr = true
		if p.final() {
			c.failData(t)
		}
		return nil
	}
	if off != t.got || off+n > t.edtl {
		return fmt.Errorf("%w: Data-Out at offset %d+%d, expected %d (EDTL %d)", ErrMalformed, off, n, t.got, t.edtl)
	}
	if ttt == reservedTag && off+n > t.unsolEnd {
		return fmt.Errorf("%w: unsolicited Data-Out beyond FirstBurstLength", ErrMalformed)
	}
	if ttt != reservedTag && off+n > t.r2tEnd {
		return fmt.Errorf("%w: Data-Out beyond the R2T it answers", ErrMalformed)
	}
	t.dataSN++
	if off < t.wanted {
		copy(t.buf[off:], p.data)
	}
	t.got += n
	if ttt == reservedTag {
		if p.final() || t.got >= t.unsolEnd {
			t.unsolDone = true
		}
	} else if p.final() || t.got >= t.r2tEnd {
		t.r2tOut = false
	}
	c.advance(t)
	return nil
}

// failData ends a write whose data lost a PDU: CHECK CONDITION, ABORTED
// COMMAND, PROTOCOL SERVICE CRC ERROR (RFC 7143 7.8, 11.4.7.2). It never
// ran: nothing was written.
func (c *conn) failData(t *task) {
	t.executing = true // later Data-Out for it is dropped
	c.complete(t, scsi.Result{Status: scsi.StatusCheckCondition,
		Sense: &scsi.Sense{Key: scsi.KeyAbortedCommand, ASC: 0x47, ASCQ: 0x05}})
}

func (c *conn) execute(t *task) {
	t.executing = true
	t.started.Store(true)
	if t.aborted.Load() { // by abortTasks while its data came in
		c.complete(t, scsi.Result{Status: scsi.StatusTaskAborted})
		return
	}
	c.lu.Execute(t.cmd, t.buf, t.doneFn)
}

// complete answers a task (on any goroutine) and forgets it. It must not
// touch t once the response is queued: the writer may release it (and the
// reader reuse it) at once.
func (c *conn) complete(t *task, r scsi.Result) {
	c.mu.Lock()
	if c.tasks[t.itt] == t {
		delete(c.tasks, t.itt)
	}
	c.mu.Unlock()
	if t.counted {
		c.active.Add(-1)
	}
	t.res = r
	if t.aborted.Load() {
		t.release()
		return
	}
	data := r.Data
	if !t.readFlag {
		data = nil
	}
	// Residuals (RFC 7143 11.4.5): against the data the command moved.
	var flags byte
	var residual int
	moved := len(data)
	if t.cmd != nil && t.cmd.DataOut > 0 {
		moved = t.wanted
	}
	switch {
	case t.overflowOut > 0:
		flags, residual = 0x04, t.overflowOut
	case t.cmd != nil && t.cmd.Dir == scsi.DirIn && len(r.Data) > t.edtl:
		flags, residual = 0x04, len(r.Data)-t.edtl
	case moved < t.edtl:
		flags, residual = 0x02, t.edtl-moved
	}
	send := min(len(data), t.edtl)
	pdus := t.pdus[:0]
	next := func() *pdu { // the task's own PDUs first
		if i := len(pdus); i < len(t.pduv) {
			return &t.pduv[i]
		}
		return &pdu{}
	}
	var dataSN uint32
	collapse := r.Status == scsi.StatusGood && send > 0
	for off := 0; off < send; {
		n := min(send-off, c.peerMaxData)
		burstEnd := (off/c.maxBurst + 1) * c.maxBurst
		n = min(n, burstEnd-off)
		d := next()
		d.data = data[off : off+n]
		d.bhs[0] = opDataIn
		last := off+n == send
		if last || off+n == burstEnd {
			d.bhs[1] |= 0x80
		}
		if last && collapse {
			d.bhs[1] |= 0x01 | flags
			d.bhs[3] = r.Status
			d.put32(44, uint32(residual))
		}
		copy(d.bhs[8:16], t.lun[:])
		d.put32(16, t.itt)
		d.put32(20, reservedTag)
		d.put32(36, dataSN)
		d.put32(40, uint32(off))
		dataSN++
		pdus = append(pdus, d)
		off += n
	}
	if !collapse {
		s := next()
		s.bhs[0] = opSCSIResp
		s.bhs[1] = 0x80 | flags
		s.bhs[3] = r.Status
		s.put32(16, t.itt)
		s.put32(36, dataSN+t.r2tSN)
		s.put32(44, uint32(residual))
		if r.Sense != nil {
			sd := r.Sense.Fixed()
			s.data = binary.BigEndian.AppendUint16(nil, uint16(len(sd)))
			s.data = append(s.data, sd...)
		}
		pdus = append(pdus, s)
	}
	t.out = outItem{pdus: pdus, release: t.releaseFn}
	c.enqueue(&t.out)
}

// abortAll drops the tasks still waiting for data and marks the others
// aborted (their responses are not sent). Called when the reader is done.
func (c *conn) abortAll() {
	c.mu.Lock()
	var idle []*task
	for itt, t := range c.tasks {
		t.aborted.Store(true)
		if !t.executing {
			delete(c.tasks, itt)
			idle = append(idle, t)
		}
	}
	c.mu.Unlock()
	for _, t := range idle {
		c.complete(t, scsi.Result{Status: scsi.StatusTaskAborted})
	}
}

// dropIdle aborts the tasks still waiting for Data-Out (the reader, which
// would receive it, is done).
func (c *conn) dropIdle() {
	c.mu.Lock()
	var idle []*task
	for itt, t := range c.tasks {
		if !t.executing {
			t.aborted.Store(true)
			delete(c.tasks, itt)
			idle = append(idle, t)
		}
	}
	c.mu.Unlock()
	for _, t := range idle {
		c.complete(t, scsi.Result{Status: scsi.StatusTaskAborted})
	}
}

// waitTasks waits until no task is in flight (every backend callback ran).
func (c *conn) waitTasks() {
	for {
		c.mu.Lock()
		var t *task
		for _, x := range c.tasks {
			t = x
			break
		}
		c.mu.Unlock()
		if t == nil {
			return
		}
		for _, ch := range c.waitChans([]*task{t}) {
			<-ch
		}
	}
}
