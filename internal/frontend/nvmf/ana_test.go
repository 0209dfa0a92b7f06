package nvmf

import (
	"encoding/binary"
	"strings"
	"testing"
)

// send writes one command without waiting for its response (an AER).
func (in *initiator) send(sqe []byte) uint16 {
	in.cid++
	binary.LittleEndian.PutUint16(sqe[2:], in.cid)
	sqe[39] = sglTransport
	hdr := make([]byte, capsuleLen)
	copy(hdr[chLen:], sqe)
	if _, err := in.nc.Write(in.pdu(pduCapsuleCmd, 0, hdr, nil)); err != nil {
		in.t.Fatal(err)
	}
	return in.cid
}

// response reads the next PDU, which must be the response to cid.
func (in *initiator) response(cid uint16) (status uint16, dw0 uint32) {
	in.t.Helper()
	typ, _, h, _, err := in.read()
	if err != nil || typ != pduCapsuleRsp {
		in.t.Fatalf("want a response to cid %d: PDU %#x, %v", cid, typ, err)
	}
	q := h[chLen:]
	if got := binary.LittleEndian.Uint16(q[12:]); got != cid {
		in.t.Fatalf("response to cid %d, want %d", got, cid)
	}
	return binary.LittleEndian.Uint16(q[14:]) >> 1 & 0x7ff, binary.LittleEndian.Uint32(q[0:])
}

func anaLogState(t *testing.T, admin *initiator, rae bool) (state byte, chg uint64) {
	t.Helper()
	cdw10 := uint32(logANA | (4096/4-1)<<16)
	if rae {
		cdw10 |= 1 << 15
	}
	page := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, cdw10), nil, false, 4096)).data
	if n := binary.LittleEndian.Uint16(page[8:]); n != 1 {
		t.Fatalf("ANA log: %d groups, want 1", n)
	}
	g := page[16:]
	if binary.LittleEndian.Uint32(g[0:]) != 1 || binary.LittleEndian.Uint32(g[4:]) != 1 || binary.LittleEndian.Uint32(g[32:]) != 1 {
		t.Fatalf("ANA group descriptor %v: want group 1 with NSID 1", g[:36])
	}
	return g[16], binary.LittleEndian.Uint64(page[0:])
}

// TestMultipathANA: a Multipath server reports the state SetPaths gives it
// in the ANA log, sends an ANA change notice on an AER when it changes,
// refuses I/O with ANA Inaccessible when inaccessible, attaches the volume
// only at the first I/O, gives out controller ids of its node, and lists
// every port in the discovery log.
func TestMultipathANA(t *testing.T) {
	key := PathKey{VolumeNQNPrefix + "vol", hostA, 1}
	ports := []Port{{1, "10.0.0.1:4420"}, {2, "10.0.0.2:4420"}, {3, "10.0.0.3:4421"}}
	s, addr, disk := startServer(t, func(c *Config) { c.Multipath, c.NodeID = true, 2 })
	s.SetPaths(Paths{Ports: ports, States: map[PathKey]ANAState{key: ANANonOptimized}})
	admin, ioq := session(t, addr, false, false)
	if admin.cntlid>>12 != 2 || admin.cntlid&0xfff == 0 {
		t.Fatalf("cntlid %#x: want node 2's range 0x2001..0x2fff", admin.cntlid)
	}
	if h := s.Hosts(); len(h) != 1 || h[0].Host != hostA || h[0].Subsystem != key.Subsystem {
		t.Fatalf("Hosts() = %v", h)
	}
	id := admin.must(admin.do(newSQE(adminIdentify, 0, 1), nil, false, 4096)).data
	if id[76] != 0x0b || binary.LittleEndian.Uint32(id[92:])&aenANAEnabled == 0 || id[343]&(1<<1|1<<2|1<<3) != 0x0e ||
		binary.LittleEndian.Uint32(id[344:]) != 1 || binary.LittleEndian.Uint32(id[348:]) != 1 {
		t.Fatalf("identify: CMIC %#x OAES %#x ANACAP %#x ANAGRPMAX %d NANAGRPID %d", id[76],
			binary.LittleEndian.Uint32(id[92:]), id[343], binary.LittleEndian.Uint32(id[344:]), binary.LittleEndian.Uint32(id[348:]))
	}
	if st, _ := anaLogState(t, admin, false); st != byte(ANANonOptimized) {
		t.Fatalf("ANA state %d, want non-optimized", st)
	}
	if disk.opens() != 0 {
		t.Fatal("the volume was attached before any I/O")
	}
	admin.must(admin.do(newSQE(adminSetFeatures, 0, 0x0b, aenANAEnabled), nil, false, 0))
	aer := admin.send(newSQE(adminAsyncEvent, 0))
	_, chg0 := anaLogState(t, admin, true)
	_ = aer
	s.SetPaths(Paths{Ports: ports, States: map[PathKey]ANAState{key: ANAOptimized}})
	if st, dw0 := admin.response(aer); st != scSuccess || dw0 != aenANAChange {
		t.Fatalf("AER: status %#x dw0 %#x, want an ANA change notice %#x", st, dw0, aenANAChange)
	}
	if st, chg := anaLogState(t, admin, false); st != byte(ANAOptimized) || chg <= chg0 {
		t.Fatalf("after the change: state %d change count %d (was %d)", st, chg, chg0)
	}
	data := make([]byte, 4096)
	data[0] = 0xab
	ioq.must(ioq.do(rw(ioWrite, 8, 8), data, true, 0))
	if disk.opens() != 1 {
		t.Fatalf("%d opens after the first write, want 1", disk.opens())
	}
	// Inaccessible: I/O gets ANA Inaccessible (no DNR: the host retries on
	// another path); the notice waits for the next AER.
	s.SetPaths(Paths{Ports: ports, States: map[PathKey]ANAState{key: ANAInaccessible}})
	if r, _ := ioq.do(rw(ioRead, 8, 8), nil, false, 4096); r.status != scANAInaccessible || r.dnr {
		t.Fatalf("read on an inaccessible path: status %#x dnr %v", r.status, r.dnr)
	}
	aer = admin.send(newSQE(adminAsyncEvent, 0))
	if st, dw0 := admin.response(aer); st != scSuccess || dw0 != aenANAChange {
		t.Fatalf("AER after a change: status %#x dw0 %#x", st, dw0)
	}
	if st, _ := anaLogState(t, admin, false); st != byte(ANAInaccessible) {
		t.Fatalf("state %d, want inaccessible", st)
	}

	// Discovery: one record per port.
	d := dialInit(t, addr, false, false)
	d.must(d.connect(DiscoveryNQN, hostA, 0, 0xffff, 0))
	page := d.must(d.do(newSQE(adminGetLogPage, 0, logDiscovery|(4096/4-1)<<16), nil, false, 4096)).data
	if n := binary.LittleEndian.Uint64(page[8:]); n != 3 {
		t.Fatalf("%d discovery records, want 3", n)
	}
	for i, p := range ports {
		e := page[1024*(i+1):]
		host, port, _ := strings.Cut(p.Addr, ":")
		if binary.LittleEndian.Uint16(e[4:]) != uint16(p.ID) || strings.TrimSpace(string(e[512:768])) != host ||
			strings.TrimSpace(string(e[32:64])) != port || strings.TrimRight(string(e[256:512]), "\x00") != key.Subsystem {
			t.Fatalf("record %d: portid %d traddr %q trsvcid %q", i, binary.LittleEndian.Uint16(e[4:]), e[512:530], e[32:40])
		}
	}
}
