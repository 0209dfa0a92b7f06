package nvmf

import (
	"encoding/binary"
	"testing"
	"time"
)

// TestNamespaceGrows: when the volume grows under a connected host, the
// controller sends a Namespace Attribute Changed notice on the host's AER,
// lists the namespace in the Changed Namespace List (log page 04h, cleared
// by a read without RAE), reports the new size in Identify Namespace and
// serves I/O in the part that was added.
func TestNamespaceGrows(t *testing.T) {
	_, addr, disk := startServerSized(t, 20*time.Millisecond, nil)
	admin, ioq := session(t, addr, false, false)
	id := admin.must(admin.do(newSQE(adminIdentify, 0, 1), nil, false, 4096)).data
	if oaes := binary.LittleEndian.Uint32(id[92:]); oaes&aenNSEnabled == 0 {
		t.Fatalf("OAES %#x: namespace attribute notices not advertised", oaes)
	}
	const oldLBAs, newLBAs = 1 << 20 / 512, 3 << 20 / 512
	if r, _ := ioq.do(rw(ioRead, oldLBAs, 8), nil, false, 4096); r.status != scLBARange {
		t.Fatalf("read past the end: status %#x, want LBA out of range", r.status)
	}
	admin.must(admin.do(newSQE(adminSetFeatures, 0, 0x0b, aenNSEnabled|aenANAEnabled), nil, false, 0))
	aer := admin.send(newSQE(adminAsyncEvent, 0))

	disk.Grow(2 << 20)
	disk.Put(3<<20-1, []byte{0x5a})
	// The read deadline of the initiator's connection (60 s) bounds the wait.
	if st, dw0 := admin.response(aer); st != scSuccess || dw0 != aenNSChanged {
		t.Fatalf("AER: status %#x dw0 %#x, want a namespace attribute notice %#x", st, dw0, aenNSChanged)
	}
	changed := func() []uint32 {
		page := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, logChangedNS|(4096/4-1)<<16), nil, false, 4096)).data
		var ids []uint32
		for i := 0; i+4 <= len(page); i += 4 {
			if id := binary.LittleEndian.Uint32(page[i:]); id != 0 {
				ids = append(ids, id)
			}
		}
		return ids
	}
	if ids := changed(); len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("Changed Namespace List %v, want [1]", ids)
	}
	if ids := changed(); len(ids) != 0 {
		t.Fatalf("Changed Namespace List after a read without RAE: %v, want empty", ids)
	}
	ns := admin.must(admin.do(newSQE(adminIdentify, 1, 0), nil, false, 4096)).data
	if nsze, ncap := binary.LittleEndian.Uint64(ns[0:]), binary.LittleEndian.Uint64(ns[8:]); nsze != newLBAs || ncap != newLBAs {
		t.Fatalf("Identify Namespace: NSZE %d NCAP %d, want %d", nsze, ncap, newLBAs)
	}
	r := ioq.must(ioq.do(rw(ioRead, newLBAs-8, 8), nil, false, 4096))
	if r.data[4095] != 0x5a {
		t.Fatalf("the last block of the grown namespace reads %#x, want 0x5a", r.data[4095])
	}
	data := make([]byte, 4096)
	data[0] = 0xab
	ioq.must(ioq.do(rw(ioWrite, oldLBAs, 8), data, true, 0))
	if got := disk.Bytes(1<<20, 1); got[0] != 0xab {
		t.Fatalf("a write in the added part landed as %#x", got[0])
	}
}
