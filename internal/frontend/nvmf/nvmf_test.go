package nvmf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// session connects an admin queue and one I/O queue to vol.
func session(t *testing.T, addr string, hdgst, ddgst bool) (admin, ioq *initiator) {
	t.Helper()
	return sessionAs(t, addr, hdgst, ddgst, [16]byte{})
}

// sessionAs is session as the host with host identifier hostID.
func sessionAs(t *testing.T, addr string, hdgst, ddgst bool, hostID [16]byte) (admin, ioq *initiator) {
	t.Helper()
	admin = dialInit(t, addr, hdgst, ddgst)
	admin.HostID = hostID
	admin.must(admin.connect(VolumeNQNPrefix+"vol", hostA, 0, 0xffff, 0))
	if cap := admin.prop(true, propCAP, 0).dw0; cap&0xffff != 127 {
		t.Fatalf("CAP.MQES = %d", cap&0xffff)
	}
	admin.prop(false, propCC, 1)
	if csts := admin.prop(true, propCSTS, 0).dw0; csts&1 != 1 {
		t.Fatalf("CSTS = %#x, want RDY", csts)
	}
	// Number of queues: ask for 4, get 4.
	if r := admin.must(admin.do(newSQE(adminSetFeatures, 0, 0x07, 3|3<<16), nil, false, 0)); r.dw0 != 3|3<<16 {
		t.Fatalf("number of queues = %#x", r.dw0)
	}
	ioq = dialInit(t, addr, hdgst, ddgst)
	ioq.HostID = hostID
	sqe := newSQE(opFabrics, 0)
	_ = sqe
	ioq.must(ioq.connect(VolumeNQNPrefix+"vol", hostA, 1, admin.cntlid, 0))
	return admin, ioq
}

func TestIdentifyAndLogs(t *testing.T) {
	_, addr, _ := startServer(t, nil)
	admin, _ := session(t, addr, false, false)
	id := admin.must(admin.do(newSQE(adminIdentify, 0, 1), nil, false, 4096)).data
	if len(id) != 4096 || binary.LittleEndian.Uint16(id[78:]) != admin.cntlid {
		t.Fatalf("identify controller: %d bytes, cntlid %d, want %d", len(id), binary.LittleEndian.Uint16(id[78:]), admin.cntlid)
	}
	if got := strings.TrimRight(string(id[768:1024]), "\x00"); got != VolumeNQNPrefix+"vol" {
		t.Fatalf("SUBNQN %q", got)
	}
	if binary.LittleEndian.Uint16(id[320:]) == 0 || id[111] != 1 {
		t.Fatalf("KAS %d CNTRLTYPE %d", binary.LittleEndian.Uint16(id[320:]), id[111])
	}
	ns := admin.must(admin.do(newSQE(adminIdentify, 1, 0), nil, false, 4096)).data
	if nsze := binary.LittleEndian.Uint64(ns); nsze != 2048 || ns[130] != 9 || binary.LittleEndian.Uint32(ns[92:]) != 1 {
		t.Fatalf("identify namespace: NSZE %d LBADS %d ANAGRPID %d", nsze, ns[130], binary.LittleEndian.Uint32(ns[92:]))
	}
	list := admin.must(admin.do(newSQE(adminIdentify, 0, 2), nil, false, 4096)).data
	if binary.LittleEndian.Uint32(list) != 1 || binary.LittleEndian.Uint32(list[4:]) != 0 {
		t.Fatalf("active namespace list %v", list[:8])
	}
	desc := admin.must(admin.do(newSQE(adminIdentify, 1, 3), nil, false, 4096)).data
	if desc[0] != 2 || desc[1] != 16 || desc[20] != 3 {
		t.Fatalf("namespace descriptors %v", desc[:24])
	}
	if r, _ := admin.do(newSQE(adminIdentify, 7, 0), nil, false, 4096); r.status != scInvalidNS {
		t.Fatalf("identify namespace 7: status %#x", r.status)
	}
	ana := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, logANA|(4096/4-1)<<16), nil, false, 4096)).data
	if binary.LittleEndian.Uint16(ana[8:]) != 1 || ana[16+16] != 1 || binary.LittleEndian.Uint32(ana[16+32:]) != 1 {
		t.Fatalf("ANA log %v", ana[:56])
	}
	smart := admin.must(admin.do(newSQE(adminGetLogPage, 0xffffffff, logSMART|(512/4-1)<<16), nil, false, 512)).data
	if smart[3] != 100 {
		t.Fatalf("SMART spare %d", smart[3])
	}
	admin.must(admin.do(newSQE(adminGetLogPage, 0, logError|(64/4-1)<<16), nil, false, 64))
	if r, _ := admin.do(newSQE(adminGetLogPage, 0, 0x42|(64/4-1)<<16), nil, false, 64); r.status != scInvalidLogPage {
		t.Fatalf("log page 0x42: status %#x", r.status)
	}
	admin.must(admin.do(newSQE(adminKeepAlive, 0), nil, false, 0))
	if r := admin.must(admin.do(newSQE(adminSetFeatures, 0, 0x0f, 5000), nil, false, 0)); r.dw0 != 5000 {
		t.Fatalf("keep alive timer %d", r.dw0)
	}
	if r := admin.must(admin.do(newSQE(adminGetFeatures, 0, 0x0f), nil, false, 0)); r.dw0 != 5000 {
		t.Fatalf("get keep alive timer %d", r.dw0)
	}
	if r := admin.must(admin.do(newSQE(adminAbort, 0, 1), nil, false, 0)); r.dw0&1 != 1 {
		t.Fatalf("abort dw0 %#x", r.dw0)
	}
	if r, _ := admin.do(newSQE(0x80, 0), nil, false, 0); r.status != scInvalidOpcode || !r.dnr {
		t.Fatalf("vendor opcode: status %#x dnr %v", r.status, r.dnr)
	}
}

// Every digest combination, writes in the capsule and by R2T (split into
// several H2CData PDUs and several R2Ts), reads, compare, write zeroes, DSM.
func TestIODigestsAndR2T(t *testing.T) {
	for _, dg := range []struct{ h, d bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("hdgst=%v,ddgst=%v", dg.h, dg.d), func(t *testing.T) {
			_, addr, disk := startServer(t, func(c *Config) { c.R2TChunk = 16 << 10 })
			_, ioq := session(t, addr, dg.h, dg.d)
			ioq.SetMaxH2CData(5000) // H2CData PDUs of 5000 bytes: several per R2T, one odd-sized
			rng := rand.New(rand.NewPCG(1, 2))
			for i, n := range []int{1, 8, 16, 100, 256} { // blocks: 512 B .. 128 KiB
				data := make([]byte, n*512)
				for j := range data {
					data[j] = byte(rng.Uint32())
				}
				slba := uint64(i * 300)
				wr := rw(ioWrite, slba, n)
				if i%2 == 0 {
					wr[51] |= 0x40 // FUA
				}
				ioq.must(ioq.do(wr, data, n*512 <= 8192, 0))
				if got := disk.Bytes(int(slba)*512, len(data)); !bytes.Equal(got, data) {
					t.Fatalf("write of %d blocks did not land", n)
				}
				r := ioq.must(ioq.do(rw(ioRead, slba, n), nil, false, n*512))
				if !bytes.Equal(r.data, data) {
					t.Fatalf("read of %d blocks differs", n)
				}
				ioq.must(ioq.do(rw(ioCompare, slba, n), data, false, 0))
				bad := bytes.Clone(data)
				bad[0] ^= 1
				if r, _ := ioq.do(rw(ioCompare, slba, n), bad, false, 0); r.status != scCompareFailed {
					t.Fatalf("compare of changed data: status %#x", r.status)
				}
			}
			ioq.must(ioq.do(newSQE(ioFlush, 1), nil, false, 0))
			// Write zeroes over block 0..7, DSM deallocate 300..307 with a 4 KiB buffer.
			ioq.must(ioq.do(rw(ioWriteZeroes, 0, 8), nil, false, 0))
			dsm := make([]byte, 4096)
			binary.LittleEndian.PutUint32(dsm[4:], 8)
			binary.LittleEndian.PutUint64(dsm[8:], 300)
			ioq.must(ioq.do(newSQE(ioDSM, 1, 0, 4), dsm, true, 0))
			for _, at := range []int{0, 300 * 512} {
				if got := disk.Bytes(at, 4096); !bytes.Equal(got, make([]byte, 4096)) {
					t.Fatalf("blocks at %d not zero after write zeroes / deallocate", at)
				}
			}
			// Out of range, bad namespace, unknown opcode: statuses, connection stays.
			if r, _ := ioq.do(rw(ioRead, 2047, 2), nil, false, 1024); r.status != scLBARange {
				t.Fatalf("read past the end: status %#x", r.status)
			}
			if r, _ := ioq.do(newSQE(ioRead, 2, 0, 0, 0), nil, false, 512); r.status != scInvalidNS {
				t.Fatalf("read of namespace 2: status %#x", r.status)
			}
			if r, _ := ioq.do(newSQE(0x7e, 1), nil, false, 0); r.status != scInvalidOpcode {
				t.Fatalf("opcode 0x7e: status %#x", r.status)
			}
			ioq.must(ioq.do(rw(ioRead, 0, 1), nil, false, 512))
		})
	}
}

func TestCommandsBeforeConnect(t *testing.T) {
	_, addr, _ := startServer(t, nil)
	in := dialInit(t, addr, true, true)
	if r, _ := in.do(newSQE(adminIdentify, 0, 1), nil, false, 4096); r.status != scCmdSeqError || !r.dnr {
		t.Fatalf("identify before connect: status %#x", r.status)
	}
	sqe := newSQE(opFabrics, 0)
	sqe[4] = fctypePropertyGet
	if r, _ := in.do(sqe, nil, false, 0); r.status != scCmdSeqError {
		t.Fatalf("property get before connect: status %#x", r.status)
	}
	if r, _ := in.do(rw(ioRead, 0, 1), nil, false, 512); r.status != scCmdSeqError {
		t.Fatalf("read before connect: status %#x", r.status)
	}
	in.must(in.connect(VolumeNQNPrefix+"vol", hostA, 0, 0xffff, 0))
	if r, _ := in.connect(VolumeNQNPrefix+"vol", hostA, 0, 0xffff, 0); r.status != scCmdSeqError {
		t.Fatalf("second connect: status %#x", r.status)
	}
}

func TestConnectRefusals(t *testing.T) {
	_, addr, _ := startServer(t, nil)
	for _, tc := range []struct {
		name, sub, host string
		qid, cntlid     uint16
		want            uint16
	}{
		{"host not allowed", VolumeNQNPrefix + "vol", hostB, 0, 0xffff, scConnectHost},
		{"no such volume", VolumeNQNPrefix + "nope", hostA, 0, 0xffff, scConnectInvalid},
		{"foreign subsystem", "nqn.2000-01.com.example:x", hostA, 0, 0xffff, scConnectInvalid},
		{"static controller", VolumeNQNPrefix + "vol", hostA, 0, 7, scConnectInvalid},
		{"I/O queue of no controller", VolumeNQNPrefix + "vol", hostA, 1, 999, scConnectInvalid},
	} {
		in := dialInit(t, addr, false, false)
		r, err := in.connect(tc.sub, tc.host, tc.qid, tc.cntlid, 0)
		if err != nil || r.status != tc.want || !r.dnr {
			t.Errorf("%s: status %#x dnr %v err %v, want %#x with DNR", tc.name, r.status, r.dnr, err, tc.want)
		}
	}
	// An I/O queue may not join another host's controller, nor exceed the queues granted.
	admin := dialInit(t, addr, false, false)
	admin.must(admin.connect(VolumeNQNPrefix+"vol", hostA, 0, 0xffff, 0))
	in := dialInit(t, addr, false, false)
	if r, _ := in.connect(VolumeNQNPrefix+"vol", hostB, 1, admin.cntlid, 0); r.status != scConnectInvalid {
		t.Errorf("I/O queue from another host: status %#x", r.status)
	}
	in = dialInit(t, addr, false, false)
	if r, _ := in.connect(VolumeNQNPrefix+"vol", hostA, 1, admin.cntlid, 0); r.status != scConnectInvalid {
		t.Errorf("I/O queue before Set Features number of queues: status %#x", r.status)
	}
}

func TestDiscovery(t *testing.T) {
	for _, host := range []string{hostA, hostB} {
		_, addr, _ := startServer(t, nil)
		d := dialInit(t, addr, false, false)
		d.must(d.connect(DiscoveryNQN, host, 0, 0xffff, 0))
		id := d.must(d.do(newSQE(adminIdentify, 0, 1), nil, false, 4096)).data
		if id[111] != 2 {
			t.Fatalf("discovery CNTRLTYPE %d", id[111])
		}
		hdr := d.must(d.do(newSQE(adminGetLogPage, 0, logDiscovery|(1024/4-1)<<16), nil, false, 1024)).data
		n := binary.LittleEndian.Uint64(hdr[8:])
		want := uint64(2) // the volume's subsystem, the current discovery subsystem
		if host == hostB {
			want = 1 // not on the allow-list: only the discovery subsystem's own record
		}
		if n != want {
			t.Fatalf("host %s: %d discovery records, want %d", host, n, want)
		}
		page := d.must(d.do(newSQE(adminGetLogPage, 0, logDiscovery|uint32(1024*(n+1)/4-1)<<16), nil, false, int(1024*(n+1)))).data
		if n == 2 {
			e := page[1024:]
			if e[0] != 3 || e[2] != 2 || e[3] != treqNoSQFlow || binary.LittleEndian.Uint16(e[10:]) != 0 ||
				strings.TrimRight(string(e[256:512]), "\x00") != VolumeNQNPrefix+"vol" || strings.TrimSpace(string(e[512:768])) != "127.0.0.1" {
				t.Fatalf("discovery record: trtype %d subtype %d treq %#x eflags %#x subnqn %q traddr %q",
					e[0], e[2], e[3], binary.LittleEndian.Uint16(e[10:]), e[256:300], e[512:530])
			}
		}
		// The last: the discovery subsystem itself (SUBTYPE 3), at the
		// address the host used, same log from every record (DUPRETINFO),
		// persistent connections supported (EPCSD).
		_, port, _ := strings.Cut(addr, ":")
		e := page[1024*n:]
		if e[0] != 3 || e[1] != 1 || e[2] != 3 || e[3] != treqNoSQFlow || binary.LittleEndian.Uint16(e[4:]) != 1 ||
			binary.LittleEndian.Uint16(e[6:]) != 0xffff || binary.LittleEndian.Uint16(e[8:]) != 32 ||
			binary.LittleEndian.Uint16(e[10:]) != 3 || strings.TrimRight(string(e[256:512]), "\x00") != DiscoveryNQN ||
			strings.TrimSpace(string(e[512:768])) != "127.0.0.1" || strings.TrimSpace(string(e[32:64])) != port {
			t.Fatalf("current discovery subsystem record: trtype %d adrfam %d subtype %d treq %#x portid %d cntlid %#x asqsz %d eflags %#x subnqn %q traddr %q trsvcid %q",
				e[0], e[1], e[2], e[3], binary.LittleEndian.Uint16(e[4:]), binary.LittleEndian.Uint16(e[6:]), binary.LittleEndian.Uint16(e[8:]),
				binary.LittleEndian.Uint16(e[10:]), e[256:300], e[512:530], e[32:40])
		}
		if r, _ := d.do(newSQE(adminIdentify, 1, 0), nil, false, 4096); r.status != scInvalidField {
			t.Fatalf("identify namespace on the discovery controller: %#x", r.status)
		}
		ioq := dialInit(t, addr, false, false)
		if r, _ := ioq.connect(DiscoveryNQN, host, 1, d.cntlid, 0); r.status != scConnectInvalid {
			t.Fatalf("I/O queue on the discovery controller: %#x", r.status)
		}
	}
}

// A controller whose host sends nothing for KATO (twice, no grace) is ended:
// its queues are closed. One that keeps sending keep-alives lives.
func TestKeepAliveTimeout(t *testing.T) {
	_, addr, _ := startServer(t, func(c *Config) { c.KeepAliveGrace = -1 })
	idle := dialInit(t, addr, false, false)
	idle.must(idle.connect(VolumeNQNPrefix+"vol", hostA, 0, 0xffff, 200*time.Millisecond))
	live := dialInit(t, addr, false, false)
	live.must(live.connect(VolumeNQNPrefix+"vol", hostA, 0, 0xffff, 200*time.Millisecond))
	// The idle one's connection is closed by the server: a read sees EOF.
	done := make(chan error, 1)
	go func() {
		_, _, _, _, err := idle.read()
		done <- err
	}()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("the idle controller's queue got a PDU instead of being closed")
			}
			live.must(live.do(newSQE(adminKeepAlive, 0), nil, false, 0))
			return
		case <-deadline:
			t.Fatal("the idle controller was not ended within 60 s of a 200 ms KATO")
		case <-time.After(50 * time.Millisecond):
			live.must(live.do(newSQE(adminKeepAlive, 0), nil, false, 0))
		}
	}
}

// A malformed PDU closes that connection (after a C2HTermReq) and no other.
func TestMalformedPDUClosesOnlyItsConnection(t *testing.T) {
	_, addr, _ := startServer(t, nil)
	_, good := session(t, addr, true, true)
	for _, tc := range []struct {
		name string
		pdu  func(in *initiator) []byte
	}{
		{"bad header digest", func(in *initiator) []byte {
			b := in.pdu(pduCapsuleCmd, 0, make([]byte, capsuleLen), nil)
			b[capsuleLen] ^= 1
			return b
		}},
		{"wrong header length", func(in *initiator) []byte {
			b := in.pdu(pduCapsuleCmd, 0, make([]byte, capsuleLen), nil)
			b[2] = 40
			return b
		}},
		{"controller PDU type", func(in *initiator) []byte { return in.pdu(pduR2T, 0, make([]byte, dataHdrLen), nil) }},
		{"huge length", func(in *initiator) []byte {
			b := in.pdu(pduCapsuleCmd, 0, make([]byte, capsuleLen), nil)
			binary.LittleEndian.PutUint32(b[4:], 1<<30)
			return b
		}},
		{"H2CData without R2T", func(in *initiator) []byte {
			return in.pdu(pduH2CData, flagLast, make([]byte, dataHdrLen), make([]byte, 512))
		}},
	} {
		bad := dialInit(t, addr, true, true)
		if _, err := bad.nc.Write(tc.pdu(bad)); err != nil {
			t.Fatal(err)
		}
		for {
			typ, _, _, _, err := bad.read()
			if err != nil {
				break // closed
			}
			if typ != pduC2HTermReq {
				t.Fatalf("%s: got PDU %#x, want C2HTermReq or close", tc.name, typ)
			}
		}
		good.must(good.do(rw(ioRead, 0, 1), nil, false, 512))
	}
}

// TestWriteTimeoutDisconnectsNonReadingHost: a host that sends reads and
// reads none of the data is disconnected once the target's writes wait
// WriteTimeout for the socket (the writer sets the deadline only when a
// write would wait): the host's sends then fail, before its own (4-minute) deadline.
func TestWriteTimeoutDisconnectsNonReadingHost(t *testing.T) {
	_, addr, _ := startServer(t, func(c *Config) { c.WriteTimeout = 500 * time.Millisecond })
	_, ioq := session(t, addr, false, false)
	ioq.nc.SetDeadline(time.Now().Add(4 * time.Minute))
	var err error
	sent := 0
	for err == nil {
		// 128 KiB reads of the 1 MiB volume, never read back.
		sqe := rw(ioRead, uint64(sent%8)*256, 256)
		binary.LittleEndian.PutUint16(sqe[2:], uint16(sent))
		binary.LittleEndian.PutUint32(sqe[32:], 128<<10)
		sqe[39] = 0x5a // transport data block
		hdr := make([]byte, 72)
		copy(hdr[8:], sqe)
		err = ioq.WritePDU(ioq.pdu(pduCapsuleCmd, 0, hdr, nil))
		sent++
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("after %d reads the host's own 4-minute deadline passed: the target never gave up writing", sent)
	}
	t.Logf("the target closed the connection: the host's send of read %d failed: %v", sent, err)
}
