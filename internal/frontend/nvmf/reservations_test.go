package nvmf

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/reservation"
)

func resvData(keys ...uint64) []byte {
	d := make([]byte, 8*len(keys))
	for i, k := range keys {
		binary.LittleEndian.PutUint64(d[8*i:], k)
	}
	return d
}

// Two hosts (two host identifiers) on one namespace over a shared store:
// Register, Acquire, Report, Preempt, Release and Clear, with IO that the
// reservation forbids refused as RESERVATION CONFLICT.
func TestReservations(t *testing.T) {
	store := reservation.NewMemStore()
	_, addr, _ := startServer(t, func(c *Config) { c.Reservations = store })
	admin1, h1 := sessionAs(t, addr, false, false, [16]byte{1})
	_, h2 := sessionAs(t, addr, false, false, [16]byte{2})

	id := admin1.must(admin1.do(newSQE(adminIdentify, 0, 1), nil, false, 4096)).data
	if oncs := binary.LittleEndian.Uint16(id[520:]); oncs&(1<<5) == 0 {
		t.Fatalf("ONCS %#x: no reservations", oncs)
	}
	ns := admin1.must(admin1.do(newSQE(adminIdentify, 1, 0), nil, false, 4096)).data
	if ns[31] != 0xff {
		t.Fatalf("RESCAP %#x", ns[31])
	}

	status := func(in *initiator, sqe, out []byte, inLen int) result {
		t.Helper()
		r, err := in.do(sqe, out, len(out) > 0, inLen)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	expect := func(in *initiator, sqe, out []byte, want uint16) {
		t.Helper()
		inLen := 0
		if sqe[0] == ioRead {
			inLen = 512
		}
		if r := status(in, sqe, out, inLen); r.status != want {
			t.Fatalf("opcode %#x cdw10 %#x: status %#x, want %#x", sqe[0], binary.LittleEndian.Uint32(sqe[40:]), r.status, want)
		}
	}
	block := make([]byte, 512)
	report := func(in *initiator) []byte {
		t.Helper()
		r := status(in, newSQE(ioResvReport, 1, 4096/4-1, 1), nil, 4096)
		if r.status != 0 {
			t.Fatalf("report: status %#x", r.status)
		}
		return r.data
	}

	expect(h1, newSQE(ioResvRegister, 1, 0), resvData(0, 0xa), 0)
	expect(h1, newSQE(ioResvRegister, 1, 0), resvData(0, 0xa), 0)    // again, same key: success
	expect(h1, newSQE(ioResvRegister, 1, 0), resvData(0, 0xf), 0x83) // another key: conflict
	expect(h2, newSQE(ioResvRegister, 1, 0), resvData(0, 0xb), 0)
	expect(h1, newSQE(ioResvAcquire, 1, 1<<8), resvData(0xa, 0), 0) // Write Exclusive
	expect(h2, newSQE(ioResvAcquire, 1, 1<<8), resvData(0xb, 0), 0x83)
	expect(h2, rw(ioWrite, 0, 1), block, 0x83)
	expect(h2, rw(ioRead, 0, 1), nil, 0)
	expect(h1, rw(ioWrite, 0, 1), block, 0)

	d := report(h2)
	if gen, rtype, regctl := binary.LittleEndian.Uint32(d[0:]), d[4], binary.LittleEndian.Uint16(d[5:]); gen != 2 || rtype != 1 || regctl != 2 {
		t.Fatalf("report: generation %d type %d registrants %d", gen, rtype, regctl)
	}
	e := d[64:128]
	if e[2] != 1 || binary.LittleEndian.Uint64(e[8:]) != 0xa || e[16] != 1 {
		t.Fatalf("report: first registrant % x", e)
	}

	// h2 preempts h1 as Exclusive Access: h1 is unregistered and may not
	// even read.
	expect(h2, newSQE(ioResvAcquire, 1, 1|2<<8), resvData(0xb, 0xa), 0)
	expect(h1, rw(ioRead, 0, 1), nil, 0x83)
	expect(h1, newSQE(ioResvAcquire, 1, 2<<8), resvData(0xa, 0), 0x83)
	// Release with the wrong type, then the right one.
	if r := status(h2, newSQE(ioResvRelease, 1, 1<<8), resvData(0xb), 0); r.status == 0 {
		t.Fatal("release of another type succeeded")
	}
	expect(h2, newSQE(ioResvRelease, 1, 2<<8), resvData(0xb), 0)
	expect(h1, rw(ioRead, 0, 1), nil, 0)
	// Clear: nobody registered.
	expect(h2, newSQE(ioResvRelease, 1, 1), resvData(0xb), 0)
	if d := report(h1); binary.LittleEndian.Uint16(d[5:]) != 0 || d[4] != 0 {
		t.Fatalf("after clear: % x", d[:24])
	}
	// Unregister needs the current key unless IEKEY.
	expect(h1, newSQE(ioResvRegister, 1, 0), resvData(0, 0xc), 0)
	expect(h1, newSQE(ioResvRegister, 1, 1), resvData(0xd, 0), 0x83)
	expect(h1, newSQE(ioResvRegister, 1, 1|8), resvData(0xd, 0), 0)
}

// Two targets (two access nodes), each with its own cache over one store:
// a reservation acquired through one is enforced on the other as soon as
// the Acquire completes, though the other read the state just before.
func TestReservationsAcrossTargets(t *testing.T) {
	shared := reservation.NewMemStore()
	ttl := 100 * time.Millisecond
	_, addrA, _ := startServer(t, func(c *Config) { c.Reservations = reservation.NewCached(shared, ttl) })
	_, addrB, _ := startServer(t, func(c *Config) { c.Reservations = reservation.NewCached(shared, ttl) })
	_, h1 := sessionAs(t, addrA, false, false, [16]byte{1})
	_, h2 := sessionAs(t, addrB, false, false, [16]byte{2})
	block := make([]byte, 512)
	do := func(in *initiator, sqe, out []byte, inLen int) uint16 {
		t.Helper()
		r, err := in.do(sqe, out, len(out) > 0 && len(out) <= 4096, inLen)
		if err != nil {
			t.Fatal(err)
		}
		return r.status
	}
	if st := do(h1, newSQE(ioResvRegister, 1, 0), resvData(0, 0xa), 0); st != 0 {
		t.Fatalf("register: %#x", st)
	}
	for i := range 5 {
		// B reads the state (its cache is fresh), then A acquires.
		if st := do(h2, rw(ioWrite, 0, 1), block, 0); st != 0 {
			t.Fatalf("round %d: write through B before the reservation: %#x", i, st)
		}
		if st := do(h1, newSQE(ioResvAcquire, 1, 2<<8), resvData(0xa, 0), 0); st != 0 {
			t.Fatalf("round %d: acquire through A: %#x", i, st)
		}
		if st := do(h2, rw(ioRead, 0, 1), nil, 512); st != scResvConflict {
			t.Fatalf("round %d: read through B right after the acquire through A: status %#x, want reservation conflict", i, st)
		}
		if st := do(h1, newSQE(ioResvRelease, 1, 2<<8), resvData(0xa), 0); st != 0 {
			t.Fatalf("round %d: release: %#x", i, st)
		}
	}
}
