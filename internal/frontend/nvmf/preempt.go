package nvmf

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/reservation"
)

// Preempt and Abort (NVM Express base spec 2.0, 8.19: Reservation Acquire
// with RACQA 010b): besides preempting, the commands the preempted hosts'
// controllers are processing on the namespace are aborted, completed with
// Command Aborted due to Preempt and Abort. The store marks the preempted
// registrations' attentions Abort (reservation.State.AbortedFor), so every
// access node learns of it from the state it reads:
//   - on the access node that ran the Acquire, its preempted controllers'
//     commands are aborted at once and the Acquire completes only when none
//     of them is still in the backend (Server.abortPreempted): nothing they
//     sent writes after it;
//   - another access node aborts them when it reads the state
//     (controller.resvAttentions: every Config.ReservationCheck).
//
// A command is aborted from its reservation check (io) to its answer: one
// not yet in the backend never goes there, one in it is answered
// scPreemptAbort when it leaves. One waiting for its data from the host is
// checked against the state when the data is in, like any later command.

// scPreemptAbort is Command Aborted due to Preempt and Abort (generic
// status 1Bh). Without DNR: a retry meets the reservation as it now is.
const scPreemptAbort = 0x01b

// errPreemptAborted is the error an aborted command completes with.
var errPreemptAborted = errors.New("nvmf: command aborted due to preempt and abort")

// ioFence aborts the commands of one controller's namespace. Its commands
// count themselves in the current epoch while in the backend; an abort
// retires the epoch (its commands are aborted) and starts a new one.
type ioFence struct {
	// gen counts aborts: a command that read the reservation state before
	// an abort finished is aborted even if it enters the epoch after it.
	gen   atomic.Uint64
	epoch atomic.Pointer[ioEpoch]

	mu      sync.Mutex
	drained <-chan struct{} // of the last abort (nil: none)
}

type ioEpoch struct {
	// n counts its commands in the backend, plus one until it is retired
	// (and the one before it drained).
	n       atomic.Int64
	aborted atomic.Bool
	once    sync.Once
	done    chan struct{} // closed when n reaches 0
}

func newEpoch() *ioEpoch {
	e := &ioEpoch{done: make(chan struct{})}
	e.n.Store(1)
	return e
}

func (e *ioEpoch) leave() {
	if e.n.Add(-1) == 0 {
		e.once.Do(func() { close(e.done) })
	}
}

// enter counts a command going to the backend in the current epoch; it
// reports false (the command is aborted; it is not counted) if an abort
// came after gen was read, before its reservation check.
func (f *ioFence) enter(gen uint64) (*ioEpoch, bool) {
	e := f.epoch.Load()
	if e == nil {
		f.epoch.CompareAndSwap(nil, newEpoch())
		e = f.epoch.Load()
	}
	e.n.Add(1)
	// After the Add: an abort that retired e before this load of gen is
	// seen here; one after it waits for this command.
	if f.gen.Load() != gen || e.aborted.Load() {
		e.leave()
		return nil, false
	}
	return e, true
}

// abort aborts the commands in the backend and those that read the
// reservation state before it; the channel closes once none of them, nor
// of an earlier abort, is in the backend.
func (f *ioFence) abort() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen.Add(1)
	old := f.epoch.Swap(newEpoch())
	if old == nil {
		old = newEpoch()
	}
	old.aborted.Store(true)
	if prev := f.drained; prev != nil {
		go func() { <-prev; old.leave() }()
	} else {
		old.leave()
	}
	f.drained = old.done
	return old.done
}

// lastAbort returns the channel of the last abort, nil if none.
func (f *ioFence) lastAbort() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drained
}

// abortPreempted aborts the commands of this node's controllers whose host
// st's Preempt and Abort (the change st.Seq) preempted, on volume, and
// waits until none of them is in the backend, however long that takes (a
// basalt volume's IO may retry for a minute; answering before would let a
// preempted write land after the Acquire), or until the server shuts down.
// Their Reservation Notification log entries are recorded on the way.
func (s *Server) abortPreempted(volume string, st *reservation.State) {
	ctrls := s.controllers(false)
	var waits []<-chan struct{}
	for _, c := range ctrls {
		if !st.AbortedFor(c.hostNexus(), st.Seq-1) {
			continue
		}
		for _, ns := range c.namespaces() {
			if ns == nil || ns.volume != volume {
				continue
			}
			c.mu.Lock()
			if !ns.resvSeen {
				// Never looked at: this change is its news.
				ns.resvSeen, ns.resvSeq = true, st.Seq-1
			}
			c.mu.Unlock()
			c.resvAttentions(ns, st)
			// The abort resvAttentions made, or the watcher's if it got
			// there first.
			if d := ns.fence.lastAbort(); d != nil {
				waits = append(waits, d)
			}
		}
	}
	done := s.conns.Context().Done()
	for _, d := range waits {
		select {
		case <-d:
		case <-done:
			return
		}
	}
}
