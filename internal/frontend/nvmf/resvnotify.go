package nvmf

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/basalt-storage/basalt/internal/reservation"
)

// Reservation notifications (NVM Express base spec 2.0, 8.19.6). When
// another host's reservation command preempts this host's registration,
// releases or preempts a reservation this host is registered for, the
// reservation store raises an attention for this host (reservation.State.
// Attentions: the iSCSI target's unit attentions, ASC 2A). Each I/O
// controller turns the attentions for its host into Reservation
// Notification log entries (log page 80h: one entry per read, oldest
// first) — unless the namespace's Reservation Notification Mask (feature
// 82h) masks that type — and completes an Asynchronous Event Request with
// type I/O command specific (6), information 00h (Reservation Log Page
// Available), log page 80h; the next waits until the host read the log
// without RAE. The attentions are found by watchReservations, which reads
// the namespaces' states (through the store's cache) every
// Config.ReservationCheck, and at once after a reservation command on this
// node; a namespace whose host holds no registration is read only every
// tenth round (it can get an attention only after registering, through
// another access node).

// aenResvLog is the completion dword 0 of an Asynchronous Event Request
// reporting Reservation Notification log entries: type I/O command
// specific status (6), information 0x00, log page 0x80.
const aenResvLog = 0x6 | 0x00<<8 | logResvNotify<<16

// Reservation Notification log page types, and the mask bits of feature
// 82h (bit n masks type n).
const (
	resvRegPreempted  = 1
	resvResReleased   = 2
	resvResPreempted  = 3
	maxResvLogEntries = 255 // "Number of Available Log Pages" is one byte
	featResvMask      = 0x82
	featResvPersist   = 0x83
)

// resvEntry is one Reservation Notification log entry.
type resvEntry struct {
	count uint64 // Log Page Count
	typ   byte
	nsid  uint32
}

// resvType maps a reservation attention (ASC 2A's ASCQ) to a log page type.
func resvType(ascq byte) byte {
	switch ascq {
	case reservation.RegistrationsPreempted:
		return resvRegPreempted
	case reservation.ReservationsReleased:
		return resvResReleased
	case reservation.ReservationsPreempted:
		return resvResPreempted
	}
	return 0
}

// resvLogPage returns the oldest Reservation Notification log entry of c
// (all zeros: none) and, when pop, removes it.
func (c *controller) resvLogPage(pop bool) []byte {
	page := make([]byte, 64)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.resvLog) == 0 {
		return page
	}
	e := c.resvLog[0]
	binary.LittleEndian.PutUint64(page[0:], e.count)
	page[8] = e.typ
	page[9] = byte(len(c.resvLog) - 1) // available after this one
	binary.LittleEndian.PutUint32(page[12:], e.nsid)
	if pop {
		c.resvLog = c.resvLog[1:]
	}
	return page
}

// resvAttentions records the attentions for c's host in st, raised after
// the last ones ns saw, and delivers a notice if it can.
func (c *controller) resvAttentions(ns *namespace, st *reservation.State) {
	nexus := c.hostNexus()
	c.mu.Lock()
	if !ns.resvSeen {
		ns.resvSeen, ns.resvSeq = true, st.Seq // older attentions are not this controller's news
	}
	atts := st.AttentionsFor(nexus, ns.resvSeq)
	if st.AbortedFor(nexus, ns.resvSeq) {
		ns.fence.abort() // a Preempt and Abort preempted the host (preempt.go)
	}
	ns.resvSeq = st.Seq
	ns.resvActive = st.Registration(nexus) != nil
	for _, ascq := range atts {
		typ := resvType(ascq)
		if typ == 0 || ns.resvMask&(1<<typ) != 0 {
			continue
		}
		c.resvCount++
		if c.resvCount == 0 {
			c.resvCount = 1 // the count wraps to 1, never 0 (0: empty)
		}
		if len(c.resvLog) == maxResvLogEntries {
			c.resvLog = c.resvLog[1:] // the oldest is lost: the host sees a gap in the counts
		}
		c.resvLog = append(c.resvLog, resvEntry{count: c.resvCount, typ: typ, nsid: ns.nsid})
		c.s.log.Info("nvmf: reservation notification", "cntlid", c.id, "nsid", ns.nsid, "volume", ns.volume, "type", typ)
	}
	d, dw0 := c.deliverLocked()
	c.mu.Unlock()
	if d != nil {
		d.c.complete(d, scSuccess, dw0, 0)
	}
}

// refreshReservations reads the reservation state of the namespaces of
// every I/O controller (all of them when full, else those whose host was
// registered at the last read or that were never read) and records new
// attentions.
func (s *Server) refreshReservations(full bool) {
	ctrls := s.controllers(false)
	states := map[string]*reservation.State{} // one read per volume per round
	for _, c := range ctrls {
		for _, ns := range c.namespaces() {
			if ns == nil {
				continue
			}
			c.mu.Lock()
			skip := c.dead || (!full && ns.resvSeen && !ns.resvActive)
			c.mu.Unlock()
			if skip {
				continue
			}
			st, ok := states[ns.volume]
			if !ok {
				ctx, cancel := context.WithTimeout(s.conns.Context(), resvReadTimeout)
				var err error
				st, err = s.cfg.Reservations.Read(ctx, ns.volume)
				cancel()
				if err != nil {
					s.log.Warn("nvmf: reading reservations to look for notifications", "volume", ns.volume, "err", err)
					continue
				}
				states[ns.volume] = st
			}
			c.resvAttentions(ns, st)
		}
	}
}

// watchReservations runs refreshReservations every Config.ReservationCheck
// (every tenth round in full) and when a reservation command on this node
// kicks it, until the server shuts down.
func (s *Server) watchReservations() {
	t := time.NewTicker(s.cfg.ReservationCheck)
	defer t.Stop()
	done := s.conns.Context().Done()
	for round := 0; ; round++ {
		full := round%10 == 0
		select {
		case <-done:
			return
		case <-t.C:
		case <-s.resvKick:
			full = true
		}
		s.refreshReservations(full)
	}
}

// kickReservations asks watchReservations for a full round now.
func (s *Server) kickReservations() {
	select {
	case s.resvKick <- struct{}{}:
	default:
	}
}

// resvFeature runs Get/Set Features 82h (Reservation Notification Mask) and
// 83h (Reservation Persistence) for namespace nsid (82h: FFFFFFFFh sets
// every namespace). It returns the status and dword 0. Persistence follows
// the state's PTPL; the state is in the MDS and persists whatever PTPL says,
// so Set Features 83h is refused as Feature Not Changeable: Reservation
// Register's CPTPL sets it.
func (c *conn) resvFeature(set bool, fid, nsid, v uint32) (uint16, uint32) {
	ctrl := c.ctrl
	if ctrl.discovery {
		return scInvalidField | dnr, 0
	}
	if fid == featResvMask && set && nsid == 0xffffffff {
		ctrl.mu.Lock()
		defer ctrl.mu.Unlock()
		for _, ns := range ctrl.namespaces() {
			if ns != nil {
				ns.resvMask = v & 0xe
			}
		}
		return scSuccess, 0
	}
	ns := ctrl.namespace(nsid)
	if ns == nil {
		return scInvalidNS | dnr, 0
	}
	if fid == featResvMask {
		ctrl.mu.Lock()
		defer ctrl.mu.Unlock()
		if set {
			ns.resvMask = v & 0xe
		}
		return scSuccess, ns.resvMask
	}
	if set {
		return scFeatureNotChangeable | dnr, 0
	}
	ctx, cancel := context.WithTimeout(c.s.conns.Context(), resvReadTimeout)
	defer cancel()
	st, err := c.s.cfg.Reservations.Read(ctx, ns.volume)
	if err != nil {
		return scNSNotReady, 0
	}
	if st.APTPL {
		return scSuccess, 1
	}
	return scSuccess, 0
}
