package scsi

import (
	"testing"
)

var (
	cdbTUR         = []byte{0x00, 0, 0, 0, 0, 0}
	cdbInquiry     = []byte{0x12, 0, 0, 0, 96, 0}
	cdbReportLuns  = []byte{0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0}
	cdbRequestSens = []byte{0x03, 0, 0, 0, 18, 0}
)

// senseOf is a result's sense key, ASC and ASCQ (zero when GOOD).
func senseOf(r Result) [3]byte {
	if r.Sense == nil {
		return [3]byte{}
	}
	return [3]byte{r.Sense.Key, r.Sense.ASC, r.Sense.ASCQ}
}

var (
	uaReset    = [3]byte{KeyUnitAttention, 0x29, 0x03}
	uaCapacity = [3]byte{KeyUnitAttention, 0x2a, 0x09}
)

// A LUN reset through one session raises a unit attention on every session
// of the volume, reported once each; INQUIRY and REPORT LUNS neither report
// nor clear it; a closed session's LU is no longer in the group.
func TestResetRaisesAttentionOnEveryNexus(t *testing.T) {
	b := newDisk(t, 1<<20, false)
	g := NewGroup()
	open := func() *LU {
		return New(Config{Backend: b, Info: b.Info(), ID: 42, TargetName: "iqn.2026-11.io.basalt:c:v", Group: g})
	}
	a, c := open(), open()
	gone := open()
	gone.Close()
	if g.Len() != 2 {
		t.Fatalf("group has %d LUs, want 2", g.Len())
	}
	for _, lu := range []*LU{a, c} {
		if r := run(t, lu, cdbTUR, nil); r.Status != StatusGood {
			t.Fatalf("TUR before any reset: status %#x sense %x", r.Status, senseOf(r))
		}
	}
	a.Reset()
	for i, lu := range []*LU{a, c} {
		for _, cdb := range [][]byte{cdbInquiry, cdbReportLuns} {
			if r := run(t, lu, cdb, nil); r.Status != StatusGood {
				t.Fatalf("LU %d: opcode %#x with a unit attention pending: status %#x sense %x, want GOOD", i, cdb[0], r.Status, senseOf(r))
			}
		}
		r := run(t, lu, cdbTUR, nil)
		if r.Status != StatusCheckCondition || senseOf(r) != uaReset {
			t.Fatalf("LU %d: first TUR after the reset: status %#x sense %x, want CHECK CONDITION %x", i, r.Status, senseOf(r), uaReset)
		}
		if r := run(t, lu, cdbTUR, nil); r.Status != StatusGood {
			t.Fatalf("LU %d: second TUR: status %#x sense %x, want GOOD (reported once)", i, r.Status, senseOf(r))
		}
	}
	if r := run(t, gone, cdbTUR, nil); r.Status != StatusGood {
		t.Fatalf("closed LU got the reset's unit attention: sense %x", senseOf(r))
	}
}

// REQUEST SENSE returns a pending unit attention as its data (fixed or
// descriptor format) and clears it.
func TestRequestSenseReturnsAndClearsAttention(t *testing.T) {
	lu := newLU(t, 1<<20, false)
	lu.Reset()
	r := run(t, lu, cdbRequestSens, nil)
	if r.Status != StatusGood || len(r.Data) < 14 || r.Data[0]&0x7f != 0x70 || r.Data[2] != KeyUnitAttention || r.Data[12] != 0x29 || r.Data[13] != 0x03 {
		t.Fatalf("REQUEST SENSE with a reset pending: status %#x data % x", r.Status, r.Data)
	}
	r = run(t, lu, cdbRequestSens, nil)
	if r.Status != StatusGood || len(r.Data) < 14 || r.Data[2] != KeyNoSense || r.Data[12] != 0 {
		t.Fatalf("second REQUEST SENSE: status %#x data % x, want NO SENSE", r.Status, r.Data)
	}
	lu.Reset()
	r = run(t, lu, []byte{0x03, 1, 0, 0, 8, 0}, nil) // DESC=1
	if r.Status != StatusGood || len(r.Data) != 8 || r.Data[0] != 0x72 || r.Data[1] != KeyUnitAttention || r.Data[2] != 0x29 || r.Data[3] != 0x03 {
		t.Fatalf("REQUEST SENSE (descriptor format) with a reset pending: status %#x data % x", r.Status, r.Data)
	}
}

// A resize is reported to each session once, as CAPACITY DATA HAS CHANGED,
// and READ CAPACITY then returns the new size.
func TestCapacityChangeRaisesAttention(t *testing.T) {
	b := newDisk(t, 1<<20, false)
	g := NewGroup()
	lus := []*LU{
		New(Config{Backend: b, Info: b.Info(), Group: g}),
		New(Config{Backend: b, Info: b.Info(), Group: g}),
	}
	if r := run(t, lus[0], cdbTUR, nil); r.Status != StatusGood {
		t.Fatalf("TUR before the resize: sense %x", senseOf(r))
	}
	b.Grow(1 << 20)
	for i, lu := range lus {
		r := run(t, lu, cdbTUR, nil)
		if r.Status != StatusCheckCondition || senseOf(r) != uaCapacity {
			t.Fatalf("LU %d: TUR after the resize: status %#x sense %x, want %x", i, r.Status, senseOf(r), uaCapacity)
		}
		r = run(t, lu, []byte{0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0}, nil) // READ CAPACITY(10)
		if r.Status != StatusGood || len(r.Data) != 8 {
			t.Fatalf("LU %d: READ CAPACITY after the attention: status %#x sense %x", i, r.Status, senseOf(r))
		}
		if last := uint32(r.Data[0])<<24 | uint32(r.Data[1])<<16 | uint32(r.Data[2])<<8 | uint32(r.Data[3]); int(last+1)*lu.BlockSize() != 2<<20 {
			t.Fatalf("LU %d: READ CAPACITY says %d blocks of %d, want 2 MiB", i, last+1, lu.BlockSize())
		}
	}
}
