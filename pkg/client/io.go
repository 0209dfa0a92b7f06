package client

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// maxPieceBytes bounds one frame's IO (and so its payload) when chunks are larger.
const maxPieceBytes = 16 << 20

// Retry timing (see the package doc).
const (
	connRetryBase = 5 * time.Millisecond
	roundBackoff  = 20 * time.Millisecond // after a full round of failed members, doubling
	maxBackoff    = time.Second
	busyBase      = time.Millisecond
	busyMax       = 500 * time.Millisecond
)

// Submit starts one IO and calls done exactly once: with nil, an *api.Error (a
// final chunkserver refusal, errors.Is against api.ErrFenced, ...), or one of this
// package's errors. buf is the read destination or write source (len(buf) >=
// length); Flush, Trim and WriteZeroes take nil; OpMapped fills buf with the
// bitmap of which 4 KiB granules hold data (api.MapGranule: offset and length
// multiples of api.MapAlign, api.MappedBytes(length) bytes; it reads, as a
// read-only session may); OpCompareAndWrite takes the bytes to compare and
// then those to write (len(buf) >= 2*length; length at most
// api.MaxCompareAndWrite, the range within one chunk, and within one
// 16 MiB piece of a larger chunk) and fails with a
// *MiscompareError when the volume holds other data. A request refused before anything
// is sent (past the end, closed volume, expired lease) calls done before Submit
// returns; otherwise done runs on a library goroutine and must not block.
func (v *Volume) Submit(op api.Op, buf []byte, off, length int64, done func(error)) {
	if err := v.usable(); err != nil {
		done(err)
		return
	}
	switch op {
	case api.OpFlush:
		v.flushes.flush(done)
		return
	case api.OpRead, api.OpWrite:
		if int64(len(buf)) < length {
			done(fmt.Errorf("%w: buffer of %d bytes for %d", api.ErrBadRequest, len(buf), length))
			return
		}
	case api.OpTrim, api.OpWriteZeroes:
	case api.OpCompareAndWrite:
		if int64(len(buf)) < 2*length || length > api.MaxCompareAndWrite ||
			length > 0 && off >= 0 && off/v.maxPiece != (off+length-1)/v.maxPiece {
			done(fmt.Errorf("%w: compare-and-write [%d, +%d) with %d bytes: at most %d bytes within one chunk, the buffer twice that",
				api.ErrBadRequest, off, length, len(buf), api.MaxCompareAndWrite))
			return
		}
	case api.OpMapped:
		if off%api.MapAlign != 0 || length%api.MapAlign != 0 || int64(len(buf)) < api.MappedBytes(length) {
			done(fmt.Errorf("%w: mapped [%d, +%d) with %d bytes: offset and length must be multiples of %d, the buffer of length/%d bytes",
				api.ErrBadRequest, off, length, len(buf), api.MapAlign, api.MapAlign))
			return
		}
	default:
		done(fmt.Errorf("%w: unknown op %d", api.ErrBadRequest, op))
		return
	}
	reads := op == api.OpRead || op == api.OpMapped
	if !reads && v.cfg.ReadOnly {
		done(api.ErrReadOnly)
		return
	}
	if size := v.size.Load(); off < 0 || length < 0 || off > size || length > size-off {
		done(api.ErrOutOfRange)
		return
	}
	if length == 0 {
		done(nil)
		return
	}
	o := &ioOp{v: v, op: op, done: done, deadline: v.now() + int64(v.cfg.OpTimeout), length: length}
	if v.m != nil {
		o.start = time.Now()
	}
	if !reads {
		o.gen = v.flushes.begin()
		o.write = true
	}
	if !v.opStart() {
		if o.write {
			v.flushes.end(o.gen)
		}
		done(ErrClosed)
		return
	}
	o.pieces = v.split(o, buf, off, length)
	o.remaining.Store(int32(len(o.pieces)))
	for i := range o.pieces {
		o.pieces[i].attempt()
	}
}

// split cuts [off, off+length) at chunk boundaries (and at maxPieceBytes) and
// routes each piece to its copyset.
func (v *Volume) split(o *ioOp, buf []byte, off, length int64) []piece {
	first := off / v.maxPiece
	last := (off + length - 1) / v.maxPiece
	ps := make([]piece, last-first+1)
	pos := int64(0)
	for i := range ps {
		p := &ps[i]
		p.op = o
		p.off = off + pos
		n := min(length-pos, v.maxPiece-p.off%v.maxPiece)
		p.n = n
		switch {
		case buf == nil:
		case o.op == api.OpMapped:
			// Pieces start at multiples of MapAlign: chunks and maxPieceBytes are.
			p.buf = buf[api.MappedBytes(pos):api.MappedBytes(pos+n)]
		case o.op == api.OpCompareAndWrite:
			p.buf = buf[:2*n] // one piece (Submit checked): compare, then write

		default:
			p.buf = buf[pos : pos+n]
		}
		p.cs = api.CopysetOf(v.id, uint64(p.off/v.chunkSize), v.csCount)
		if o.write {
			p.seq = v.seqs[p.cs].take()
		}
		pos += n
	}
	return ps
}

// ioOp is one submitted IO: its pieces complete independently; the op completes
// when the last one did, with the first error any of them had.
type ioOp struct {
	v         *Volume
	op        api.Op
	done      func(error)
	deadline  int64     // Volume.now() nanoseconds
	start     time.Time // for metrics only (zero without)
	length    int64
	write     bool
	gen       uint64 // flush generation of a write
	pieces    []piece
	remaining atomic.Int32
	errMu     sync.Mutex
	err       error
}

func (o *ioOp) pieceDone(err error) {
	if err != nil {
		o.errMu.Lock()
		if o.err == nil {
			o.err = err
		}
		o.errMu.Unlock()
	}
	if o.remaining.Add(-1) != 0 {
		return
	}
	o.errMu.Lock()
	err = o.err
	o.errMu.Unlock()
	o.v.m.ioDone(o.op, o.length, o.start, err)
	o.done(err)
	if o.write { // after done: a flush completes after the writes it waited for
		o.v.flushes.end(o.gen)
	}
	o.v.opEnd()
}

// piece is the part of an IO inside one chunk, sent to one copyset.
//
// INVARIANT: at most one attempt of a piece is outstanding (its call is in flight
// on at most one Conn, or one timer/dial/refresh callback will start the next one),
// so the fields below are handed from attempt to attempt, never shared; each
// attempt has its own transport.Call, so a late timer aborting an old call is a
// no-op.
type piece struct {
	op     *ioOp
	cs     uint32
	seq    uint64 // a write, trim or write-zeroes: its number in the copyset (seq.go)
	off, n int64
	buf    []byte

	mu      sync.Mutex  // guards timer between send and replied
	timer   *time.Timer // the current attempt's IOTimeout
	sent    time.Time   // the current attempt's start (metrics only)
	target  uint64      // chunkserver of the current attempt; 0 = start from the cache
	fails   int         // members failed in a row since the last refresh (conn errors, NOT_LEADER without hint)
	diskErr []uint64    // members that answered NO_SPACE or IO_ERROR since the last refresh
	rounds  int         // full rounds of failed members
	hops    int         // NOT_LEADER redirects in a row
	busy    int         // BUSY answers in a row
	stale   int         // OUT_OF_RANGE answers (retried up to maxStaleRetries)
	lastErr error
}

// attempt sends the piece once, to p.target or the copyset's cached leader.
func (p *piece) attempt() {
	v := p.op.v
	if err := v.usable(); err != nil {
		p.finish(err)
		return
	}
	if v.now() >= p.op.deadline {
		p.finish(p.timeoutErr())
		return
	}
	r := v.routes.copyset(p.cs)
	if r == nil {
		p.lastErr = fmt.Errorf("%w: copyset %d", ErrNoRoute, p.cs)
		p.fails++
		p.afterRound(nil)
		return
	}
	if p.target == 0 || !r.isMember(p.target) {
		p.target = r.first()
	}
	p.dispatch()
}

// dispatch sends the attempt to p.target: in process when it is the Local
// chunkserver, else over the connection to it.
func (p *piece) dispatch() {
	v := p.op.v
	if l := v.cfg.Local; l != nil && p.target == l.LocalID() {
		p.sendLocal(l)
		return
	}
	v.conns.Get(p.target, p.send)
}

// sendLocal is send for the local fast path: no connection, no timer.
func (p *piece) sendLocal(l Local) {
	v := p.op.v
	req, payload, readBuf := p.request()
	if v.m != nil {
		p.sent = time.Now()
		v.m.m.local.Inc()
	}
	l.Go(req, payload, readBuf, p.repliedLocal)
}

// request is the request of one attempt: its header, a write's payload and a
// read's destination.
func (p *piece) request() (h api.Header, payload, readBuf []byte) {
	v := p.op.v
	h = api.Header{
		Op:      p.op.op,
		Volume:  v.id,
		Epoch:   v.epoch,
		Offset:  uint64(p.off),
		Length:  uint32(p.n),
		Copyset: p.cs,
	}
	if p.seq != 0 {
		h.Seq, h.Settled = p.seq, v.seqs[p.cs].settled()
	}
	switch p.op.op {
	case api.OpRead, api.OpMapped:
		readBuf = p.buf
	case api.OpWrite, api.OpCompareAndWrite:
		payload = p.buf
		h.Flags = api.FlagFUA
	}
	return h, payload, readBuf
}

func (p *piece) timeoutErr() error {
	if p.lastErr == nil {
		return ErrTimeout
	}
	return fmt.Errorf("%w: last error: %w", ErrTimeout, p.lastErr)
}

// send runs with the connection to p.target (or the dial error).
func (p *piece) send(c *transport.Conn, err error) {
	if err != nil {
		if errors.Is(err, transport.ErrCacheClosed) {
			p.finish(ErrClosed)
			return
		}
		p.op.v.log.Debug("client: dial failed", "chunkserver", p.target, "err", err)
		p.connFailed(fmt.Errorf("client: dial chunkserver %d: %w", p.target, err))
		return
	}
	v := p.op.v
	call := &transport.Call{}
	call.Header, call.Payload, call.ReadBuf = p.request()
	wait := max(min(v.cfg.IOTimeout+transferAllowance(p.n), time.Duration(p.op.deadline-v.now())), time.Millisecond)
	if v.m != nil {
		p.sent = time.Now()
	}
	p.mu.Lock() // replied waits until the timer is set
	c.Go(call, p.replied)
	p.timer = time.AfterFunc(wait, func() { c.Abort(call, errAttemptTimeout) })
	p.mu.Unlock()
}

var errAttemptTimeout = errors.New("client: attempt timed out (IOTimeout)")

// replied handles the outcome of one attempt over a connection (on a
// transport goroutine).
func (p *piece) replied(call *transport.Call) {
	p.mu.Lock()
	p.timer.Stop()
	p.timer = nil
	p.mu.Unlock()
	p.handleReply(call.Reply, call.Err)
}

// repliedLocal handles the outcome of one attempt on the local fast path.
func (p *piece) repliedLocal(reply api.Header) { p.handleReply(reply, nil) }

// maxStaleRetries bounds the retries of OUT_OF_RANGE: with the BUSY backoff
// (capped at 500 ms) about 10 s, many chunkserver heartbeats.
const maxStaleRetries = 28

// handleReply acts on an attempt's reply header, or on the transport error
// that ended it.
func (p *piece) handleReply(h api.Header, err error) {
	v := p.op.v
	v.m.attemptDone(p.op.op, p.sent)
	if err != nil {
		v.m.retry(v.m.conn())
		p.connFailed(fmt.Errorf("chunkserver %d: %w", p.target, err))
		return
	}
	if h.Status != api.StatusBusy && h.Status != api.StatusOutOfRange {
		p.busy = 0
	}
	switch h.Status {
	case api.StatusOK:
		if r := v.routes.copyset(p.cs); r != nil && r.isMember(p.target) {
			r.leader.Store(p.target)
		} else {
			v.routes.refresh(func() {}) // served by a member the client does not know of
		}
		if p.op.op == api.OpRead && int64(h.PayloadLen) != p.n {
			p.finish(fmt.Errorf("%w: read of %d bytes answered with %d", api.ErrIO, p.n, h.PayloadLen))
			return
		}
		if p.op.op == api.OpMapped && int64(h.PayloadLen) != int64(len(p.buf)) {
			p.finish(fmt.Errorf("%w: mapped of %d bytes answered with %d bytes, not %d", api.ErrIO, p.n, h.PayloadLen, len(p.buf)))
			return
		}
		p.finish(nil)
	case api.StatusNotLeader, api.StatusNoSuchCopyset:
		v.m.retry(v.m.notLeader())
		p.lastErr = api.StatusError(h.Status, h.Hint)
		r := v.routes.copyset(p.cs)
		if h.Status == api.StatusNotLeader && h.Hint != 0 && h.Hint != p.target && p.hops < 8 {
			p.hops++
			if r != nil && r.isMember(h.Hint) {
				r.leader.CompareAndSwap(p.target, h.Hint)
			}
			p.target = h.Hint
			p.attemptHint()
			return
		}
		p.hops = 0
		if r != nil {
			r.leader.CompareAndSwap(p.target, 0)
		}
		p.fails++
		if r != nil && p.fails < len(r.members) {
			p.target = r.next(p.target)
			p.attempt() // a live member that is not the leader: try the next at once
			return
		}
		p.moveOn(r)
	case api.StatusBusy, api.StatusOutOfRange:
		// OUT_OF_RANGE for a piece the client checked against the volume's
		// size (and cut at chunk boundaries): the chunkserver has not heard
		// of a grow yet — it learns sizes at its next heartbeat, about a
		// second — so it is retried like BUSY until the op's deadline.
		v.m.retry(v.m.busy())
		p.lastErr = api.StatusError(h.Status, h.Hint)
		if h.Status == api.StatusBusy {
			p.lastErr = api.ErrBusy
		} else if p.stale++; p.stale > maxStaleRetries {
			p.finish(p.lastErr) // not a stale size after all (~10 s of heartbeats)
			return
		}
		p.busy++
		d := min(busyBase<<min(p.busy, 20), busyMax)
		time.AfterFunc(jitter(d), p.attempt)
	case api.StatusNoSpace, api.StatusIOError:
		// This replica's disk cannot take it; another member's may (the
		// copyset elects a leader elsewhere). Only when every member of a
		// round answered so is it the copyset's answer.
		v.m.retry(v.m.notLeader())
		p.lastErr = api.StatusError(h.Status, h.Hint)
		p.hops = 0
		r := v.routes.copyset(p.cs)
		if r != nil {
			r.leader.CompareAndSwap(p.target, 0)
		}
		p.fails++
		if !slices.Contains(p.diskErr, p.target) {
			p.diskErr = append(p.diskErr, p.target)
		}
		// A majority of the replicas stopped on their disks: the copyset cannot
		// commit anything (its last leader, if any, cannot reach a quorum and
		// never answers a disk error itself), so this is its answer.
		if r == nil || 2*len(p.diskErr) > len(r.members) {
			p.finish(p.lastErr)
			return
		}
		p.moveOn(r)
	case api.StatusMiscompare:
		p.finish(&MiscompareError{Offset: int64(h.Hint)})
	case api.StatusFenced:
		v.stop(api.ErrFenced)
		p.finish(api.StatusError(h.Status, h.Hint))
	default:
		p.finish(api.StatusError(h.Status, h.Hint))
	}
}

// attemptHint retries at a redirect target, which may not be in the member list
// the client has (a membership change it has not seen): then the address must be
// known, else the routes are refreshed first.
func (p *piece) attemptHint() {
	v := p.op.v
	if err := v.usable(); err != nil {
		p.finish(err)
		return
	}
	if v.now() >= p.op.deadline {
		p.finish(p.timeoutErr())
		return
	}
	if v.routes.addr(p.target) == "" {
		v.routes.refresh(p.attempt)
		return
	}
	p.dispatch()
}

// connFailed: the target could not be reached or did not answer in time.
func (p *piece) connFailed(err error) {
	p.lastErr = err
	p.hops = 0
	v := p.op.v
	r := v.routes.copyset(p.cs)
	if r != nil {
		r.leader.CompareAndSwap(p.target, 0)
	}
	p.fails++
	p.moveOn(r)
}

// moveOn tries the next member after a short backoff, or, when every member
// failed in a row, refreshes the routes from the MDS and starts a new round.
func (p *piece) moveOn(r *copysetRoute) {
	if r == nil || p.fails >= len(r.members) {
		p.afterRound(r)
		return
	}
	p.target = r.next(p.target)
	time.AfterFunc(jitter(connRetryBase), p.attempt)
}

func (p *piece) afterRound(r *copysetRoute) {
	p.fails, p.diskErr = 0, p.diskErr[:0]
	p.rounds++
	p.target = 0
	d := jitter(min(roundBackoff<<min(p.rounds-1, 10), maxBackoff))
	v := p.op.v
	v.routes.refresh(func() { time.AfterFunc(d, p.attempt) })
}

// finish completes the piece.
func (p *piece) finish(err error) {
	p.buf = nil
	if p.seq != 0 {
		p.op.v.seqs[p.cs].release(p.seq)
	}
	if err != nil && p.op.op == api.OpFence {
		err = fmt.Errorf("copyset %d: %w", p.cs, err)
	}
	p.op.pieceDone(err)
}

// jitter returns a duration uniformly in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// flushTracker lets a flush wait for the writes submitted before it. Writes are
// counted per generation; a flush closes the current generation and waits until
// no write of an older or equal generation is in flight.
//
// INVARIANT: pending holds only generations with a nonzero count; a waiter for
// generation g is released once no key <= g is in pending.
type flushTracker struct {
	mu      sync.Mutex
	gen     uint64
	pending map[uint64]int
	waiters []flushWaiter
}

type flushWaiter struct {
	gen  uint64
	done func(error)
}

func (f *flushTracker) begin() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending == nil {
		f.pending = make(map[uint64]int)
	}
	f.pending[f.gen]++
	return f.gen
}

func (f *flushTracker) end(gen uint64) {
	f.mu.Lock()
	f.pending[gen]--
	if f.pending[gen] > 0 {
		f.mu.Unlock()
		return
	}
	delete(f.pending, gen)
	var ready []func(error)
	keep := f.waiters[:0]
	for _, w := range f.waiters {
		if f.drainedLocked(w.gen) {
			ready = append(ready, w.done)
		} else {
			keep = append(keep, w)
		}
	}
	clear(f.waiters[len(keep):])
	f.waiters = keep
	f.mu.Unlock()
	for _, done := range ready {
		done(nil)
	}
}

func (f *flushTracker) drainedLocked(gen uint64) bool {
	for g := range f.pending {
		if g <= gen {
			return false
		}
	}
	return true
}

func (f *flushTracker) flush(done func(error)) {
	f.mu.Lock()
	g := f.gen
	f.gen++
	if f.drainedLocked(g) {
		f.mu.Unlock()
		done(nil)
		return
	}
	f.waiters = append(f.waiters, flushWaiter{gen: g, done: done})
	f.mu.Unlock()
}

// transferAllowance stretches one attempt's timeout for large pieces, at a
// pessimistic 16 MiB/s, so that a short IOTimeout (which bounds how long a
// paused or partitioned leader can stall a 4 KiB IO) never aborts a large
// transfer that is merely slow.
func transferAllowance(n int64) time.Duration { return time.Duration(n) * (time.Second / (16 << 20)) }
