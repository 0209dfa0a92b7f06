package nvmf

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"time"

	"github.com/basalt-storage/basalt/internal/reservation"
)

// NVMe reservations (NVM Express base spec 2.0, 8.19): Reservation Register,
// Report, Acquire and Release over the same reservation.Store as the iSCSI
// target's persistent reservations — one state per volume, in the MDS. NVMe
// registers hosts (by Host Identifier), not I_T nexuses: a host's
// registration covers all its controllers and paths, so its nexus is the
// host identifier toward every target port.

const (
	ioResvRegister = 0x0d
	ioResvReport   = 0x0e
	ioResvAcquire  = 0x11
	ioResvRelease  = 0x15

	scResvConflict = 0x083

	resvReadTimeout = 10 * time.Second
)

// resvTimeout bounds a reservation command's store call (a variable for a
// test: a Preempt and Abort's wait for the backend outlasts it).
var resvTimeout = 30 * time.Second

// nvmeTypes maps an NVMe reservation type (RTYPE 1-6) to SPC-4's.
var nvmeTypes = [7]reservation.Type{0,
	reservation.WriteExclusive, reservation.ExclusiveAccess,
	reservation.WriteExclusiveRegistrantsOnly, reservation.ExclusiveAccessRegistrantsOnly,
	reservation.WriteExclusiveAllRegistrants, reservation.ExclusiveAccessAllRegistrants}

func toSPCType(rtype uint32) reservation.Type {
	if rtype == 0 || rtype >= uint32(len(nvmeTypes)) {
		return 0 // invalid: Apply refuses it where a type is needed
	}
	return nvmeTypes[rtype]
}

func toNVMeType(t reservation.Type) byte {
	for i, x := range nvmeTypes {
		if i > 0 && x == t {
			return byte(i)
		}
	}
	return 0
}

// hostNexus is the reservation identity of a controller's host.
func (c *controller) hostNexus() reservation.Nexus {
	return c.nexus
}

// nexusOf is the reservation identity of Host Identifier id.
func nexusOf(id [16]byte) reservation.Nexus {
	return reservation.Nexus{Initiator: "nvme:" + hex.EncodeToString(id[:])}
}

// ioAccess is what an I/O command does to the medium.
func ioAccess(op uint8) reservation.Access {
	switch op {
	case ioRead, ioCompare:
		return reservation.AccessRead
	case ioWrite, ioWriteZeroes, ioDSM:
		return reservation.AccessWrite
	}
	return reservation.AccessNone
}

// resvConflict reports whether cmd conflicts with ns's reservation; it
// completes cmd when the state cannot be read.
func (c *conn) resvConflict(cmd *command, ns *namespace) (conflict, failed bool) {
	acc := ioAccess(cmd.sqe.opcode)
	if acc == reservation.AccessNone {
		return false, false
	}
	if f, ok := c.s.cfg.Reservations.(reservation.FreshReader); ok {
		// Every command asks: no context (and timer) to make while the
		// copy is fresh (as iSCSI's scsi.LU.prState).
		if st, _, ok := f.Fresh(ns.volume); ok {
			return st.Conflicts(c.ctrl.hostNexus(), acc), false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), resvReadTimeout)
	defer cancel()
	st, err := c.s.cfg.Reservations.Read(ctx, ns.volume)
	if err != nil {
		c.complete(cmd, scNSNotReady, 0, 0)
		return false, true
	}
	return st.Conflicts(c.ctrl.hostNexus(), acc), false
}

// reservationCmd runs a reservation command on its own goroutine (the store
// may take a while: a PERSISTENT RESERVE OUT waits out the cache's TTL).
func (c *conn) reservationCmd(cmd *command, ns *namespace) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		status, data := c.reservationRun(cmd, ns)
		if cmd.sqe.opcode != ioResvReport {
			c.s.kickReservations() // other hosts' notifications, on this node at once
		}
		if status == scSuccess && data != nil {
			c.completeData(cmd, data)
			return
		}
		c.complete(cmd, status, 0, 0)
	}()
}

func (c *conn) reservationRun(cmd *command, ns *namespace) (uint16, []byte) {
	s := cmd.sqe
	from := c.ctrl.hostNexus()
	ctx, cancel := context.WithTimeout(context.Background(), resvTimeout)
	defer cancel()
	store := c.s.cfg.Reservations
	if s.opcode == ioResvReport {
		st, err := store.Read(ctx, ns.volume)
		if err != nil {
			return scNSNotReady, nil
		}
		return scSuccess, c.resvReport(st, s.cdw[11]&1 != 0, int(s.cdw[10]+1)*4)
	}
	d := cmd.data
	key := func(i int) uint64 { return binary.LittleEndian.Uint64(d[8*i:]) }
	iekey := s.cdw[10]&0x08 != 0
	var a reservation.Action
	switch s.opcode {
	case ioResvRegister:
		if len(d) < 16 {
			return scInvalidField | dnr, nil
		}
		crkey, nrkey := key(0), key(1)
		switch s.cdw[10] & 0x7 {
		case 0: // register
			st, err := store.Read(ctx, ns.volume)
			if err != nil {
				return scNSNotReady, nil
			}
			if r := st.Registration(from); r != nil {
				if r.Key == nrkey {
					return scSuccess, nil
				}
				return scResvConflict | dnr, nil
			}
			a = reservation.Action{ServiceAction: reservation.Register, SAKey: nrkey}
		case 1: // unregister
			a = reservation.Action{ServiceAction: reservation.Register, Key: crkey}
		case 2: // replace
			a = reservation.Action{ServiceAction: reservation.Register, Key: crkey, SAKey: nrkey}
		default:
			return scInvalidField | dnr, nil
		}
		if iekey {
			a.ServiceAction = reservation.RegisterAndIgnore
		}
		a.AllTargetPort = true // a host's registration covers all its paths
		// CPTPL: 3 sets persist-through-power-loss, anything else leaves
		// it clear (the state is in the MDS and persists either way).
		a.APTPL = s.cdw[10]>>30 == 3
	case ioResvAcquire:
		if len(d) < 16 {
			return scInvalidField | dnr, nil
		}
		typ := toSPCType((s.cdw[10] >> 8) & 0xff)
		switch s.cdw[10] & 0x7 {
		case 0:
			a = reservation.Action{ServiceAction: reservation.Reserve, Key: key(0), Type: typ}
		case 1:
			a = reservation.Action{ServiceAction: reservation.Preempt, Key: key(0), SAKey: key(1), Type: typ}
		case 2:
			a = reservation.Action{ServiceAction: reservation.PreemptAndAbort, Key: key(0), SAKey: key(1), Type: typ}
		default:
			return scInvalidField | dnr, nil
		}
		if iekey {
			return scInvalidField | dnr, nil // IEKEY is obsolete for Acquire and Release
		}
	case ioResvRelease:
		if len(d) < 8 {
			return scInvalidField | dnr, nil
		}
		switch s.cdw[10] & 0x7 {
		case 0:
			a = reservation.Action{ServiceAction: reservation.Release, Key: key(0), Type: toSPCType((s.cdw[10] >> 8) & 0xff)}
		case 1:
			a = reservation.Action{ServiceAction: reservation.Clear, Key: key(0)}
		default:
			return scInvalidField | dnr, nil
		}
		if iekey {
			return scInvalidField | dnr, nil
		}
	}
	st, err := store.Apply(ctx, ns.volume, from, a)
	if err == nil && st != nil {
		c.ctrl.resvAttentions(ns, st) // a registration's baseline for notifications
		if a.ServiceAction == reservation.PreemptAndAbort {
			c.s.abortPreempted(ns.volume, st)
		}
	}
	if err != nil {
		e := reservation.AsError(err)
		if e == nil {
			return scNSNotReady, nil
		}
		if e.Code == reservation.CodeConflict {
			return scResvConflict | dnr, nil
		}
		return scInvalidField | dnr, nil
	}
	return scSuccess, nil
}

// resvReport is the Reservation Status data structure (extended with
// 128-bit host identifiers when eds), cut to n bytes.
func (c *conn) resvReport(st *reservation.State, eds bool, n int) []byte {
	hdr, entry := 24, 24
	if eds {
		hdr, entry = 64, 64
	}
	d := make([]byte, hdr, hdr+entry*len(st.Registrations))
	binary.LittleEndian.PutUint32(d[0:], st.Generation)
	if st.Reserved {
		d[4] = toNVMeType(st.Type)
	}
	binary.LittleEndian.PutUint16(d[5:], uint16(len(st.Registrations)))
	if st.APTPL {
		d[9] = 1 // PTPLS
	}
	for _, r := range st.Registrations {
		e := make([]byte, entry)
		binary.LittleEndian.PutUint16(e[0:], 0xffff) // CNTLID: the host's, on any access node
		if st.IsHolderRegistration(r) {
			e[2] = 1 // RCSTS: holds the reservation
		}
		var hostID [16]byte
		if len(r.Nexus.Initiator) == 5+32 {
			hex.Decode(hostID[:], []byte(r.Nexus.Initiator[5:]))
		}
		if eds {
			binary.LittleEndian.PutUint64(e[8:], r.Key)
			copy(e[16:32], hostID[:])
		} else {
			copy(e[8:16], hostID[:8])
			binary.LittleEndian.PutUint64(e[16:], r.Key)
		}
		d = append(d, e...)
	}
	if len(d) > n {
		d = d[:n]
	}
	return d
}
