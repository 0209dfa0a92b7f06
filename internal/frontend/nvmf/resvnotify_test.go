package nvmf

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/nvmftshark"
	"github.com/basalt-storage/basalt/internal/reservation"
)

// resvLogEntry reads log page 80h (RAE as given) and returns its Log Page
// Count, type, number of available pages and NSID.
func resvLogEntry(t *testing.T, admin *initiator, rae bool) (count uint64, typ, avail byte, nsid uint32) {
	t.Helper()
	cdw10 := uint32(logResvNotify | (64/4-1)<<16)
	if rae {
		cdw10 |= 1 << 15
	}
	p := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, cdw10), nil, false, 64)).data
	return binary.LittleEndian.Uint64(p[0:]), p[8], p[9], binary.LittleEndian.Uint32(p[12:])
}

// TestReservationNotifications: three hosts on one namespace through two
// access nodes (two targets, each with its own cache over one store). When
// host 2, through node B, preempts host 1's registration, host 1's
// controller on node A completes its held AER with Reservation Log Page
// Available (type 6, log page 80h) and log page 80h gives one Registration
// Preempted entry (then none); a registrants-only reservation released
// gives host 3 Reservation Released; a type masked by feature 82h is not
// logged, a clear then gives Reservation Preempted. Feature 83h reports
// the namespace's PTPL and refuses a change; a Get Log Page 80h with a bad
// offset or length gets Invalid Field and takes no entry. tshark decodes
// the notices.
func TestReservationNotifications(t *testing.T) {
	shared := reservation.NewMemStore()
	ttl := 100 * time.Millisecond
	mod := func(c *Config) {
		c.Reservations = reservation.NewCached(shared, ttl)
		c.ReservationCheck = 20 * time.Millisecond
	}
	_, addrA, _ := startServer(t, mod)
	_, addrB, _ := startServer(t, mod)
	capture := nvmftshark.Start(t, addrA)
	admin1, h1 := sessionAs(t, addrA, true, true, [16]byte{1})
	admin2, h2 := sessionAs(t, addrB, true, true, [16]byte{2})
	admin3, h3 := sessionAs(t, addrA, true, true, [16]byte{3})
	resv := func(in *initiator, sqe, data []byte) {
		t.Helper()
		in.must(in.do(sqe, data, true, 0))
	}
	const regOnly = 3 // Write Exclusive - Registrants Only

	if r := admin1.must(admin1.do(newSQE(adminGetFeatures, 1, featResvMask), nil, false, 0)); r.dw0 != 0 {
		t.Fatalf("Reservation Notification Mask %#x, want none masked", r.dw0)
	}
	if r, _ := admin1.do(newSQE(adminSetFeatures, 1, featResvPersist, 1), nil, false, 0); r.status != scFeatureNotChangeable || !r.dnr {
		t.Fatalf("Set Features 83h: status %#x dnr %v, want Feature Not Changeable with DNR", r.status, r.dnr)
	}
	resv(h1, newSQE(ioResvRegister, 1, 0), resvData(0, 0xa))
	resv(h3, newSQE(ioResvRegister, 1, 0), resvData(0, 0xc))
	resv(h2, newSQE(ioResvRegister, 1, 3<<30), resvData(0, 0xb)) // CPTPL: persist through power loss (the last register sets it)
	if r := admin2.must(admin2.do(newSQE(adminGetFeatures, 1, featResvPersist), nil, false, 0)); r.dw0 != 1 {
		t.Fatalf("Reservation Persistence %#x after a register with CPTPL, want PTPL", r.dw0)
	}
	resv(h1, newSQE(ioResvAcquire, 1, regOnly<<8), resvData(0xa, 0))
	if _, typ, _, _ := resvLogEntry(t, admin1, false); typ != 0 {
		t.Fatalf("log page 80h before any notification: type %d, want empty", typ)
	}

	// Host 2 preempts host 1 (same type): host 1's registration goes.
	aer1 := admin1.send(newSQE(adminAsyncEvent, 0))
	aer3 := admin3.send(newSQE(adminAsyncEvent, 0))
	resv(h2, newSQE(ioResvAcquire, 1, 1|regOnly<<8), resvData(0xb, 0xa))
	if st, dw0 := admin1.response(aer1); st != scSuccess || dw0 != 0x800006 {
		t.Fatalf("host 1's AER: status %#x dw0 %#x, want Reservation Log Page Available 0x800006", st, dw0)
	}
	c1, typ, avail, nsid := resvLogEntry(t, admin1, false)
	if c1 == 0 || typ != resvRegPreempted || avail != 0 || nsid != 1 {
		t.Fatalf("host 1's log page 80h: count %d type %d available %d nsid %d, want Registration Preempted on 1", c1, typ, avail, nsid)
	}
	if _, typ, _, _ := resvLogEntry(t, admin1, false); typ != 0 {
		t.Fatalf("log page 80h read twice: type %d, want empty", typ)
	}

	// Host 2 releases its registrants-only reservation: host 3 (still
	// registered) learns of it.
	resv(h2, newSQE(ioResvRelease, 1, regOnly<<8), resvData(0xb))
	if st, dw0 := admin3.response(aer3); st != scSuccess || dw0 != aenResvLog {
		t.Fatalf("host 3's AER: status %#x dw0 %#x", st, dw0)
	}
	if _, typ, _, _ := resvLogEntry(t, admin3, false); typ != resvResReleased {
		t.Fatalf("host 3's entry: type %d, want Reservation Released", typ)
	}

	// Host 3 masks Reservation Released: the next release is not logged;
	// a clear is, as Reservation Preempted.
	admin3.must(admin3.do(newSQE(adminSetFeatures, 1, featResvMask, 1<<resvResReleased), nil, false, 0))
	if r := admin3.must(admin3.do(newSQE(adminGetFeatures, 1, featResvMask), nil, false, 0)); r.dw0 != 1<<resvResReleased {
		t.Fatalf("mask %#x after setting it", r.dw0)
	}
	aer3 = admin3.send(newSQE(adminAsyncEvent, 0))
	resv(h2, newSQE(ioResvAcquire, 1, regOnly<<8), resvData(0xb, 0))
	resv(h2, newSQE(ioResvRelease, 1, regOnly<<8), resvData(0xb))
	resv(h2, newSQE(ioResvRelease, 1, 1), resvData(0xb)) // clear
	if st, dw0 := admin3.response(aer3); st != scSuccess || dw0 != aenResvLog {
		t.Fatalf("host 3's AER after the clear: status %#x dw0 %#x", st, dw0)
	}
	for _, bad := range [][]uint32{
		{logResvNotify | (64/4-1)<<16, 0, 68}, // offset past the page
		{logResvNotify | (64/4-1)<<16, 0, 6},  // offset not a dword
		{logResvNotify | 0xffff<<16, 0xffff},  // 16 GiB
	} {
		if r, _ := admin3.do(newSQE(adminGetLogPage, 0xffffffff, bad...), nil, false, 64); r.status != scInvalidField || !r.dnr {
			t.Fatalf("Get Log Page 80h cdw10-12 %#x: status %#x dnr %v, want Invalid Field with DNR", bad, r.status, r.dnr)
		}
	}
	// A fresh round may still be logging: the first entry is what counts.
	if c, typ, _, _ := resvLogEntry(t, admin3, false); typ != resvResPreempted || c == 0 {
		t.Fatalf("host 3's entry after the masked release and the clear: count %d type %d, want Reservation Preempted", c, typ)
	}
	admin1.Close()
	h1.Close()
	admin3.Close()
	h3.Close()
	_ = admin2

	if capture == nil {
		t.Log("no capture: tshark or dumpcap missing or not allowed to capture (see above)")
		return
	}
	capture.Check(t, 4, nvmftshark.Want{Digests: true, PDUs: map[int]int{nvmftshark.ICReq: 4}})
	if n := capture.Count(t, "nvme.cqe.dword0.aev.aet == 6 && nvme.cqe.dword0.aev.aei == 0 && nvme.cqe.dword0.aev.lpi == 0x80"); n != 3 {
		t.Errorf("tshark decodes %d reservation log notices, want 3", n)
	}
}
