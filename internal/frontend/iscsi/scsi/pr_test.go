package scsi

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/reservation"
)

func prOut(sa, typ byte, key, saKey uint64, flags byte) ([]byte, []byte) {
	cdb := []byte{0x5f, sa, typ, 0, 0, 0, 0, 0, 24, 0}
	p := make([]byte, 24)
	binary.BigEndian.PutUint64(p[0:], key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	p[20] = flags
	return cdb, p
}

func prIn(sa byte) []byte { return []byte{0x5e, sa, 0, 0, 0, 0, 0, 0x10, 0, 0} }

var cdbWrite10 = []byte{0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0}
var cdbRead10 = []byte{0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0}

// prLU is volume "v" on disk b as the nexus of initiator and target port
// port sees it, its reservations in store.
func prLU(b *frontendtest.Disk, store reservation.Store, initiator string, port uint16) *LU {
	return New(Config{Backend: b, Info: b.Info(), ID: 42, TargetName: "iqn.2026-11.io.basalt:c:v",
		PR: &PR{Store: store, Volume: "v", Nexus: reservation.Nexus{Initiator: initiator, TargetPort: port}}})
}

// Two nexuses (two sessions, as on two access nodes: each its own LU and
// group) over one store: a reservation made through one is enforced on the
// other; a preemption raises REGISTRATIONS PREEMPTED there once.
func TestPersistentReservationAcrossNexuses(t *testing.T) {
	b := newDisk(t, 1<<20, false)
	store := reservation.NewMemStore()
	open := func(initiator string, port uint16) *LU { return prLU(b, store, initiator, port) }
	a, c := open("iqn.a,i,0x1", 1), open("iqn.b,i,0x2", 2)
	block := make([]byte, 512)
	expect := func(lu *LU, cdb, data []byte, status byte, s [3]byte) Result {
		t.Helper()
		r := run(t, lu, cdb, data)
		if r.Status != status || senseOf(r) != s {
			t.Fatalf("opcode %#x: status %#x sense %x, want %#x %x", cdb[0], r.Status, senseOf(r), status, s)
		}
		return r
	}
	none := [3]byte{}
	// Both look once (the first state an LU sees sets its baseline).
	expect(a, cdbTUR, nil, StatusGood, none)
	expect(c, cdbTUR, nil, StatusGood, none)
	cdb, p := prOut(6, 0, 0, 0xa, 0) // REGISTER AND IGNORE EXISTING KEY
	expect(a, cdb, p, StatusGood, none)
	cdb, p = prOut(6, 0, 0, 0xc, 0)
	expect(c, cdb, p, StatusGood, none)
	cdb, p = prOut(1, 0x03, 0xa, 0, 0) // RESERVE, EXCLUSIVE ACCESS
	expect(a, cdb, p, StatusGood, none)
	expect(c, cdbRead10, nil, StatusReservationConflict, none)
	expect(c, cdbWrite10, block, StatusReservationConflict, none)
	expect(c, cdbTUR, nil, StatusGood, none)
	expect(a, cdbWrite10, block, StatusGood, none)
	// READ RESERVATION through the other nexus.
	r := expect(c, prIn(1), nil, StatusGood, none)
	if len(r.Data) != 24 || binary.BigEndian.Uint64(r.Data[8:]) != 0xa || r.Data[21] != 0x03 {
		t.Fatalf("READ RESERVATION: % x", r.Data)
	}
	// READ FULL STATUS: two descriptors, a's holds.
	r = expect(c, prIn(3), nil, StatusGood, none)
	if n := binary.BigEndian.Uint32(r.Data[4:]); int(n) != len(r.Data)-8 || r.Data[8+12] != 0x01 {
		t.Fatalf("READ FULL STATUS: % x", r.Data)
	}
	// c preempts a: a's registration goes; a gets 2A/05 once.
	cdb, p = prOut(4, 0x01, 0xc, 0xa, 0) // PREEMPT, WRITE EXCLUSIVE
	expect(c, cdb, p, StatusGood, none)
	expect(a, cdbTUR, nil, StatusCheckCondition, [3]byte{KeyUnitAttention, 0x2a, 0x05})
	expect(a, cdbRead10, nil, StatusGood, none)
	expect(a, cdbWrite10, block, StatusReservationConflict, none)
	// a is no longer registered: RESERVE conflicts.
	cdb, p = prOut(1, 0x01, 0xa, 0, 0)
	expect(a, cdb, p, StatusReservationConflict, none)
	// Bad parameter length, a bad type, a bad scope.
	expect(c, []byte{0x5f, 0, 0, 0, 0, 0, 0, 0, 23, 0}, make([]byte, 23), StatusCheckCondition, [3]byte{KeyIllegalRequest, 0x1a, 0})
	cdb, p = prOut(1, 0x02, 0xc, 0, 0)
	expect(c, cdb, p, StatusCheckCondition, [3]byte{KeyIllegalRequest, 0x24, 0})
	cdb, p = prOut(1, 0x21, 0xc, 0, 0)
	expect(c, cdb, p, StatusCheckCondition, [3]byte{KeyIllegalRequest, 0x24, 0})
	// Release; CLEAR; both write again.
	cdb, p = prOut(2, 0x01, 0xc, 0, 0)
	expect(c, cdb, p, StatusGood, none)
	expect(a, cdbWrite10, block, StatusGood, none)
	cdb, p = prOut(3, 0, 0xc, 0, 0)
	expect(c, cdb, p, StatusGood, none)
	r = expect(a, prIn(0), nil, StatusGood, none)
	if binary.BigEndian.Uint32(r.Data[4:]) != 0 {
		t.Fatalf("READ KEYS after CLEAR: % x", r.Data)
	}
}

// Without a store the commands are not served.
func TestPersistentReserveWithoutStore(t *testing.T) {
	b := newDisk(t, 1<<20, false)
	lu := New(Config{Backend: b, Info: b.Info(), ID: 42, TargetName: "iqn.2026-11.io.basalt:c:v"})
	if r := run(t, lu, prIn(0), nil); r.Status != StatusCheckCondition || senseOf(r) != [3]byte{KeyIllegalRequest, 0x20, 0} {
		t.Fatalf("PERSISTENT RESERVE IN without a store: %#x %x", r.Status, senseOf(r))
	}
}

func TestTransportID(t *testing.T) {
	id := TransportID("iqn.x,i,0x1")
	if len(id) != 24 || id[0] != 0x45 || binary.BigEndian.Uint16(id[2:]) != 20 || string(id[4:15]) != "iqn.x,i,0x1" {
		t.Fatalf("% x", id)
	}
	long := TransportID("iqn.2026-11.io.basalt.test:initiator-1,i,0x23d000000001")
	if (len(long)-4)%4 != 0 || long[len(long)-1] != 0 {
		t.Fatalf("% x", long)
	}
}

// RESERVE(6)/RELEASE(6) through two nexuses over one store: the holder
// alone gets commands through (INQUIRY, REPORT LUNS, REQUEST SENSE and
// RELEASE are exempt); nexus loss and a reset drop the reservation; a
// registered persistent reservation key makes RESERVE(6) conflict.
func TestReserve6AcrossNexuses(t *testing.T) {
	b := newDisk(t, 1<<20, false)
	store := reservation.NewMemStore()
	open := func(initiator string, port uint16) *LU { return prLU(b, store, initiator, port) }
	a, c := open("iqn.a,i,0x1", 1), open("iqn.b,i,0x2", 2)
	block := make([]byte, 512)
	none := [3]byte{}
	expect := func(lu *LU, cdb, data []byte, status byte, s [3]byte) {
		t.Helper()
		if r := run(t, lu, cdb, data); r.Status != status || senseOf(r) != s {
			t.Fatalf("opcode %#x: status %#x sense %x, want %#x %x", cdb[0], r.Status, senseOf(r), status, s)
		}
	}
	reserve, release := []byte{0x16, 0, 0, 0, 0, 0}, []byte{0x17, 0, 0, 0, 0, 0}
	expect(a, cdbTUR, nil, StatusGood, none)
	expect(c, cdbTUR, nil, StatusGood, none)
	expect(a, reserve, nil, StatusGood, none)
	expect(a, reserve, nil, StatusGood, none)
	expect(a, cdbWrite10, block, StatusGood, none)
	expect(c, reserve, nil, StatusReservationConflict, none)
	for _, cdb := range [][]byte{cdbTUR, cdbRead10, prIn(0)} {
		expect(c, cdb, nil, StatusReservationConflict, none)
	}
	expect(c, cdbWrite10, block, StatusReservationConflict, none)
	cdb, p := prOut(6, 0, 0, 0xc, 0)
	expect(c, cdb, p, StatusReservationConflict, none)
	expect(c, []byte{0x12, 0, 0, 0, 96, 0}, nil, StatusGood, none)                   // INQUIRY
	expect(c, []byte{0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0}, nil, StatusGood, none) // REPORT LUNS
	expect(c, []byte{0x03, 0, 0, 0, 18, 0}, nil, StatusGood, none)                   // REQUEST SENSE
	expect(c, release, nil, StatusGood, none)                                        // a no-op
	expect(c, cdbRead10, nil, StatusReservationConflict, none)
	// Obsolete third-party and extent reservations are refused.
	expect(a, []byte{0x16, 0x10, 0, 0, 0, 0}, nil, StatusCheckCondition, [3]byte{KeyIllegalRequest, 0x24, 0})
	expect(a, release, nil, StatusGood, none)
	expect(c, reserve, nil, StatusGood, none)
	expect(a, cdbRead10, nil, StatusReservationConflict, none)
	// c's nexus ends: its reservation goes.
	if err := c.ReleaseSPC2(false); err != nil {
		t.Fatal(err)
	}
	expect(a, reserve, nil, StatusGood, none)
	// A reset through another nexus drops it too.
	c.Reset()
	expect(c, cdbTUR, nil, StatusCheckCondition, [3]byte{KeyUnitAttention, 0x29, 0x03})
	expect(a, cdbTUR, nil, StatusGood, none) // another group (access node): no attention, no reservation
	expect(c, reserve, nil, StatusGood, none)
	expect(c, release, nil, StatusGood, none)
	// Persistent reservations in use: RESERVE(6) conflicts.
	cdb, p = prOut(6, 0, 0, 0xa, 0)
	expect(a, cdb, p, StatusGood, none)
	expect(c, reserve, nil, StatusReservationConflict, none)
	expect(a, reserve, nil, StatusReservationConflict, none)
}

// The unit attentions a reservation change raises on the other nexuses
// (SPC-4 5.13.11): RESERVATIONS RELEASED when a registrants-only
// reservation is released, RESERVATIONS PREEMPTED after a CLEAR, each
// reported once; and APTPL, which REGISTER sets and REPORT CAPABILITIES'
// PTPL_A reports.
func TestReservationAttentionsAndAPTPL(t *testing.T) {
	b := newDisk(t, 1<<20, false)
	store := reservation.NewMemStore()
	open := func(initiator string, port uint16) *LU { return prLU(b, store, initiator, port) }
	a, c := open("iqn.a,i,0x1", 1), open("iqn.b,i,0x2", 2)
	expect := func(what string, lu *LU, cdb, data []byte, status byte, s [3]byte) Result {
		t.Helper()
		r := run(t, lu, cdb, data)
		if r.Status != status || senseOf(r) != s {
			t.Fatalf("%s: status %#x sense %x, want %#x %x", what, r.Status, senseOf(r), status, s)
		}
		return r
	}
	none := [3]byte{}
	ptplA := func(lu *LU) bool {
		r := expect("REPORT CAPABILITIES", lu, prIn(2), nil, StatusGood, none)
		return r.Data[3]&0x01 != 0
	}
	expect("a's TEST UNIT READY", a, cdbTUR, nil, StatusGood, none)
	expect("c's TEST UNIT READY", c, cdbTUR, nil, StatusGood, none)
	cdb, p := prOut(6, 0, 0, 0xa, 0x01) // REGISTER AND IGNORE EXISTING KEY, APTPL
	expect("a's REGISTER with APTPL", a, cdb, p, StatusGood, none)
	if !ptplA(c) {
		t.Fatal("PTPL_A is 0 after a REGISTER with APTPL")
	}
	cdb, p = prOut(6, 0, 0, 0xc, 0)
	expect("c's REGISTER without APTPL", c, cdb, p, StatusGood, none)
	if ptplA(a) {
		t.Fatal("PTPL_A is 1 after the last REGISTER had APTPL 0")
	}

	cdb, p = prOut(1, 0x05, 0xa, 0, 0) // RESERVE, WRITE EXCLUSIVE – REGISTRANTS ONLY
	expect("a's RESERVE", a, cdb, p, StatusGood, none)
	cdb, p = prOut(2, 0x05, 0xa, 0, 0)
	expect("a's RELEASE", a, cdb, p, StatusGood, none)
	expect("c after the release", c, cdbTUR, nil, StatusCheckCondition, [3]byte{KeyUnitAttention, 0x2a, 0x04})
	expect("c again", c, cdbTUR, nil, StatusGood, none)
	expect("a (the releaser)", a, cdbTUR, nil, StatusGood, none)

	cdb, p = prOut(1, 0x01, 0xa, 0, 0) // RESERVE, WRITE EXCLUSIVE
	expect("a's RESERVE", a, cdb, p, StatusGood, none)
	cdb, p = prOut(3, 0, 0xc, 0, 0)
	expect("c's CLEAR", c, cdb, p, StatusGood, none)
	expect("a after the clear", a, cdbTUR, nil, StatusCheckCondition, [3]byte{KeyUnitAttention, 0x2a, 0x03})
	expect("a again", a, cdbWrite10, make([]byte, 512), StatusGood, none)
	expect("c (the clearer)", c, cdbTUR, nil, StatusGood, none)
}

// A PREEMPT AND ABORT completes only once the preempted nexus's write left
// the backend, however long that takes (a basalt volume's IO retries for up
// to a minute): not when its own call to the store times out (prTimeout),
// which answered GOOD with the write still to land.
func TestPreemptAndAbortOutwaitsItsTimeout(t *testing.T) {
	defer func(d time.Duration) { prTimeout = d }(prTimeout)
	prTimeout = 50 * time.Millisecond
	disk := newDisk(t, 1<<20, false)
	store := reservation.NewMemStore()
	group := NewGroup()
	bLeft := make(chan struct{}) // B's write left the backend
	open := func(initiator string, port uint16, abort func(*Command) (int, <-chan struct{})) *LU {
		return New(Config{Backend: disk, Info: disk.Info(), ID: 42, TargetName: "iqn.2026-11.io.basalt:c:v", Group: group,
			PR: &PR{Store: store, Volume: "v", Nexus: reservation.Nexus{Initiator: initiator, TargetPort: port}, AbortTasks: abort}})
	}
	// B's AbortTasks as the iSCSI session's: its one command in flight is
	// the write below, which it waits for.
	a := open("iqn.a,i,0x1", 1, nil)
	b := open("iqn.b,i,0x2", 2, func(*Command) (int, <-chan struct{}) { return 1, bLeft })
	for _, s := range []struct {
		lu         *LU
		sa, typ    byte
		key, saKey uint64
	}{{a, 6, 0, 0, 0xa}, {b, 6, 0, 0, 0xb}, {a, 1, 5, 0xa, 0}} {
		cdb, p := prOut(s.sa, s.typ, s.key, s.saKey, 0)
		if r := run(t, s.lu, cdb, p); r.Status != StatusGood {
			t.Fatalf("PERSISTENT RESERVE OUT %d: status %#x sense %x", s.sa, r.Status, senseOf(r))
		}
	}

	disk.Gate = make(chan struct{})
	t.Cleanup(func() { close(disk.Gate) })
	w, _ := Decode(cdb10(0x2a, 1, 1), 512)
	b.Execute(w, bytes.Repeat([]byte{'b'}, 512), func(Result) { close(bLeft) })
	disk.WaitSubmitted(t, 1)

	cdb, p := prOut(5, 5, 0xa, 0xb, 0) // PREEMPT AND ABORT B's key
	pa, _ := Decode(cdb, 512)
	paDone := make(chan Result, 1)
	a.Execute(pa, p, func(r Result) { paDone <- r })
	select {
	case r := <-paDone:
		t.Fatalf("PREEMPT AND ABORT completed (status %#x) with B's write still in the backend", r.Status)
	case <-time.After(time.Second): // twenty times prTimeout
	}
	disk.Gate <- struct{}{}
	select {
	case r := <-paDone:
		if r.Status != StatusGood {
			t.Fatalf("PREEMPT AND ABORT: status %#x sense %x", r.Status, senseOf(r))
		}
	case <-time.After(time.Minute):
		t.Fatal("PREEMPT AND ABORT not complete a minute after B's write left the backend")
	}
}
