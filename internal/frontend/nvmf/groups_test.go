package nvmf

import (
	"encoding/binary"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/nvmftshark"
)

// TestGroupEdit: a group subsystem edited while a host is connected. Each
// edit completes the host's AER with a Namespace Attribute Changed notice
// (log page 04h), the Changed Namespace List names the NSIDs that changed
// (then is empty), and Identify, the ANA log, Hosts and I/O follow: a
// volume appended is a new namespace whose writes reach it; volumes
// removed are gone (Invalid Namespace); a volume whose allow-list refuses
// the host gets no namespace. tshark decodes the notices.
func TestGroupEdit(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	disks := frontendtest.Disks{"a": newDisk(1 << 20), "b": newDisk(1 << 20), "c": newDisk(2 << 20), "d": newDisk(1 << 20)}
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: disks, Logger: quiet})
	lists := &hostLists{lists: map[string][]string{"d": {hostB}}}
	s, addr := serve(t, Config{Exports: ex, Logger: quiet, Multipath: true, NodeID: 1, VolumeHostAllowed: lists.allowed})
	capture := nvmftshark.Start(t, addr)
	const group = GroupNQNPrefix + "g"
	setGroup := func(vols ...string) { s.SetPaths(Paths{Groups: map[string][]string{group: vols}}) }
	setGroup("a", "b")

	admin := dialInit(t, addr, true, true)
	admin.must(admin.connect(group, hostA, 0, 0xffff, 0))
	admin.must(admin.do(newSQE(adminSetFeatures, 0, 0x07, 0), nil, false, 0))
	ioq := dialInit(t, addr, true, true)
	ioq.must(ioq.connect(group, hostA, 1, admin.cntlid, 0))
	admin.must(admin.do(newSQE(adminSetFeatures, 0, 0x0b, aenNSEnabled|aenANAEnabled), nil, false, 0))

	active := func() []uint32 {
		t.Helper()
		list := admin.must(admin.do(newSQE(adminIdentify, 0, 2), nil, false, 4096)).data
		var ids []uint32
		for i := 0; i < len(list); i += 4 {
			if id := binary.LittleEndian.Uint32(list[i:]); id != 0 {
				ids = append(ids, id)
			}
		}
		return ids
	}
	changed := func() []uint32 {
		t.Helper()
		page := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, logChangedNS|(4096/4-1)<<16), nil, false, 4096)).data
		var ids []uint32
		for i := 0; i < len(page); i += 4 {
			if id := binary.LittleEndian.Uint32(page[i:]); id != 0 {
				ids = append(ids, id)
			}
		}
		return ids
	}
	anaGroups := func() []uint32 {
		t.Helper()
		page := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, logANA|(4096/4-1)<<16), nil, false, 4096)).data
		var ids []uint32
		for i := range int(binary.LittleEndian.Uint16(page[8:])) {
			ids = append(ids, binary.LittleEndian.Uint32(page[16+36*i:]))
		}
		return ids
	}
	notice := func(why string, wantChanged ...uint32) {
		t.Helper()
		aer := admin.send(newSQE(adminAsyncEvent, 0))
		if why == "append" {
			setGroup("a", "b", "c")
		} else if why == "shrink" {
			setGroup("a")
		} else {
			setGroup("a", "d", "c")
		}
		if st, dw0 := admin.response(aer); st != scSuccess || dw0 != aenNSChanged {
			t.Fatalf("%s: AER status %#x dw0 %#x, want a namespace attribute notice %#x", why, st, dw0, aenNSChanged)
		}
		if got := changed(); !slices.Equal(got, wantChanged) {
			t.Fatalf("%s: Changed Namespace List %v, want %v", why, got, wantChanged)
		}
		if got := changed(); len(got) != 0 {
			t.Fatalf("%s: Changed Namespace List after a read without RAE: %v", why, got)
		}
	}

	// Append c: NSID 3.
	notice("append", 3)
	if got := active(); !slices.Equal(got, []uint32{1, 2, 3}) {
		t.Fatalf("active namespaces %v after the append", got)
	}
	ns3 := admin.must(admin.do(newSQE(adminIdentify, 3, 0), nil, false, 4096)).data
	nguid, _ := ids("c")
	if binary.LittleEndian.Uint64(ns3) != 4096 || !slices.Equal(ns3[104:120], nguid[:]) || binary.LittleEndian.Uint32(ns3[92:]) != 3 {
		t.Fatalf("namespace 3: NSZE %d ANAGRPID %d, want volume c's size and NGUID, group 3", binary.LittleEndian.Uint64(ns3), binary.LittleEndian.Uint32(ns3[92:]))
	}
	if got := anaGroups(); !slices.Equal(got, []uint32{1, 2, 3}) {
		t.Fatalf("ANA groups %v", got)
	}
	if h := s.Hosts(); len(h) != 1 || !slices.Equal(h[0].NSIDs, []uint32{1, 2, 3}) {
		t.Fatalf("Hosts() = %v", h)
	}
	data := make([]byte, 4096)
	data[0] = 0xc3
	w3 := rw(ioWrite, 0, 8)
	binary.LittleEndian.PutUint32(w3[4:], 3)
	ioq.must(ioq.do(w3, data, true, 0))
	if disks["c"].Bytes(0, 1)[0] != 0xc3 {
		t.Fatal("the write to the new namespace 3 did not reach volume c")
	}

	// Shrink to a: NSIDs 2 and 3 go.
	notice("shrink", 2, 3)
	if got := active(); !slices.Equal(got, []uint32{1}) {
		t.Fatalf("active namespaces %v after the shrink", got)
	}
	if r, _ := ioq.do(w3, data, true, 0); r.status != scInvalidNS || !r.dnr {
		t.Fatalf("write to the removed namespace 3: status %#x dnr %v, want Invalid Namespace with DNR", r.status, r.dnr)
	}
	if got := anaGroups(); !slices.Equal(got, []uint32{1}) {
		t.Fatalf("ANA groups %v after the shrink", got)
	}

	// a, d, c: d's allow-list leaves hostA out, so NSID 2 stays inactive
	// (Identify Namespace all zeros) and only 3 changed.
	notice("a d c", 3)
	if got := active(); !slices.Equal(got, []uint32{1, 3}) {
		t.Fatalf("active namespaces %v, want 1 and 3 (d refuses the host)", got)
	}
	if ns2 := admin.must(admin.do(newSQE(adminIdentify, 2, 0), nil, false, 4096)).data; binary.LittleEndian.Uint64(ns2) != 0 {
		t.Fatal("Identify of the inactive NSID 2 is not all zeros")
	}
	if r, _ := admin.do(newSQE(adminIdentify, groupNSMax+1, 0), nil, false, 4096); r.status != scInvalidNS {
		t.Fatalf("Identify of an NSID past NN: status %#x, want Invalid Namespace", r.status)
	}
	ioq.must(ioq.do(w3, data, true, 0))

	admin.Close()
	ioq.Close()
	if capture == nil {
		t.Log("no capture: tshark or dumpcap missing or not allowed to capture (see above)")
		return
	}
	capture.Check(t, 2, nvmftshark.Want{Digests: true, PDUs: map[int]int{nvmftshark.ICReq: 2}})
	if n := capture.Count(t, "nvme.cqe.dword0.aev.aet == 2 && nvme.cqe.dword0.aev.aei == 0 && nvme.cqe.dword0.aev.lpi == 4"); n != 3 {
		t.Errorf("tshark decodes %d namespace attribute notices, want 3", n)
	}
}
