package scsi

import (
	"context"
	"encoding/binary"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/reservation"
)

// Persistent reservations (SPC-4 5.13, 6.15, 6.16): the state lives in a
// reservation.Store shared by every access node (the MDS's); this file only
// translates PERSISTENT RESERVE IN/OUT to and from it, checks each command
// against the reservation, and turns the attentions a change raised into
// unit attentions of this nexus.

const (
	opPersistentReserveIn  = 0x5e
	opPersistentReserveOut = 0x5f

	// StatusReservationConflict is SAM-5's RESERVATION CONFLICT.
	StatusReservationConflict = 0x18

	// prReadTimeout bounds one read of the state for a command (commands
	// of the session wait behind it: the MDS is unreachable, the command
	// gets NOT READY, BECOMING READY and the initiator retries).
	prReadTimeout = 10 * time.Second
	// maxPROutParams bounds a PERSISTENT RESERVE OUT parameter list.
	maxPROutParams = 4096
)

// prTimeout bounds one PERSISTENT RESERVE OUT's call to the store (a
// variable for tests).
var prTimeout = 30 * time.Second

// PR is what an LU needs for persistent reservations: the store, the
// volume's name in it, and the I_T nexus the LU serves.
type PR struct {
	Store  reservation.Store
	Volume string
	Nexus  reservation.Nexus
	// AbortTasks, if set, aborts every command of the nexus in flight but
	// except (nil: none spared), as ABORT TASK SET would with TAS 0: none
	// of them is answered. A PREEMPT AND ABORT that preempted the nexus
	// calls it (SPC-4 5.13.11.2.4). It returns how many it aborted and a
	// channel closed once none of them can still reach the backend (which
	// a reservation command never does: Command.Reserves; not waited for,
	// as that one may itself be a PREEMPT AND ABORT waiting for the
	// caller's). It may be called on any goroutine.
	AbortTasks func(except *Command) (int, <-chan struct{})
}

// prNexus is the LU's view of the attentions already turned into unit
// attentions.
type prNexus struct {
	mu   sync.Mutex
	seen bool
	seq  uint64 // the state's Seq this nexus last looked at
	// aborted is closed once the commands the last PREEMPT AND ABORT of
	// this nexus aborted left the backend (nil: none).
	aborted <-chan struct{}
}

// Reserves reports whether c changes the reservations (PERSISTENT RESERVE
// OUT, RESERVE(6), RELEASE(6)): it runs in the store, never in the backend.
func (c *Command) Reserves() bool {
	return c.kind == kPROut || c.kind == kReserve6 || c.kind == kRelease6
}

// writes reports whether the command changes the LU's data.
func (c *Command) writes() bool {
	switch c.kind {
	case kWrite, kWriteSame, kCompareAndWrite, kUnmap:
		return true
	}
	return false
}

// access is what c does to the medium, for reservation conflicts (SPC-4
// table 209, SBC-3 table 13).
func (c *Command) access() reservation.Access {
	switch c.kind {
	case kRead, kVerify, kModeSense, kGetLBAStatus, kPrefetch:
		return reservation.AccessRead
	case kWrite, kWriteSame, kCompareAndWrite, kUnmap, kSync, kModeSelect:
		return reservation.AccessWrite
	case kNone:
		if c.Op == opStartStopUnit {
			return reservation.AccessWrite
		}
	case kInquiry, kReportLuns, kRequestSense, kRelease6:
		// Allowed under another nexus's SPC-2 reservation (SPC-2 5.5.1).
		return reservation.AccessExempt
	}
	return reservation.AccessNone
}

// prState returns the volume's reservation state and until when it is
// known current (zero: always, the store is this process's), after queuing
// the unit attentions raised for this nexus since it last looked, and
// aborting its commands in flight but cur if a PREEMPT AND ABORT preempted
// it meanwhile.
func (lu *LU) prState(cur *Command) (*reservation.State, time.Time, *Sense) {
	f, fresh := lu.pr.Store.(reservation.FreshReader)
	if fresh {
		// Every command asks: no context (and timer) to make while the
		// copy is fresh.
		if st, expires, ok := f.Fresh(lu.pr.Volume); ok {
			lu.prAttend(st, cur)
			return st, expires, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), prReadTimeout)
	defer cancel()
	st, err := lu.pr.Store.Read(ctx, lu.pr.Volume)
	if err != nil {
		return nil, time.Time{}, sense(senseBecomingReady)
	}
	lu.prAttend(st, cur)
	var expires time.Time
	if fresh {
		expires = time.Now() // a fresh copy, of an age not known here
	}
	return st, expires, nil
}

// prAttend queues the attentions st holds for this nexus that it has not
// seen, and aborts its commands but cur if st says a PREEMPT AND ABORT
// preempted it; the first state an LU sees only sets where it starts.
func (lu *LU) prAttend(st *reservation.State, cur *Command) {
	p := &lu.prSeen
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.seen {
		p.seen, p.seq = true, st.Seq
		return
	}
	if st.Seq <= p.seq {
		return
	}
	for _, q := range st.AttentionsFor(lu.pr.Nexus, p.seq) {
		lu.attend(Sense{Key: KeyUnitAttention, ASC: 0x2a, ASCQ: q})
	}
	if st.AbortedFor(lu.pr.Nexus, p.seq) && lu.pr.AbortTasks != nil {
		// Under p.mu: the PREEMPT AND ABORT's own sweep (abortPreempted)
		// finds p.aborted set once it gets the lock.
		n, done := lu.pr.AbortTasks(cur)
		p.aborted = done
		if n > 0 {
			// TAS is 0 (control mode page): the aborted commands get no
			// status, their initiator this unit attention (SAM-5 5.6).
			lu.attend(senseCommandsCleared)
		}
	}
	p.seq = st.Seq
}

// abortPreempted aborts the commands in flight of this process's nexuses of
// the volume that st's PREEMPT AND ABORT preempted, and waits until none of
// them can still reach the backend. Nexuses on other access nodes abort
// theirs when their node reads st (recheckAfter).
func (lu *LU) abortPreempted(st *reservation.State) {
	for _, o := range lu.group.members() {
		if o == lu || o.pr == nil || !st.AbortedFor(o.pr.Nexus, st.Seq-1) {
			continue
		}
		o.prSeen.mu.Lock()
		if !o.prSeen.seen {
			// A session that has not run a command yet (one that
			// reinstated the nexus): what it has in flight predates st.
			o.prSeen.seen, o.prSeen.seq = true, st.Seq-1
		}
		o.prSeen.mu.Unlock()
		o.prAttend(st, nil)
		o.prSeen.mu.Lock()
		done := o.prSeen.aborted
		o.prSeen.mu.Unlock()
		if done != nil {
			// However long it takes (a basalt volume's IO retries for up
			// to its client's OpTimeout), not bounded by ctx: answering
			// GOOD first would let a preempted write land afterwards.
			<-done
		}
	}
}

// recheckAfter wraps the done of command c, checked against a copy of the
// reservations current until expires: when c completes later, the state is
// read again first, so that a PREEMPT AND ABORT made through another access
// node meanwhile aborts c (its result is dropped) rather than c being
// answered after the PREEMPT AND ABORT completed.
func (lu *LU) recheckAfter(expires time.Time, done func(Result)) func(Result) {
	return func(r Result) {
		if time.Now().Before(expires) {
			done(r)
			return
		}
		go func() { // off the backend's completion goroutine: this may read the MDS
			lu.prState(nil)
			done(r)
		}()
	}
}

// persistentReserveIn answers PERSISTENT RESERVE IN (SPC-4 6.15).
func (lu *LU) persistentReserveIn(c *Command, st *reservation.State) Result {
	var d []byte
	switch c.prSA {
	case 0: // READ KEYS
		d = make([]byte, 8, 8+8*len(st.Registrations))
		binary.BigEndian.PutUint32(d[0:], st.Generation)
		for _, r := range st.Registrations {
			d = binary.BigEndian.AppendUint64(d, r.Key)
		}
		binary.BigEndian.PutUint32(d[4:], uint32(len(d)-8))
	case 1: // READ RESERVATION
		d = make([]byte, 8)
		binary.BigEndian.PutUint32(d[0:], st.Generation)
		if st.Reserved {
			binary.BigEndian.PutUint32(d[4:], 16)
			r := make([]byte, 16)
			binary.BigEndian.PutUint64(r[0:], st.HolderKey())
			r[13] = byte(st.Type) // scope 0: LU_SCOPE
			d = append(d, r...)
		}
	case 2: // REPORT CAPABILITIES
		d = make([]byte, 8)
		binary.BigEndian.PutUint16(d[0:], 8)
		d[2] = 0x04 | 0x01 // ATP_C, PTPL_C (SIP_C 0: SPEC_I_PT is not supported)
		d[3] = 0x80        // TMV: the type mask is valid; ALLOW COMMANDS 0
		if st.APTPL {
			d[3] |= 0x01 // PTPL_A
		}
		d[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02 // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX
		d[5] = 0x01                             // EX_AC_AR
	case 3: // READ FULL STATUS
		d = make([]byte, 8)
		binary.BigEndian.PutUint32(d[0:], st.Generation)
		for _, r := range st.Registrations {
			e := make([]byte, 24)
			binary.BigEndian.PutUint64(e[0:], r.Key)
			if r.Nexus.AllTargetPorts {
				e[12] |= 0x02
			}
			if st.IsHolderRegistration(r) {
				e[12] |= 0x01
				e[13] = byte(st.Type)
			}
			binary.BigEndian.PutUint16(e[18:], r.Nexus.TargetPort)
			tid := TransportID(r.Nexus.Initiator)
			binary.BigEndian.PutUint32(e[20:], uint32(len(tid)))
			d = append(append(d, e...), tid...)
		}
		binary.BigEndian.PutUint32(d[4:], uint32(len(d)-8))
	default:
		return check(invalidField(1))
	}
	return good(cut(d, c.alloc))
}

// TransportID is an iSCSI initiator port's TransportID (SPC-4 7.6.4.6,
// format 01b: the initiator port name, "NAME,i,0xISID"), padded to a
// multiple of four bytes.
func TransportID(port string) []byte {
	n := len(port) + 1 // with its NUL
	n = max((n+3)&^3, 20)
	d := make([]byte, 4+n)
	d[0] = 0x40 | 0x05 // FORMAT CODE 01b, PROTOCOL IDENTIFIER iSCSI
	binary.BigEndian.PutUint16(d[2:], uint16(n))
	copy(d[4:], port)
	return d
}

// persistentReserveOut runs PERSISTENT RESERVE OUT (SPC-4 6.16) through the
// store.
func (lu *LU) persistentReserveOut(c *Command, p []byte) Result {
	if len(p) < 24 {
		return check(sense(senseParamLenError))
	}
	a := reservation.Action{
		ServiceAction: reservation.ServiceAction(c.prSA),
		Type:          reservation.Type(c.prType),
		Key:           binary.BigEndian.Uint64(p[0:]),
		SAKey:         binary.BigEndian.Uint64(p[8:]),
		SpecIPT:       p[20]&0x08 != 0,
		AllTargetPort: p[20]&0x04 != 0,
		APTPL:         p[20]&0x01 != 0,
	}
	if len(p) != 24 && !a.SpecIPT {
		return check(sense(senseParamLenError))
	}
	switch a.ServiceAction {
	case reservation.Reserve, reservation.Release, reservation.Preempt, reservation.PreemptAndAbort:
		if c.prScope != 0 { // only LU_SCOPE
			return check(invalidField(2))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), prTimeout)
	defer cancel()
	st, err := lu.pr.Store.Apply(ctx, lu.pr.Volume, lu.pr.Nexus, a)
	if err != nil {
		e := reservation.AsError(err)
		if e == nil {
			return check(sense(senseBecomingReady))
		}
		switch e.Code {
		case reservation.CodeConflict:
			return Result{Status: StatusReservationConflict}
		case reservation.CodeInvalidCDB:
			return check(invalidField(e.Field))
		case reservation.CodeInvalidParam:
			return check(invalidParamField(e.Field))
		case reservation.CodeInvalidRelease:
			return check(&Sense{Key: KeyIllegalRequest, ASC: 0x26, ASCQ: 0x04})
		case reservation.CodeNoResources:
			return check(&Sense{Key: KeyIllegalRequest, ASC: 0x55, ASCQ: 0x04})
		}
		return check(sense(senseInternalError))
	}
	// This nexus raised no attention for itself; take what others raised.
	lu.prAttend(st, c)
	if a.ServiceAction == reservation.PreemptAndAbort {
		lu.abortPreempted(st)
	}
	return good(nil)
}

// spc2 runs RESERVE(6) or RELEASE(6) (sa ReserveSPC2 or ReleaseSPC2), or
// with ResetSPC2 drops the SPC-2 reservation (a reset), through the store.
func (lu *LU) spc2(sa reservation.ServiceAction) Result {
	ctx, cancel := context.WithTimeout(context.Background(), prTimeout)
	defer cancel()
	st, err := lu.pr.Store.Apply(ctx, lu.pr.Volume, lu.pr.Nexus, reservation.Action{ServiceAction: sa})
	if err != nil {
		if e := reservation.AsError(err); e != nil && e.Code == reservation.CodeConflict {
			return Result{Status: StatusReservationConflict}
		}
		return check(sense(senseBecomingReady))
	}
	lu.prAttend(st, nil)
	return good(nil)
}

// ReleaseSPC2 drops an SPC-2 reservation this LU's nexus holds: on I_T
// nexus loss (session end). With all, whichever nexus holds it (LOGICAL
// UNIT RESET, TARGET RESET: SPC-2 5.5.1).
func (lu *LU) ReleaseSPC2(all bool) error {
	if lu.pr == nil {
		return nil
	}
	sa := reservation.ReleaseSPC2
	if all {
		sa = reservation.ResetSPC2
	}
	ctx, cancel := context.WithTimeout(context.Background(), prTimeout)
	defer cancel()
	_, err := lu.pr.Store.Apply(ctx, lu.pr.Volume, lu.pr.Nexus, reservation.Action{ServiceAction: sa})
	if e := reservation.AsError(err); e != nil && e.Code == reservation.CodeConflict {
		return nil // persistent reservations in use: there is no SPC-2 one
	}
	return err
}

// prNexus is the nexus this LU serves (zero without PR).
func (lu *LU) prNexus() reservation.Nexus {
	if lu.pr == nil {
		return reservation.Nexus{}
	}
	return lu.pr.Nexus
}
