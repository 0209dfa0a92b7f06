package scsi

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/pkg/api"
)

func getLBAStatus(lba uint64, alloc uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0], cdb[1] = 0x9e, 0x12
	binary.BigEndian.PutUint64(cdb[2:], lba)
	binary.BigEndian.PutUint32(cdb[10:], alloc)
	return cdb
}

// descriptors decodes GET LBA STATUS data as "lba+n:status" strings.
func descriptors(t *testing.T, r Result) []string {
	t.Helper()
	if r.Status != StatusGood || len(r.Data) < 8 {
		t.Fatalf("GET LBA STATUS: status %#x, sense %v, %d bytes", r.Status, r.Sense, len(r.Data))
	}
	if n := binary.BigEndian.Uint32(r.Data); int(n) != len(r.Data)-4 || (n-4)%16 != 0 {
		t.Fatalf("parameter data length %d for %d bytes", n, len(r.Data))
	}
	var out []string
	for d := r.Data[8:]; len(d) >= 16; d = d[16:] {
		st := map[byte]string{0: "mapped", 1: "deallocated"}[d[12]&0x0f]
		out = append(out, fmt.Sprintf("%d+%d:%s", binary.BigEndian.Uint64(d), binary.BigEndian.Uint32(d[8:]), st))
	}
	return out
}

// GET LBA STATUS reports the blocks the backend's map says hold no data as
// deallocated, from the starting LBA, as many runs as the allocation length
// takes; the device's tail the map does not cover is mapped.
func TestGetLBAStatusFromTheMap(t *testing.T) {
	const size = 1<<20 + 8<<10      // 2064 blocks: the last 16 past the last whole MapAlign
	b := frontendtest.NewDisk(size) // thin: frontendtest.Disk.Mapped
	b.T = t
	var fail atomic.Pointer[error]
	b.Fail = func(op api.Op, _, _ int64) error {
		if p := fail.Load(); p != nil && op == api.OpMapped {
			return *p
		}
		return nil
	}
	lu := New(Config{Backend: b, Info: b.Info(), ID: 1, TargetName: "iqn.2026-11.io.basalt:c:v"})
	want := func(what string, got []string, w ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s: %v, want %v", what, got, w)
		}
	}
	want("a new device", descriptors(t, run(t, lu, getLBAStatus(0, 1024), nil)), "0+2048:deallocated", "2048+16:mapped")
	// 4 KiB at block 64, and one block at 1000 (its granule: 1000..1007).
	if r := run(t, lu, cdb10(0x2a, 64, 8), make([]byte, 4096)); r.Status != StatusGood {
		t.Fatal(r.Sense)
	}
	if r := run(t, lu, cdb10(0x2a, 1001, 1), make([]byte, 512)); r.Status != StatusGood {
		t.Fatal(r.Sense)
	}
	want("after writes", descriptors(t, run(t, lu, getLBAStatus(0, 1024), nil)),
		"0+64:deallocated", "64+8:mapped", "72+928:deallocated", "1000+8:mapped", "1008+1040:deallocated", "2048+16:mapped")
	want("from inside a run", descriptors(t, run(t, lu, getLBAStatus(66, 1024), nil)),
		"66+6:mapped", "72+928:deallocated", "1000+8:mapped", "1008+1040:deallocated", "2048+16:mapped")
	want("one descriptor's room", descriptors(t, run(t, lu, getLBAStatus(66, 24), nil)), "66+6:mapped")
	want("in the tail", descriptors(t, run(t, lu, getLBAStatus(2050, 1024), nil)), "2050+14:mapped")
	// UNMAP of the 4 KiB frees it again.
	unmap := []byte{0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0}
	param := make([]byte, 24)
	binary.BigEndian.PutUint16(param[0:], 22)
	binary.BigEndian.PutUint16(param[2:], 16)
	binary.BigEndian.PutUint64(param[8:], 64)
	binary.BigEndian.PutUint32(param[16:], 8)
	if r := run(t, lu, unmap, param); r.Status != StatusGood {
		t.Fatal(r.Sense)
	}
	want("after UNMAP", descriptors(t, run(t, lu, getLBAStatus(0, 1024), nil)),
		"0+1000:deallocated", "1000+8:mapped", "1008+1040:deallocated", "2048+16:mapped")
	// Past the end: refused; a map that cannot be read: the failure's sense.
	if r := run(t, lu, getLBAStatus(size/512, 1024), nil); r.Status != StatusCheckCondition {
		t.Errorf("GET LBA STATUS past the end: status %#x", r.Status)
	}
	away := fmt.Errorf("%w: the chunkservers are away", frontend.ErrUnavailable)
	fail.Store(&away)
	if r := run(t, lu, getLBAStatus(0, 1024), nil); r.Status != StatusCheckCondition || r.Sense == nil {
		t.Errorf("GET LBA STATUS with the map unreadable: status %#x", r.Status)
	} else if s := senseOf(r); s[0] != 0x02 {
		t.Errorf("GET LBA STATUS with the map unreadable: sense %x, want NOT READY", s)
	}
}

// cdb10 is a 10-byte READ/WRITE CDB.
func cdb10(op byte, lba uint32, blocks uint16) []byte {
	c := make([]byte, 10)
	c[0] = op
	binary.BigEndian.PutUint32(c[2:], lba)
	binary.BigEndian.PutUint16(c[7:], blocks)
	return c
}

// The provisioning granularity an initiator sees: one logical block per
// physical block (READ CAPACITY(16)'s exponent 0; an initiator that took
// 8 for the unit GET LBA STATUS answers in failed on a 4 KiB exponent),
// and the backend's 4 KiB as the Block Limits page's optimal transfer and
// unmap granularity, aligned at LBA 0 (UGAVALID). An UNMAP of one block
// zeroes it and leaves its granule mapped; GET LBA STATUS from the next
// block starts there.
func TestProvisioningGranularity(t *testing.T) {
	b := newDisk(t, 1<<20, false)
	lu := New(Config{Backend: b, Info: b.Info(), ID: 1})
	r := run(t, lu, []byte{0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}, nil)
	if r.Status != StatusGood || r.Data[13]&0x0f != 0 || r.Data[14]&0xc0 != 0xc0 {
		t.Fatalf("READ CAPACITY(16): status %#x data % x; want exponent 0, LBPME and LBPRZ", r.Status, r.Data)
	}
	r = run(t, lu, []byte{0x12, 1, 0xb0, 0, 64, 0}, nil)
	if r.Status != StatusGood || len(r.Data) < 36 {
		t.Fatalf("Block Limits: status %#x, %d bytes", r.Status, len(r.Data))
	}
	optXfer, optUnmap, align := binary.BigEndian.Uint16(r.Data[6:]), binary.BigEndian.Uint32(r.Data[28:]), binary.BigEndian.Uint32(r.Data[32:])
	if optXfer != 8 || optUnmap != 8 || align != 0x80000000 {
		t.Fatalf("Block Limits: optimal transfer granularity %d, optimal unmap granularity %d, UGAVALID|alignment %#x; want 8, 8, UGAVALID and 0",
			optXfer, optUnmap, align)
	}
	if r := run(t, lu, cdb10(0x2a, 0, 16), make([]byte, 16*512)); r.Status != StatusGood {
		t.Fatalf("WRITE: status %#x", r.Status)
	}
	unmap := []byte{0, 22, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0} // LBA 8, 1 block
	if r := run(t, lu, []byte{0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0}, unmap); r.Status != StatusGood {
		t.Fatalf("UNMAP: status %#x sense %v", r.Status, r.Sense)
	}
	if got := descriptors(t, run(t, lu, getLBAStatus(9, 24), nil)); len(got) != 1 || got[0] != "9+7:mapped" {
		t.Fatalf("GET LBA STATUS at 9 after an UNMAP of block 8: %v, want [9+7:mapped]", got)
	}
}
