package nvmfhost

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
)

// Queue runs many commands at once on one connected Conn: Submit may be
// called from any number of goroutines, up to the queue's size at a time
// (more wait for a free command id). Commands complete out of order.
//
// Reading: whoever holds rmu reads the controller's PDUs and completes the
// commands. A Submit that finds nobody reading reads itself until its own
// command completes (at queue depth 1 no other goroutine is woken per
// command); it then hands the reading to the queue's reader goroutine if
// other commands are still in flight, which reads while any are.
// Writing: a Submit alone in flight that finds nobody writing writes its
// capsule itself (no hand-off at queue depth 1). With other commands in
// flight it queues the capsule for the queue's writer goroutine, which
// yields once before writing: the Submits that the same batch of
// completions woke queue theirs meanwhile, and one writev carries them all
// (as Linux's initiator sends a batch of requests from its io_work, rather
// than a send per command).
type Queue struct {
	c    *Conn
	free chan uint16 // command ids not in flight

	mu      sync.Mutex
	pending map[uint16]*call
	err     error         // the first read or protocol error; ends the queue
	dead    chan struct{} // closed with err set

	rmu      sync.Mutex    // held by the goroutine reading PDUs
	kick     chan struct{} // wakes the reader goroutine
	stop     chan struct{} // closed by Close: the reader goroutine ends
	stopOnce sync.Once     // Close may be called again (tests and callers' cleanups do)
	done     chan struct{} // closed when the reader goroutine ended

	wmu    sync.Mutex
	wq     [][]byte // PDUs waiting for the writer
	wspare [][]byte
	wbusy  bool          // a goroutine is writing wq, or the writer goroutine is signalled to
	wkick  chan struct{} // wakes the writer goroutine
	wdone  chan struct{} // closed when the writer goroutine ended

	rhdr    [maxHdr]byte            // the PDU header being read (under rmu)
	dataDst func(hdr []byte) []byte // q.c2hDst, bound once
	// filling is the call whose buffer the reader is reading C2HData into
	// (set by c2hDst under mu, cleared by readOne after the read): fail
	// leaves it to the reader, which ends it once the read returned, so
	// Submit never returns while the socket still writes into its buffer.
	filling *call
	filled  bool // under rmu: c2hDst set filling during this read
}

type call struct {
	out      []byte // host-to-controller data
	in       []byte // controller-to-host buffer
	got      int    // bytes of in received
	res      Result
	err      error
	finished bool // under Queue.mu: done is closed
	done     chan struct{}
}

// Pipeline makes a Queue of c, whose Connect has completed, with at most
// depth commands in flight (at most its sqsize-1). c must not be used
// directly afterwards.
func (c *Conn) Pipeline(depth int) *Queue {
	q := &Queue{c: c, free: make(chan uint16, depth), pending: map[uint16]*call{}, dead: make(chan struct{}),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		wkick: make(chan struct{}, 1), wdone: make(chan struct{})}
	for i := range depth {
		q.free <- uint16(i + 1)
	}
	q.dataDst = q.c2hDst
	go q.readLoop()
	go q.writeLoop()
	return q
}

// Close closes the connection and fails the commands in flight.
func (q *Queue) Close() error {
	err := q.c.Close()
	q.fail(net.ErrClosed)
	q.stopOnce.Do(func() { close(q.stop) })
	<-q.done
	<-q.wdone
	return err
}

// Conn is the queue's connection.
func (q *Queue) Conn() *Conn { return q.c }

// ErrClosed: the queue's connection ended.
var ErrClosed = errors.New("nvmfhost: queue closed")

// Submit sends sqe (its CID is set here) and waits for its completion. out
// is the host-to-controller data, sent in the capsule when inCapsule, else
// by R2T; in receives the controller-to-host data.
func (q *Queue) Submit(sqe, out []byte, inCapsule bool, in []byte) (Result, error) {
	var cid uint16
	select {
	case cid = <-q.free:
	case <-q.dead:
		return Result{}, q.failure()
	}
	binary.LittleEndian.PutUint16(sqe[2:], cid)
	cl := &call{out: out, in: in, done: make(chan struct{})}
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		q.free <- cid
		return Result{}, q.err
	}
	q.pending[cid] = cl
	alone := len(q.pending) == 1
	q.mu.Unlock()
	q.send(q.c.capsule(sqe, out, inCapsule, len(in)), alone)
	if q.rmu.TryLock() {
		// Nobody reads: read until this command completes.
		for !q.finished(cl) {
			if err := q.readOne(); err != nil {
				q.fail(err)
				break
			}
		}
		q.rmu.Unlock()
		if q.inFlight() > 0 {
			q.wakeReader()
		}
	}
	// Else the reader completes it: a Submit reading hands over to the
	// reader goroutine when it leaves with commands in flight, and that
	// reads until none is.
	<-cl.done
	q.free <- cid
	return cl.res, cl.err
}

// send writes b: itself when inline (nothing else in flight) and nobody
// writes, else by the writer goroutine; an error ends the queue.
func (q *Queue) send(b []byte, inline bool) {
	q.wmu.Lock()
	q.wq = append(q.wq, b)
	if q.wbusy {
		q.wmu.Unlock() // the writer sends it before letting go
		return
	}
	q.wbusy = true
	if !inline {
		q.wmu.Unlock()
		select {
		case q.wkick <- struct{}{}:
		default:
		}
		return
	}
	q.writeQueued()
}

// writeLoop is the writer goroutine: signalled by send (which set wbusy), it
// lets the goroutines runnable now queue their PDUs first, then writes.
func (q *Queue) writeLoop() {
	defer close(q.wdone)
	for {
		select {
		case <-q.wkick:
		case <-q.stop:
			return
		}
		runtime.Gosched()
		q.wmu.Lock()
		q.writeQueued()
	}
}

// writeQueued writes wq, and what is queued meanwhile, until it is empty;
// called with wmu held and wbusy set, it returns with wmu released and
// wbusy cleared.
func (q *Queue) writeQueued() {
	for len(q.wq) > 0 {
		bufs := q.wq
		q.wq = q.wspare[:0]
		q.wmu.Unlock()
		err := q.c.writeBufs(bufs)
		clear(bufs)
		q.wmu.Lock()
		q.wspare = bufs[:0]
		if err != nil {
			clear(q.wq)
			q.wq = q.wq[:0]
			q.wbusy = false
			q.wmu.Unlock()
			q.fail(err)
			return
		}
	}
	q.wbusy = false
	q.wmu.Unlock()
}

func (q *Queue) wakeReader() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (q *Queue) finished(cl *call) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return cl.finished
}

func (q *Queue) inFlight() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

func (q *Queue) failure() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// fail ends the queue with err: every call in flight fails with it.
func (q *Queue) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err == nil {
		q.err = fmt.Errorf("%w: %v", ErrClosed, err)
		q.c.Close()
		close(q.dead)
	}
	for cid, cl := range q.pending {
		if cl == q.filling {
			continue // the reader ends it after its read (readOne)
		}
		cl.err = q.err
		cl.finished = true
		close(cl.done)
		delete(q.pending, cid)
	}
}

func (q *Queue) lookup(cid uint16) *call {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending[cid]
}

func (q *Queue) finish(cid uint16, r Result) {
	q.mu.Lock()
	cl := q.pending[cid]
	delete(q.pending, cid)
	if cl != nil {
		cl.res = r
		cl.finished = true
		close(cl.done)
	}
	q.mu.Unlock()
}

// readLoop is the reader goroutine: woken by a Submit that stopped reading
// with commands in flight, it reads while any are. After letting go it
// looks again: a Submit that found it reading waits for it.
func (q *Queue) readLoop() {
	defer close(q.done)
	for {
		select {
		case <-q.kick:
		case <-q.stop:
			return
		}
		for q.inFlight() > 0 && q.rmu.TryLock() {
			for q.inFlight() > 0 {
				if err := q.readOne(); err != nil {
					q.fail(err)
					break
				}
			}
			q.rmu.Unlock()
		}
	}
}

// c2hDst is where a C2HData PDU's data goes: straight into its command's
// buffer when the PDU is the next piece of it, else nil (readOne refuses it).
func (q *Queue) c2hDst(h []byte) []byte {
	off, n := int(binary.LittleEndian.Uint32(h[12:])), int(binary.LittleEndian.Uint32(h[16:]))
	q.mu.Lock()
	defer q.mu.Unlock()
	cl := q.pending[binary.LittleEndian.Uint16(h[8:])]
	if cl == nil || off != cl.got || n > len(cl.in)-off {
		return nil
	}
	q.filling, q.filled = cl, true
	return cl.in[off : off+n]
}

func (q *Queue) readOne() error {
	p, err := q.c.readPDU(q.rhdr[:], q.dataDst)
	if q.filled {
		q.filled = false
		q.mu.Lock()
		q.filling = nil
		ended := q.err != nil
		q.mu.Unlock()
		if ended {
			q.fail(nil) // ends the call fail left to this read
			return q.failure()
		}
	}
	if err != nil {
		return err
	}
	h := p.Hdr
	switch p.Type {
	case PDUR2T:
		cid := binary.LittleEndian.Uint16(h[8:])
		cl := q.lookup(cid)
		if cl == nil {
			return fmt.Errorf("R2T for cid %d not in flight", cid)
		}
		b, err := q.c.h2c(cid, binary.LittleEndian.Uint16(h[10:]), cl.out,
			int(binary.LittleEndian.Uint32(h[12:])), int(binary.LittleEndian.Uint32(h[16:])))
		if err != nil {
			return err
		}
		q.send(b, q.inFlight() == 1) // at queue depth 1 with no hand-off, as a capsule
		return nil
	case PDUC2HData:
		cid := binary.LittleEndian.Uint16(h[8:])
		cl := q.lookup(cid)
		if cl == nil {
			return fmt.Errorf("C2HData for cid %d not in flight", cid)
		}
		off := int(binary.LittleEndian.Uint32(h[12:]))
		if off != cl.got || off+len(p.Data) > len(cl.in) {
			return fmt.Errorf("C2HData of %d bytes at %d for cid %d after %d of %d", len(p.Data), off, cid, cl.got, len(cl.in))
		}
		if len(p.Data) > 0 && &p.Data[0] != &cl.in[off] { // else read in place (dataDst)
			copy(cl.in[off:], p.Data)
		}
		cl.got += len(p.Data)
		if p.Flags&FlagSuccess != 0 {
			q.finish(cid, Result{})
		}
		return nil
	case PDUCapsuleRsp:
		cid, r := parseRsp(h)
		if q.lookup(cid) == nil {
			return fmt.Errorf("response for cid %d not in flight", cid)
		}
		q.finish(cid, r)
		return nil
	case PDUC2HTermReq:
		return fmt.Errorf("C2HTermReq FES %#x", binary.LittleEndian.Uint16(h[8:]))
	default:
		return fmt.Errorf("unexpected PDU type %#x", p.Type)
	}
}
