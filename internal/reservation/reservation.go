// Package reservation is the persistent-reservation model of SPC-4 (5.13),
// shared by basalt's iSCSI and NVMe/TCP front ends and stored per volume by
// the MDS: the registrations (an I_T nexus and its key), the reservation
// (holder and type), the PR generation, APTPL, and the unit attentions a
// change raises. It is pure: Apply takes a state and a PERSISTENT RESERVE OUT
// action and returns the next state or a SCSI-level error; Conflicts says
// whether a command of an access class from a nexus conflicts with the
// reservation. The front ends only translate to and from their protocol.
//
// A State is never changed after it is made: Apply returns a new one, so
// a snapshot may be shared between goroutines.
package reservation

import (
	"errors"
	"fmt"
	"slices"
)

// Type is a persistent reservation type (SPC-4 table 212).
type Type uint8

const (
	WriteExclusive                 Type = 1
	ExclusiveAccess                Type = 3
	WriteExclusiveRegistrantsOnly  Type = 5
	ExclusiveAccessRegistrantsOnly Type = 6
	WriteExclusiveAllRegistrants   Type = 7
	ExclusiveAccessAllRegistrants  Type = 8
	typeMaskAll                         = 1<<WriteExclusive | 1<<ExclusiveAccess | 1<<WriteExclusiveRegistrantsOnly |
		1<<ExclusiveAccessRegistrantsOnly | 1<<WriteExclusiveAllRegistrants | 1<<ExclusiveAccessAllRegistrants
)

// Valid reports whether t is one of the six types.
func (t Type) Valid() bool { return t < 16 && typeMaskAll&(1<<t) != 0 }

// AllRegistrants reports whether every registrant holds a reservation of
// type t.
func (t Type) AllRegistrants() bool {
	return t == WriteExclusiveAllRegistrants || t == ExclusiveAccessAllRegistrants
}

// registrantsType: the types whose release raises RESERVATIONS RELEASED.
func (t Type) registrantsType() bool {
	return t == WriteExclusiveRegistrantsOnly || t == ExclusiveAccessRegistrantsOnly || t.AllRegistrants()
}

// ServiceAction is a PERSISTENT RESERVE OUT service action (SPC-4 table 217).
type ServiceAction uint8

const (
	Register               ServiceAction = 0
	Reserve                ServiceAction = 1
	Release                ServiceAction = 2
	Clear                  ServiceAction = 3
	Preempt                ServiceAction = 4
	PreemptAndAbort        ServiceAction = 5
	RegisterAndIgnore      ServiceAction = 6
	RegisterAndMove        ServiceAction = 7
	ReplaceLostReservation ServiceAction = 8

	// ReserveSPC2 and ReleaseSPC2 are not PERSISTENT RESERVE OUT service
	// actions but RESERVE(6) and RELEASE(6) (SPC-2 7.21, 7.16), kept in
	// the same state so they hold across access nodes (ReserveSPC2,
	// ReleaseSPC2).
	ReserveSPC2 ServiceAction = 0x40
	ReleaseSPC2 ServiceAction = 0x41
	// ResetSPC2 drops an SPC-2 reservation whoever holds it (LOGICAL UNIT
	// RESET, target reset: SPC-2 5.5.1).
	ResetSPC2 ServiceAction = 0x42
)

// Nexus identifies an I_T nexus, or with AllTargetPorts, an initiator port
// toward every target port (a registration made with ALL_TG_PT).
type Nexus struct {
	// Initiator is the initiator port's name: for iSCSI the initiator name,
	// ",i,0x" and the ISID; for NVMe the host NQN and host identifier.
	Initiator string `json:"i"`
	// TargetPort is the relative target port identifier (one per access
	// node and protocol).
	TargetPort     uint16 `json:"t,omitempty"`
	AllTargetPorts bool   `json:"a,omitempty"`
}

// covers reports whether a registration made by r includes the I_T nexus n.
func (r Nexus) covers(n Nexus) bool {
	return r.Initiator == n.Initiator && (r.AllTargetPorts || r.TargetPort == n.TargetPort)
}

// Registration is a registered I_T nexus and its reservation key.
type Registration struct {
	Nexus Nexus  `json:"n"`
	Key   uint64 `json:"k"`
}

// Attention is a unit attention a change raised for the nexuses a
// registration covers: ASC 2A with ASCQ RegistrationsPreempted,
// ReservationsPreempted or ReservationsReleased.
type Attention struct {
	Seq   uint64 `json:"s"`
	Nexus Nexus  `json:"n"`
	ASCQ  byte   `json:"q"`
	// Abort: a PREEMPT AND ABORT preempted the registration, so the
	// commands in flight from the nexuses it covers are aborted (SPC-4
	// 5.13.11.2.4), wherever they are (AbortedFor).
	Abort bool `json:"ab,omitempty"`
}

// The ASCQs of ASC 2A (PARAMETERS CHANGED) a reservation change raises.
const (
	ReservationsPreempted  byte = 0x03
	ReservationsReleased   byte = 0x04
	RegistrationsPreempted byte = 0x05
)

// MaxAttentions bounds the attentions a State keeps (the newest): a nexus
// that has not looked for longer misses the older ones.
const MaxAttentions = 64

// MaxRegistrations bounds the registrations of one volume; a REGISTER past
// it gets INSUFFICIENT REGISTRATION RESOURCES.
const MaxRegistrations = 256

// State is one volume's persistent reservations.
type State struct {
	// Generation is the PRgeneration: it counts REGISTER, REGISTER AND
	// IGNORE EXISTING KEY, CLEAR, PREEMPT and PREEMPT AND ABORT that
	// succeeded (not RESERVE or RELEASE), as SPC-4 5.13.2 says.
	Generation    uint32         `json:"gen"`
	Registrations []Registration `json:"regs,omitempty"`
	Reserved      bool           `json:"reserved,omitempty"`
	Type          Type           `json:"type,omitempty"`
	// Holder is the reservation holder's registration (not used for the
	// all-registrants types, where every registrant holds it).
	Holder Nexus `json:"holder,omitzero"`
	APTPL  bool  `json:"aptpl,omitempty"`
	// Seq counts every change (for the caches of front ends and for
	// Attentions); Attentions are the newest unit attentions raised.
	Seq        uint64      `json:"seq,omitempty"`
	Attentions []Attention `json:"uas,omitempty"`
	// SPC2 is the I_T nexus holding an SPC-2 reservation (RESERVE(6)), if
	// any. It and persistent reservations exclude each other (SPC-4
	// 5.13.3): while registrations exist no SPC-2 reservation is made.
	SPC2 *Nexus `json:"spc2,omitempty"`
}

// Code is the kind of an Error.
type Code uint8

const (
	// CodeConflict: RESERVATION CONFLICT status.
	CodeConflict Code = iota + 1
	// CodeInvalidCDB: ILLEGAL REQUEST, INVALID FIELD IN CDB (Field: byte).
	CodeInvalidCDB
	// CodeInvalidParam: ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST.
	CodeInvalidParam
	// CodeInvalidRelease: ILLEGAL REQUEST, INVALID RELEASE OF PERSISTENT
	// RESERVATION (26/04).
	CodeInvalidRelease
	// CodeNoResources: ILLEGAL REQUEST, INSUFFICIENT REGISTRATION
	// RESOURCES (55/04).
	CodeNoResources
)

// Error is a PERSISTENT RESERVE OUT refused at the SCSI level.
type Error struct {
	Code  Code
	Field int // the CDB or parameter-list byte at fault, for the invalid-field codes
}

func (e *Error) Error() string {
	switch e.Code {
	case CodeConflict:
		return "reservation conflict"
	case CodeInvalidCDB:
		return fmt.Sprintf("invalid field in CDB byte %d", e.Field)
	case CodeInvalidParam:
		return fmt.Sprintf("invalid field in parameter list byte %d", e.Field)
	case CodeInvalidRelease:
		return "invalid release of persistent reservation"
	case CodeNoResources:
		return "insufficient registration resources"
	}
	return fmt.Sprintf("reservation error %d", e.Code)
}

// ErrConflict is RESERVATION CONFLICT.
var ErrConflict = &Error{Code: CodeConflict}

// AsError returns err's *Error, or nil.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// Action is one PERSISTENT RESERVE OUT.
type Action struct {
	ServiceAction ServiceAction `json:"sa"`
	Type          Type          `json:"type,omitempty"`
	Key           uint64        `json:"key,omitempty"`    // RESERVATION KEY
	SAKey         uint64        `json:"sa_key,omitempty"` // SERVICE ACTION RESERVATION KEY
	APTPL         bool          `json:"aptpl,omitempty"`
	AllTargetPort bool          `json:"all_tg_pt,omitempty"`
	SpecIPT       bool          `json:"spec_i_pt,omitempty"`
}

// Registration returns the registration that covers n, or nil.
func (s *State) Registration(n Nexus) *Registration {
	for i := range s.Registrations {
		if s.Registrations[i].Nexus.covers(n) {
			return &s.Registrations[i]
		}
	}
	return nil
}

// Holds reports whether n is a reservation holder.
func (s *State) Holds(n Nexus) bool {
	if !s.Reserved {
		return false
	}
	if s.Type.AllRegistrants() {
		return s.Registration(n) != nil
	}
	return s.Holder.covers(n)
}

// HolderKey is the key READ RESERVATION reports: the holder's, or 0 for
// the all-registrants types.
func (s *State) HolderKey() uint64 {
	if !s.Reserved || s.Type.AllRegistrants() {
		return 0
	}
	for _, r := range s.Registrations {
		if r.Nexus == s.Holder {
			return r.Key
		}
	}
	return 0
}

// IsHolderRegistration reports whether registration r holds the
// reservation (READ FULL STATUS's R_HOLDER).
func (s *State) IsHolderRegistration(r Registration) bool {
	if !s.Reserved {
		return false
	}
	return s.Type.AllRegistrants() || r.Nexus == s.Holder
}

// Access is what a command does to the medium, for Conflicts.
type Access uint8

const (
	// AccessNone: allowed under every persistent reservation (TEST UNIT
	// READY, READ CAPACITY, PERSISTENT RESERVE IN/OUT, ...) but not under
	// another nexus's SPC-2 reservation.
	AccessNone Access = iota
	// AccessRead: reads the medium or the device's settings (READ, VERIFY,
	// MODE SENSE, ...).
	AccessRead
	// AccessWrite: changes the medium or the device (WRITE, UNMAP, WRITE
	// SAME, SYNCHRONIZE CACHE, MODE SELECT, ...).
	AccessWrite
	// AccessExempt: allowed under every reservation, SPC-2 ones included
	// (INQUIRY, REPORT LUNS, REQUEST SENSE, RELEASE(6): SPC-2 5.5.1).
	AccessExempt
)

// Conflicts reports whether a command with access a from nexus n conflicts
// with s's reservation (SPC-4 5.13.1, table 209): it then gets RESERVATION
// CONFLICT.
//
// Under an SPC-2 reservation every command from another nexus but the
// AccessExempt ones conflicts (SPC-2 5.5.1).
func (s *State) Conflicts(n Nexus, a Access) bool {
	if s == nil || a == AccessExempt {
		return false
	}
	if s.SPC2 != nil {
		return !s.SPC2.covers(n)
	}
	if !s.Reserved || a == AccessNone || s.Holds(n) {
		return false
	}
	registered := s.Registration(n) != nil
	switch s.Type {
	case WriteExclusive:
		return a == AccessWrite
	case ExclusiveAccess:
		return true
	case WriteExclusiveRegistrantsOnly, WriteExclusiveAllRegistrants:
		return !registered && a == AccessWrite
	case ExclusiveAccessRegistrantsOnly, ExclusiveAccessAllRegistrants:
		return !registered
	}
	return false
}

// clone returns a deep copy of s for Apply to change.
func (s *State) clone() *State {
	c := *s
	c.Registrations = slices.Clone(s.Registrations)
	c.Attentions = slices.Clone(s.Attentions)
	return &c
}

// raise records a unit attention for the nexuses registration r covers.
func (s *State) raise(r Nexus, ascq byte) {
	s.raiseAttention(Attention{Seq: s.Seq, Nexus: r, ASCQ: ascq})
}

func (s *State) raiseAttention(a Attention) {
	s.Attentions = append(s.Attentions, a)
	if n := len(s.Attentions) - MaxAttentions; n > 0 {
		s.Attentions = slices.Delete(s.Attentions, 0, n)
	}
}

// AttentionsFor returns the ASCQs raised for nexus n after sequence number
// after, oldest first.
func (s *State) AttentionsFor(n Nexus, after uint64) []byte {
	var out []byte
	for _, a := range s.Attentions {
		if a.Seq > after && a.Nexus.covers(n) {
			out = append(out, a.ASCQ)
		}
	}
	return out
}

// AbortedFor reports whether a PREEMPT AND ABORT after sequence number
// after preempted a registration covering nexus n: the commands n had in
// flight then are to be aborted.
func (s *State) AbortedFor(n Nexus, after uint64) bool {
	for _, a := range s.Attentions {
		if a.Seq > after && a.Abort && a.Nexus.covers(n) {
			return true
		}
	}
	return false
}

// release drops the reservation; a registrants-only or all-registrants one
// raises RESERVATIONS RELEASED for every registrant but except.
func (s *State) release(except Nexus) {
	if s.Type.registrantsType() {
		for _, r := range s.Registrations {
			if r.Nexus != except {
				s.raise(r.Nexus, ReservationsReleased)
			}
		}
	}
	s.Reserved, s.Type, s.Holder = false, 0, Nexus{}
}

// unregister removes registration i (a holder's also releases a
// reservation held through it, SPC-4 5.13.11.2.3).
func (s *State) unregister(i int) {
	r := s.Registrations[i]
	s.Registrations = slices.Delete(s.Registrations, i, i+1)
	if !s.Reserved {
		return
	}
	if s.Type.AllRegistrants() {
		if len(s.Registrations) == 0 {
			s.Reserved, s.Type = false, 0
		}
		return
	}
	if s.Holder == r.Nexus {
		s.release(r.Nexus)
	}
}

// Apply runs PERSISTENT RESERVE OUT action a, received through nexus from,
// on s (nil: no registrations) and returns the state after it, or an *Error.
// A state equal to s (no change) is returned as s itself.
func Apply(s *State, from Nexus, a Action) (*State, error) {
	if s == nil {
		s = &State{}
	}
	from.AllTargetPorts = false
	switch a.ServiceAction {
	case ReserveSPC2, ReleaseSPC2, ResetSPC2:
		return applySPC2(s, from, a.ServiceAction)
	}
	if s.SPC2 != nil && !s.SPC2.covers(from) {
		// PERSISTENT RESERVE OUT from another nexus than an SPC-2
		// reservation's holder conflicts with it (SPC-2 5.5.1).
		return nil, ErrConflict
	}
	switch a.ServiceAction {
	case Register, RegisterAndIgnore:
		return register(s, from, a)
	case Reserve, Release, Clear, Preempt, PreemptAndAbort:
	case RegisterAndMove, ReplaceLostReservation:
		return nil, &Error{Code: CodeInvalidCDB, Field: 1}
	default:
		return nil, &Error{Code: CodeInvalidCDB, Field: 1}
	}
	if a.SpecIPT || a.AllTargetPort {
		// Only REGISTER and REGISTER AND IGNORE EXISTING KEY take them.
		return nil, &Error{Code: CodeInvalidParam, Field: 20}
	}
	reg := s.Registration(from)
	if reg == nil || reg.Key != a.Key {
		return nil, ErrConflict
	}
	n := s.clone()
	n.Seq++
	switch a.ServiceAction {
	case Reserve:
		if !a.Type.Valid() {
			return nil, &Error{Code: CodeInvalidCDB, Field: 2}
		}
		if s.Reserved {
			if s.Holds(from) && s.Type == a.Type {
				return s, nil
			}
			return nil, ErrConflict
		}
		n.Reserved, n.Type = true, a.Type
		if !a.Type.AllRegistrants() {
			n.Holder = reg.Nexus
		}
		return n, nil

	case Release:
		if !s.Reserved || !s.Holds(from) {
			return s, nil
		}
		if s.Type != a.Type {
			return nil, &Error{Code: CodeInvalidRelease}
		}
		n.release(from)
		return n, nil

	case Clear:
		for _, r := range s.Registrations {
			if !r.Nexus.covers(from) {
				n.raise(r.Nexus, ReservationsPreempted)
			}
		}
		n.Registrations, n.Reserved, n.Type, n.Holder = nil, false, 0, Nexus{}
		n.Generation++
		return n, nil
	}

	// PREEMPT and PREEMPT AND ABORT (SPC-4 5.13.11.4).
	// removeKey removes every registration with key k but the sender's and
	// raises REGISTRATIONS PREEMPTED for them (after PREEMPT AND ABORT,
	// marked Abort: their commands are aborted); it reports how many.
	abort := a.ServiceAction == PreemptAndAbort
	removeKey := func(k uint64, all bool) int {
		removed := 0
		for i := 0; i < len(n.Registrations); {
			r := n.Registrations[i]
			if (all || r.Key == k) && r.Nexus != reg.Nexus {
				n.Registrations = slices.Delete(n.Registrations, i, i+1)
				n.raiseAttention(Attention{Seq: n.Seq, Nexus: r.Nexus, ASCQ: RegistrationsPreempted, Abort: abort})
				removed++
				continue
			}
			i++
		}
		return removed
	}
	switch {
	case !s.Reserved || (s.Type.AllRegistrants() && a.SAKey != 0):
		// No reservation (or all-registrants with a key named): remove
		// the registrations with the key.
		if a.SAKey == 0 {
			return nil, &Error{Code: CodeInvalidParam, Field: 8}
		}
		if removeKey(a.SAKey, false) == 0 && !(a.SAKey == reg.Key) {
			return nil, ErrConflict
		}
	case s.Type.AllRegistrants():
		// SAKey 0: every other registration goes; the sender reserves.
		if !a.Type.Valid() {
			return nil, &Error{Code: CodeInvalidCDB, Field: 2}
		}
		removeKey(0, true)
		n.Type, n.Holder = a.Type, reg.Nexus
		if a.Type.AllRegistrants() {
			n.Holder = Nexus{}
		}
	case a.SAKey == s.HolderKey():
		// Preempt the holder: its key's registrations go; the sender
		// holds the reservation, of the new type.
		if !a.Type.Valid() {
			return nil, &Error{Code: CodeInvalidCDB, Field: 2}
		}
		removeKey(a.SAKey, false)
		if s.Type != a.Type {
			// The others still registered learn the reservation changed.
			for _, r := range n.Registrations {
				if r.Nexus != reg.Nexus {
					n.raise(r.Nexus, ReservationsReleased)
				}
			}
		}
		n.Type, n.Holder = a.Type, reg.Nexus
		if a.Type.AllRegistrants() {
			n.Holder = Nexus{}
		}
	default:
		// A reservation held by another key: only registrations go.
		if a.SAKey == 0 {
			return nil, &Error{Code: CodeInvalidParam, Field: 8}
		}
		if removeKey(a.SAKey, false) == 0 {
			return nil, ErrConflict
		}
	}
	n.Generation++
	return n, nil
}

// register runs REGISTER and REGISTER AND IGNORE EXISTING KEY (SPC-4
// 5.13.7).
func register(s *State, from Nexus, a Action) (*State, error) {
	if a.SpecIPT {
		return nil, &Error{Code: CodeInvalidParam, Field: 20} // SIP_C is 0
	}
	i := slices.IndexFunc(s.Registrations, func(r Registration) bool { return r.Nexus.covers(from) })
	if a.ServiceAction == Register {
		switch {
		case i < 0 && a.Key != 0:
			return nil, ErrConflict
		case i >= 0 && s.Registrations[i].Key != a.Key:
			return nil, ErrConflict
		}
	}
	n := s.clone()
	n.Seq++
	switch {
	case i < 0 && a.SAKey == 0:
		return s, nil // nothing to unregister
	case i < 0:
		if len(s.Registrations) >= MaxRegistrations {
			return nil, &Error{Code: CodeNoResources}
		}
		nx := from
		nx.AllTargetPorts = a.AllTargetPort
		n.Registrations = append(n.Registrations, Registration{Nexus: nx, Key: a.SAKey})
		n.APTPL = a.APTPL
	case a.SAKey == 0:
		n.unregister(i)
		if len(n.Registrations) == 0 {
			n.APTPL = false
		}
	default:
		n.Registrations[i].Key = a.SAKey
		n.APTPL = a.APTPL
	}
	n.Generation++
	return n, nil
}

// applySPC2 runs RESERVE(6), RELEASE(6) or a reset's release of an SPC-2
// reservation. While a persistent reservation is in use (any registration)
// RESERVE and RELEASE do nothing from its holder, or from a registrant
// under a registrants type, and conflict from everyone else (SPC-4
// 5.13.3). Otherwise RESERVE conflicts when another nexus holds the SPC-2
// reservation, and RELEASE from a nexus that does not hold it is GOOD and
// does nothing (SPC-2 7.16).
func applySPC2(s *State, from Nexus, sa ServiceAction) (*State, error) {
	if sa == ResetSPC2 {
		if s.SPC2 == nil {
			return s, nil
		}
		n := s.clone()
		n.Seq++
		n.SPC2 = nil
		return n, nil
	}
	if len(s.Registrations) > 0 {
		if s.Holds(from) || (s.Reserved && s.Type.registrantsType() && s.Registration(from) != nil) {
			return s, nil
		}
		return nil, ErrConflict
	}
	holds := s.SPC2 != nil && s.SPC2.covers(from)
	switch {
	case sa == ReserveSPC2 && holds, sa == ReleaseSPC2 && !holds:
		return s, nil
	case sa == ReserveSPC2 && s.SPC2 != nil:
		return nil, ErrConflict
	}
	n := s.clone()
	n.Seq++
	if sa == ReserveSPC2 {
		n.SPC2 = &from
	} else {
		n.SPC2 = nil
	}
	return n, nil
}
