package nvmf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/pkg/api"
)

// send writes one command without waiting for its response (an AER).
func (in *initiator) send(sqe []byte) uint16 {
	cid := in.NextCID()
	binary.LittleEndian.PutUint16(sqe[2:], cid)
	sqe[39] = sglTransport
	hdr := make([]byte, capsuleLen)
	copy(hdr[chLen:], sqe)
	if _, err := in.nc.Write(in.pdu(pduCapsuleCmd, 0, hdr, nil)); err != nil {
		in.t.Fatal(err)
	}
	return cid
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
	if disk.Opens.Load() != 0 {
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
	if disk.Opens.Load() != 1 {
		t.Fatalf("%d opens after the first write, want 1", disk.Opens.Load())
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

	// Discovery: one record per port, of the subsystem, then of the
	// current discovery subsystem (SUBTYPE 3, DUPRETINFO and EPCSD).
	d := dialInit(t, addr, false, false)
	d.must(d.connect(DiscoveryNQN, hostA, 0, 0xffff, 0))
	page := d.must(d.do(newSQE(adminGetLogPage, 0, logDiscovery|(8192/4-1)<<16), nil, false, 8192)).data
	if n := binary.LittleEndian.Uint64(page[8:]); n != 6 {
		t.Fatalf("%d discovery records, want 6", n)
	}
	for j, rec := range []struct {
		nqn     string
		subtype byte
		eflags  uint16
	}{{key.Subsystem, 2, 0}, {DiscoveryNQN, 3, 3}} {
		for i, p := range ports {
			e := page[1024*(1+j*len(ports)+i):]
			host, port, _ := strings.Cut(p.Addr, ":")
			if binary.LittleEndian.Uint16(e[4:]) != uint16(p.ID) || strings.TrimSpace(string(e[512:768])) != host ||
				strings.TrimSpace(string(e[32:64])) != port || strings.TrimRight(string(e[256:512]), "\x00") != rec.nqn ||
				e[2] != rec.subtype || binary.LittleEndian.Uint16(e[10:]) != rec.eflags {
				t.Fatalf("record %d of %s: portid %d traddr %q trsvcid %q subtype %d eflags %#x", i, rec.nqn,
					binary.LittleEndian.Uint16(e[4:]), e[512:530], e[32:40], e[2], binary.LittleEndian.Uint16(e[10:]))
			}
		}
	}
}

// TestGroupSubsystem: a subsystem of several namespaces (Paths.Groups):
// NSID i is the i-th volume, each namespace its own ANA group with its own
// state, I/O goes to each namespace's volume.
func TestGroupSubsystem(t *testing.T) {
	disk2 := newDisk(2 << 20)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	disk1 := newDisk(1 << 20)
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: frontendtest.Disks{"a": disk1, "b": disk2}, Logger: quiet})
	s, addr := serve(t, Config{Exports: ex, Logger: quiet, Multipath: true, NodeID: 1})
	const group = GroupNQNPrefix + "g"
	s.SetPaths(Paths{
		Groups: map[string][]string{group: {"a", "b"}},
		States: map[PathKey]ANAState{{group, hostA, 1}: ANAOptimized, {group, hostA, 2}: ANAInaccessible},
	})
	admin := dialInit(t, addr, false, false)
	admin.must(admin.connect(group, hostA, 0, 0xffff, 0))
	admin.must(admin.do(newSQE(adminSetFeatures, 0, 0x07, 0), nil, false, 0))
	ioq := dialInit(t, addr, false, false)
	ioq.must(ioq.connect(group, hostA, 1, admin.cntlid, 0))
	id := admin.must(admin.do(newSQE(adminIdentify, 0, 1), nil, false, 4096)).data
	if nn := binary.LittleEndian.Uint32(id[516:]); nn != groupNSMax || binary.LittleEndian.Uint32(id[344:]) != groupNSMax {
		t.Fatalf("NN %d ANAGRPMAX %d, want %d: room for the group to grow", nn, binary.LittleEndian.Uint32(id[344:]), groupNSMax)
	}
	list := admin.must(admin.do(newSQE(adminIdentify, 0, 2), nil, false, 4096)).data
	if binary.LittleEndian.Uint32(list) != 1 || binary.LittleEndian.Uint32(list[4:]) != 2 || binary.LittleEndian.Uint32(list[8:]) != 0 {
		t.Fatalf("active namespace list %v", list[:12])
	}
	ns2 := admin.must(admin.do(newSQE(adminIdentify, 2, 0), nil, false, 4096)).data
	if nsze := binary.LittleEndian.Uint64(ns2); nsze != 4096 || binary.LittleEndian.Uint32(ns2[92:]) != 2 {
		t.Fatalf("namespace 2: NSZE %d ANAGRPID %d", nsze, binary.LittleEndian.Uint32(ns2[92:]))
	}
	page := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, logANA|(4096/4-1)<<16), nil, false, 4096)).data
	if binary.LittleEndian.Uint16(page[8:]) != 2 {
		t.Fatalf("ANA log: %d groups", binary.LittleEndian.Uint16(page[8:]))
	}
	for i, want := range []ANAState{ANAOptimized, ANAInaccessible} {
		g := page[16+36*i:]
		if binary.LittleEndian.Uint32(g[0:]) != uint32(i+1) || g[16] != byte(want) || binary.LittleEndian.Uint32(g[32:]) != uint32(i+1) {
			t.Fatalf("ANA group %d: id %d state %d nsid %d, want state %d", i, binary.LittleEndian.Uint32(g[0:]), g[16],
				binary.LittleEndian.Uint32(g[32:]), want)
		}
	}
	data := make([]byte, 4096)
	data[0] = 0x5a
	ioq.must(ioq.do(rw(ioWrite, 0, 8), data, true, 0))
	if disk1.Bytes(0, 1)[0] != 0x5a || disk2.Opens.Load() != 0 {
		t.Fatal("the write to namespace 1 did not reach volume a alone")
	}
	w2 := rw(ioWrite, 0, 8)
	binary.LittleEndian.PutUint32(w2[4:], 2)
	if r, _ := ioq.do(w2, data, true, 0); r.status != scANAInaccessible {
		t.Fatalf("write to the inaccessible namespace 2: status %#x", r.status)
	}
	s.SetPaths(Paths{
		Groups: map[string][]string{group: {"a", "b"}},
		States: map[PathKey]ANAState{{group, hostA, 1}: ANAOptimized, {group, hostA, 2}: ANANonOptimized},
	})
	ioq.must(ioq.do(w2, data, true, 0))
	if disk2.Bytes(0, 1)[0] != 0x5a {
		t.Fatal("the write to namespace 2 did not reach volume b")
	}
	if h := s.Hosts(); len(h) != 1 || len(h[0].NSIDs) != 2 {
		t.Fatalf("Hosts() = %v", h)
	}
	// Discovery lists the group beside the volumes' own subsystems.
	d := dialInit(t, addr, false, false)
	d.must(d.connect(DiscoveryNQN, hostA, 0, 0xffff, 0))
	disc := d.must(d.do(newSQE(adminGetLogPage, 0, logDiscovery|(4096/4-1)<<16), nil, false, 4096)).data
	if n := binary.LittleEndian.Uint64(disc[8:]); n != 2 || strings.TrimRight(string(disc[1024+256:1024+512]), "\x00") != group {
		t.Fatalf("%d discovery records (want the group alone, a and b are in it, and the discovery subsystem's own)", n)
	}
	// A grouped volume's own subsystem is not served.
	other := dialInit(t, addr, false, false)
	if r, _ := other.connect(VolumeNQNPrefix+"a", hostA, 0, 0xffff, 0); r.status != scConnectInvalid {
		t.Fatalf("connect to a grouped volume's own subsystem: status %#x", r.status)
	}
}

// TestFencedWriteFinalOnSingleNode: a write the backend refuses as fenced (a
// newer writer took the volume) gets ANA Inaccessible; on a single access
// node it carries DNR — the host has no other path and the attachment stays
// fenced, so a retry could only loop — and the next write is refused too;
// on a Multipath node it does not (the host fails over to another path).
func TestFencedWriteFinalOnSingleNode(t *testing.T) {
	for _, multipath := range []bool{false, true} {
		s, addr, disk := startServer(t, func(c *Config) { c.Multipath = multipath })
		var fenced atomic.Bool
		disk.Fail = func(api.Op, int64, int64) error {
			if fenced.Load() {
				return frontend.ErrFenced
			}
			return nil
		}
		if multipath {
			key := PathKey{VolumeNQNPrefix + "vol", hostA, 1}
			s.SetPaths(Paths{Ports: []Port{{1, "10.0.0.1:4420"}}, States: map[PathKey]ANAState{key: ANAOptimized}})
		}
		_, ioq := session(t, addr, false, false)
		data := make([]byte, 4096)
		ioq.must(ioq.do(rw(ioWrite, 8, 8), data, true, 0))
		fenced.Store(true)
		for i := range 2 {
			r, _ := ioq.do(rw(ioWrite, 16, 8), data, true, 0)
			if r.status != scANAInaccessible || r.dnr == multipath {
				t.Fatalf("multipath %v, fenced write %d: status %#x dnr %v; want ANA Inaccessible, DNR %v", multipath, i+1, r.status, r.dnr, !multipath)
			}
		}
	}
}

// TestMayWrite: a host Config.MayWrite refuses gets ANA Inaccessible with
// DNR for its writes and write-zeroes — on a Multipath node too: the answer
// is about the host, so no other path would take the write — and nothing
// reaches the volume; its reads are served. The answer is kept per
// controller for MayWriteTTL; an error before any answer is Namespace Not
// Ready (the host retries).
func TestMayWrite(t *testing.T) {
	for _, multipath := range []bool{false, true} {
		var allow atomic.Bool
		var fail atomic.Bool
		var asked atomic.Int32
		s, addr, disk := startServer(t, func(c *Config) {
			c.Multipath = multipath
			c.MayWriteTTL = time.Hour
			c.MayWrite = func(_ context.Context, volume, host string) (bool, error) {
				asked.Add(1)
				if volume != "vol" || host != hostA {
					t.Errorf("MayWrite(%q, %q)", volume, host)
				}
				if fail.Load() {
					return false, errors.New("no MDS")
				}
				return allow.Load(), nil
			}
		})
		if multipath {
			key := PathKey{VolumeNQNPrefix + "vol", hostA, 1}
			s.SetPaths(Paths{Ports: []Port{{1, "10.0.0.1:4420"}}, States: map[PathKey]ANAState{key: ANAOptimized}})
		}
		data := bytes.Repeat([]byte{7}, 4096)
		fail.Store(true)
		_, ioq := session(t, addr, false, false)
		if r, _ := ioq.do(rw(ioWrite, 8, 8), data, true, 0); r.status != scNSNotReady || r.dnr {
			t.Fatalf("multipath %v, write with MayWrite failing: status %#x dnr %v; want Namespace Not Ready", multipath, r.status, r.dnr)
		}
		fail.Store(false)
		for _, sqe := range [][]byte{rw(ioWrite, 8, 8), rw(ioWriteZeroes, 8, 8), rw(ioWrite, 16, 8)} {
			var out []byte
			if sqe[0] == ioWrite {
				out = data
			}
			if r, _ := ioq.do(sqe, out, out != nil, 0); r.status != scANAInaccessible || !r.dnr {
				t.Fatalf("multipath %v, refused host's opcode %#x: status %#x dnr %v; want ANA Inaccessible, DNR", multipath, sqe[0], r.status, r.dnr)
			}
		}
		if !bytes.Equal(disk.Bytes(0, 1<<20), make([]byte, 1<<20)) {
			t.Fatalf("multipath %v: a refused write reached the volume", multipath)
		}
		ioq.must(ioq.do(rw(ioRead, 8, 8), nil, false, 4096))
		if n := asked.Load(); n != 2 {
			t.Fatalf("multipath %v: MayWrite asked %d times, want 2 (the failure, then one answer kept)", multipath, n)
		}
		// A new controller asks afresh.
		allow.Store(true)
		_, ioq = session(t, addr, false, false)
		ioq.must(ioq.do(rw(ioWrite, 8, 8), data, true, 0))
		if !bytes.Equal(disk.Bytes(4096, 4096), data) {
			t.Fatalf("multipath %v: the allowed write is not on the volume", multipath)
		}
	}
}

// Once a controller has an answer, a slow MDS (the hook hanging, as during
// an MDS failover) never holds its writes: they go on with the last answer
// while a fresh one is asked for, and the fresh answer then applies.
func TestMayWriteRefreshDoesNotHoldIO(t *testing.T) {
	var allow atomic.Bool
	allow.Store(true)
	release := make(chan struct{})
	var asked atomic.Int32
	_, addr, disk := startServer(t, func(c *Config) {
		c.MayWriteTTL = time.Millisecond
		c.MayWrite = func(ctx context.Context, _, _ string) (bool, error) {
			if asked.Add(1) > 1 {
				select { // every refresh hangs until released
				case <-release:
				case <-ctx.Done():
					return false, ctx.Err()
				}
			}
			return allow.Load(), nil
		}
	})
	_, ioq := session(t, addr, false, false)
	data := bytes.Repeat([]byte{9}, 4096)
	for i := range 20 {
		ioq.must(ioq.do(rw(ioWrite, uint64(8*i), 8), data, true, 0))
		time.Sleep(2 * time.Millisecond)
	}
	if !bytes.Equal(disk.Bytes(19*4096, 4096), data) {
		t.Fatal("the writes made while MayWrite hung are not on the volume")
	}
	if n := asked.Load(); n < 2 {
		t.Fatalf("MayWrite asked %d times, want a refresh after the TTL", n)
	}
	allow.Store(false)
	close(release)
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, _ := ioq.do(rw(ioWrite, 8, 8), data, true, 0)
		if r.status == scANAInaccessible && r.dnr {
			break
		}
		if r.status != scSuccess || time.Now().After(deadline) {
			t.Fatalf("write after the refresh refused the host: status %#x dnr %v; want ANA Inaccessible, DNR", r.status, r.dnr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
