package nvmfhost

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// Queue runs many commands at once on one connected Conn: Submit may be
// called from any number of goroutines, up to the queue's size at a time
// (more wait for a free command id). One goroutine reads the controller's
// PDUs and completes the commands, out of order.
type Queue struct {
	c    *Conn
	free chan uint16 // command ids not in flight

	mu      sync.Mutex
	pending map[uint16]*call
	err     error // the first read or protocol error; ends the queue
	done    chan struct{}
}

type call struct {
	out  []byte // host-to-controller data
	in   []byte // controller-to-host buffer
	got  int    // bytes of in received
	res  Result
	err  error
	done chan struct{}
}

// Pipeline makes a Queue of c, whose Connect has completed, with at most
// depth commands in flight (at most its sqsize-1). c must not be used
// directly afterwards.
func (c *Conn) Pipeline(depth int) *Queue {
	q := &Queue{c: c, free: make(chan uint16, depth), pending: map[uint16]*call{}, done: make(chan struct{})}
	for i := range depth {
		q.free <- uint16(i + 1)
	}
	go q.readLoop()
	return q
}

// Close closes the connection and fails the commands in flight.
func (q *Queue) Close() error {
	err := q.c.Close()
	<-q.done
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
	case <-q.done:
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
	q.mu.Unlock()
	if err := q.c.WritePDU(q.c.capsule(sqe, out, inCapsule, len(in))); err != nil {
		q.fail(err)
	}
	<-cl.done
	q.free <- cid
	return cl.res, cl.err
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
	}
	for cid, cl := range q.pending {
		cl.err = q.err
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
	q.mu.Unlock()
	if cl != nil {
		cl.res = r
		close(cl.done)
	}
}

func (q *Queue) readLoop() {
	defer close(q.done)
	for {
		if err := q.readOne(); err != nil {
			q.fail(err)
			return
		}
	}
}

func (q *Queue) readOne() error {
	p, err := q.c.ReadPDU()
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
		return q.c.WritePDU(b)
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
		cl.got += copy(cl.in[off:], p.Data)
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
