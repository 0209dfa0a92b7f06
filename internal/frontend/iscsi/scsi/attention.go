package scsi

import (
	"sync"
	"sync/atomic"
)

// Unit attentions (SAM-5 5.14, SPC-4 5.14): conditions the device reports once
// to each I_T nexus, on the next command, so that initiators learn of events
// another initiator (or the operator) caused: a reset, a new capacity.
var (
	senseResetOccurred   = Sense{Key: KeyUnitAttention, ASC: 0x29, ASCQ: 0x03} // BUS DEVICE RESET FUNCTION OCCURRED
	senseCapacityChange  = Sense{Key: KeyUnitAttention, ASC: 0x2a, ASCQ: 0x09} // CAPACITY DATA HAS CHANGED
	senseCommandsCleared = Sense{Key: KeyUnitAttention, ASC: 0x2f, ASCQ: 0x00} // COMMANDS CLEARED BY ANOTHER INITIATOR
)

// maxPendingAttentions bounds one nexus's queue; a repeated condition is
// queued once.
const maxPendingAttentions = 8

// Group is what the LUs of one export share in this process. Each LU is one
// I_T nexus (one iSCSI session), so the group is the set of nexuses a unit
// attention is raised on.
type Group struct {
	mu  sync.Mutex
	lus map[*LU]struct{}
}

// NewGroup returns an empty group.
func NewGroup() *Group { return &Group{lus: map[*LU]struct{}{}} }

// Len is the number of LUs (nexuses) open in the group.
func (g *Group) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.lus)
}

func (g *Group) join(lu *LU) {
	g.mu.Lock()
	g.lus[lu] = struct{}{}
	g.mu.Unlock()
}

func (g *Group) leave(lu *LU) {
	g.mu.Lock()
	delete(g.lus, lu)
	g.mu.Unlock()
}

// members returns the group's LUs.
func (g *Group) members() []*LU {
	g.mu.Lock()
	defer g.mu.Unlock()
	lus := make([]*LU, 0, len(g.lus))
	for lu := range g.lus {
		lus = append(lus, lu)
	}
	return lus
}

// raise queues s on every nexus of the group.
func (g *Group) raise(s Sense) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for lu := range g.lus {
		lu.attend(s)
	}
}

// attentions is one nexus's queue of pending unit attentions.
type attentions struct {
	blocks atomic.Uint64 // the capacity last seen by this nexus, in blocks
	queued atomic.Int32  // len(pending), read without the lock on every command

	mu      sync.Mutex
	pending []Sense
}

// attend queues s unless the same condition is pending already.
func (lu *LU) attend(s Sense) {
	a := &lu.ua
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.pending {
		if p.ASC == s.ASC && p.ASCQ == s.ASCQ {
			return
		}
	}
	if len(a.pending) < maxPendingAttentions {
		a.pending = append(a.pending, s)
		a.queued.Store(int32(len(a.pending)))
	}
}

// attention returns the oldest pending unit attention of this nexus and
// clears it, or nil. A capacity that changed since this nexus last looked
// is queued first.
func (lu *LU) attention() *Sense {
	a := &lu.ua
	if blocks := lu.blocks(); a.blocks.Swap(blocks) != blocks {
		lu.attend(senseCapacityChange)
	}
	if a.queued.Load() == 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pending) == 0 {
		return nil
	}
	s := a.pending[0]
	a.pending = a.pending[1:]
	a.queued.Store(int32(len(a.pending)))
	return &s
}

// Reset is a LOGICAL UNIT RESET or a target reset received through this
// nexus: every nexus of the group, this one included, gets a unit attention
// (SAM-5 6.3.3; libiscsi's MultipathIO.Reset checks every path).
// It also drops an SPC-2 reservation, whichever nexus holds it (SPC-2
// 5.5.1).
func (lu *LU) Reset() {
	_ = lu.ReleaseSPC2(true) // unreachable store: nothing better to do in a reset
	lu.group.raise(senseResetOccurred)
}

// Close takes this nexus out of its group (the session ended).
func (lu *LU) Close() { lu.group.leave(lu) }

// reportsAttention says whether a command reports (and clears) a pending unit
// attention: every command but INQUIRY and REPORT LUNS (SPC-4 5.14).
func (c *Command) reportsAttention() bool {
	return c.kind != kInquiry && c.kind != kReportLuns
}
