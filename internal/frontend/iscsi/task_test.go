package iscsi

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// sendCommand sends a SCSI command (non-immediate, CmdSN c.cmdSN, advanced)
// without waiting for its answer: a write's data goes as immediate data
// when out is set, else edtl bytes are expected (W or R by write).
func (c *testClient) sendCommand(cdb []byte, edtl int, write bool, out []byte) (itt, cmdSN uint32) {
	c.t.Helper()
	c.itt++
	return c.itt, c.sendCommandAs(c.itt, cdb, edtl, write, out)
}

// sendCommandAs is sendCommand under a chosen task tag.
func (c *testClient) sendCommandAs(itt uint32, cdb []byte, edtl int, write bool, out []byte) (cmdSN uint32) {
	c.t.Helper()
	p := &pdu{data: out}
	p.bhs[0] = opSCSICmd
	p.bhs[1] = 0x80
	if write {
		p.bhs[1] |= 0x20
	} else if edtl > 0 {
		p.bhs[1] |= 0x40
	}
	p.put32(16, itt)
	p.put32(20, uint32(edtl))
	cmdSN = c.cmdSN
	p.put32(24, cmdSN)
	c.cmdSN++
	p.put32(28, c.statSN)
	copy(p.bhs[32:48], cdb)
	c.write(p)
	return cmdSN
}

// sendDataOut sends one Data-Out PDU.
func (c *testClient) sendDataOut(itt, ttt, dataSN uint32, off int, data []byte, final bool) {
	c.t.Helper()
	p := &pdu{data: data}
	p.bhs[0] = opDataOut
	if final {
		p.bhs[1] = 0x80
	}
	p.put32(16, itt)
	p.put32(20, ttt)
	p.put32(28, c.statSN)
	p.put32(36, dataSN)
	p.put32(40, uint32(off))
	c.write(p)
}

// sendAbortTask sends an immediate ABORT TASK for rtt with refCmdSN, with
// CmdSN cmdSN (an immediate request carries the next CmdSN, not advanced).
func (c *testClient) sendAbortTask(rtt, refCmdSN, cmdSN uint32) (itt uint32) {
	c.t.Helper()
	p := &pdu{}
	p.bhs[0] = 0x40 | opTaskMgmt
	p.bhs[1] = 0x80 | tmfAbortTask
	c.itt++
	p.put32(16, c.itt)
	p.put32(20, rtt)
	p.put32(24, cmdSN)
	p.put32(28, c.statSN)
	p.put32(32, refCmdSN)
	c.write(p)
	return c.itt
}

// ping sends a NOP-Out and returns the PDUs that arrive before its NOP-In.
func (c *testClient) ping() []*pdu {
	c.t.Helper()
	p := &pdu{}
	p.bhs[0] = 0x40 | opNopOut
	p.bhs[1] = 0x80
	c.itt++
	p.put32(16, c.itt)
	p.put32(20, reservedTag)
	p.put32(24, c.cmdSN)
	p.put32(28, c.statSN)
	c.write(p)
	var before []*pdu
	for {
		r := c.mustRead()
		if r.opcode() == opNopIn && r.itt() == c.itt {
			return before
		}
		before = append(before, r)
	}
}

// expectOp reads one PDU and fails the test unless it has opcode op and
// task tag itt.
func (c *testClient) expectOp(op byte, itt uint32) *pdu {
	c.t.Helper()
	r := c.mustRead()
	if r.opcode() != op || r.itt() != itt {
		c.t.Fatalf("got opcode %#x for ITT %#x, want %#x for ITT %#x", r.opcode(), r.itt(), op, itt)
	}
	return r
}

// A Data-Out PDU with the wrong DataSN is a lost PDU (RFC 7143 7.9): with no
// recovery at ErrorRecoveryLevel 0 the write ends in CHECK CONDITION
// (ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR) once its sequence's last
// PDU is in, writes nothing, and the connection serves on — libiscsi's
// iSCSIDataSnInvalid cases, and a wrapped DataSN.
func TestDataOutSequenceError(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	_, addr := startServer(t, frontendtest.Disks{"disk": disk}, Config{})
	c := dialClient(t, addr)
	c.loginNormal("iqn.2026-11.io.basalt.test:seq", TargetName(testCluster, "disk"),
		"ImmediateData", "No", "InitialR2T", "Yes", "MaxRecvDataSegmentLength", "512")
	const lba = 100
	fill := bytes.Repeat([]byte{0xa6}, 512)

	// write sends WRITE(10) of len(dataSNs) blocks at lba, answers the R2T
	// with one Data-Out per block carrying dataSNs, and returns the status
	// and sense.
	write := func(dataSNs ...uint32) (byte, []byte) {
		t.Helper()
		n := len(dataSNs)
		itt, _ := c.sendCommand(cdb10(0x2a, lba, uint16(n)), n*512, true, nil)
		r2t := c.expectOp(opR2T, itt)
		if off, l := r2t.u32(40), r2t.u32(44); off != 0 || int(l) != n*512 {
			t.Fatalf("R2T for %d+%d, want 0+%d", off, l, n*512)
		}
		for i, sn := range dataSNs {
			c.sendDataOut(itt, r2t.u32(20), sn, i*512, fill, i == n-1)
		}
		r := c.expectOp(opSCSIResp, itt)
		var sense []byte
		if len(r.data) >= 2 {
			sense = r.data[2:]
		}
		return r.bhs[3], sense
	}
	for _, sns := range [][]uint32{{0, 0}, {27}, {0xffffffff}, {1, 0}, {0, 2}} {
		st, sense := write(sns...)
		if st != 0x02 || len(sense) < 14 || sense[2]&0x0f != 0x0b || sense[12] != 0x47 || sense[13] != 0x05 {
			t.Fatalf("DataSNs %v: status %#x sense % x, want CHECK CONDITION, ABORTED COMMAND 47/05", sns, st, sense)
		}
		if got := disk.Bytes(lba*512, 1024); !bytes.Equal(got, make([]byte, 1024)) {
			t.Fatalf("DataSNs %v: the failed write reached the disk", sns)
		}
	}
	// The connection lives on, and each sequence's DataSN starts at 0.
	if st, sense := write(0, 1); st != 0 {
		t.Fatalf("a write with good DataSNs after the failures: status %#x sense % x", st, sense)
	}
	if got := disk.Bytes(lba*512, 1024); !bytes.Equal(got, bytes.Repeat(fill, 2)) {
		t.Fatal("the good write did not reach the disk")
	}
}

// ABORT TASK (RFC 7143 11.5, 11.6): a task in the backend is aborted (no
// SCSI response; the TMF response once it left the backend); a tag whose
// RefCmdSN does not match, or a command answered already, is "task does
// not exist"; a RefCmdSN of a command not yet received is "function
// complete" and that command never runs. A second command under a tag in
// use is rejected.
func TestAbortTask(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	// Every IO waits for a token: the test holds a write in the backend.
	disk.Gate = make(chan struct{}, 1)
	_, addr := startServer(t, frontendtest.Disks{"disk": disk}, Config{})
	t.Cleanup(func() { close(disk.Gate) }) // before the server's close, which waits for the IO
	c := dialClient(t, addr)
	c.loginNormal("iqn.2026-11.io.basalt.test:abort", TargetName(testCluster, "disk"))
	block := bytes.Repeat([]byte{0x5a}, 512)
	tmfResponse := func(itt uint32) byte {
		t.Helper()
		return c.expectOp(opTaskResp, itt).bhs[2]
	}

	// Answered already: the task does not exist (RefCmdSN is below the window).
	disk.Gate <- struct{}{}
	wITT, wSN := c.sendCommand(cdb10(0x2a, 0, 1), 512, true, block)
	if st := c.expectOp(opSCSIResp, wITT).bhs[3]; st != 0 {
		t.Fatalf("WRITE(10): status %#x", st)
	}
	if got := tmfResponse(c.sendAbortTask(wITT, wSN, c.cmdSN)); got != tmfNoTask {
		t.Fatalf("ABORT TASK for an answered command: response %d, want %d (task does not exist)", got, tmfNoTask)
	}

	// Not received yet (an immediate ABORT TASK overtook it): function
	// complete, and the command, when it comes, is counted but not run.
	next, writes := c.cmdSN, disk.Mutations.Load()
	if got := tmfResponse(c.sendAbortTask(0x7777, next, next+1)); got != tmfComplete {
		t.Fatalf("ABORT TASK for a command not received yet: response %d, want %d (function complete)", got, tmfComplete)
	}
	c.sendCommandAs(0x7777, cdb10(0x2a, 8, 1), 512, true, block)
	if extra := c.ping(); len(extra) != 0 {
		t.Fatalf("the aborted command was answered: opcode %#x", extra[0].opcode())
	}
	if st, _, _ := c.command(cdb10(0x00, 0, 0), 0, nil); st != 0 { // TEST UNIT READY: the window moved on
		t.Fatalf("TEST UNIT READY after the skipped CmdSN: status %#x", st)
	}
	if disk.Mutations.Load() != writes {
		t.Fatal("a command aborted before it arrived was run")
	}

	// In the backend (no token: it waits there).
	submitted := disk.Submitted.Load()
	wITT, wSN = c.sendCommand(cdb10(0x2a, 16, 1), 512, true, block)
	disk.WaitSubmitted(t, submitted+1)
	// The same tag again while it is in flight: rejected, never run.
	c.sendCommandAs(wITT, cdb10(0x2a, 24, 1), 512, true, block)
	if r := c.mustRead(); r.opcode() != opReject || r.bhs[2] != rejectInvalidField {
		t.Fatalf("a command under a tag in use: opcode %#x reason %#x, want a Reject (invalid PDU field)", r.opcode(), r.bhs[2])
	}
	// The tag with another command's CmdSN (a reused tag): not this task.
	if got := tmfResponse(c.sendAbortTask(wITT, wSN-1, c.cmdSN)); got != tmfNoTask {
		t.Fatalf("ABORT TASK with a RefCmdSN that is not the task's: response %d, want %d", got, tmfNoTask)
	}
	tmf := c.sendAbortTask(wITT, wSN, c.cmdSN)
	// The NOP-In says the reader took the ABORT TASK; its response waits
	// for the write, still held.
	if early := c.ping(); len(early) != 0 {
		t.Fatalf("ABORT TASK answered while its task is in the backend: opcode %#x", early[0].opcode())
	}
	disk.Gate <- struct{}{}
	if got := tmfResponse(tmf); got != tmfComplete {
		t.Fatalf("ABORT TASK for a command in the backend: response %d, want %d", got, tmfComplete)
	}
	if extra := c.ping(); len(extra) != 0 {
		t.Fatalf("the aborted command was answered: opcode %#x", extra[0].opcode())
	}
	if n := disk.Mutations.Load() - writes; n != 1 {
		t.Fatalf("%d writes reached the backend, want 1 (not the one under a tag in use)", n)
	}
}

// A WRITE naming more data than the target takes in one command (the Block
// Limits page's maximum transfer) is refused before its data is received
// and before any room is made for it: an initiator sending a 4 GiB WRITE(16)
// once made the target allocate 4 GiB (the first command of a connection
// is let through whatever the session's byte budget). COMPARE AND WRITE
// beyond its maximum length likewise. Nothing reaches the disk, and the
// connection serves on.
func TestDataOutTooLongRefusedFirst(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	_, addr := startServer(t, frontendtest.Disks{"disk": disk}, Config{})
	c := dialClient(t, addr)
	c.loginNormal("iqn.2026-11.io.basalt.test:huge", TargetName(testCluster, "disk"))
	refused := func(what string, cdb []byte, edtl int, field byte) {
		t.Helper()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		itt, _ := c.sendCommand(cdb, edtl, true, nil)
		r := c.expectOp(opSCSIResp, itt) // no R2T: refused before any data
		runtime.ReadMemStats(&after)
		var sense []byte
		if len(r.data) >= 2 {
			sense = r.data[2:]
		}
		if r.bhs[3] != 0x02 || len(sense) < 18 || sense[2]&0x0f != 0x05 || sense[12] != 0x24 || sense[17] != field {
			t.Fatalf("%s: status %#x sense % x, want CHECK CONDITION, INVALID FIELD IN CDB at byte %d", what, r.bhs[3], sense, field)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Fatalf("%s: the target allocated %d MiB for it", what, grew>>20)
		}
	}
	const edtl = 0xfffff000 // the largest EDTL, block-aligned: ~4 GiB
	w16 := make([]byte, 16)
	w16[0] = 0x8a // WRITE(16), LBA 0
	binary.BigEndian.PutUint32(w16[10:], edtl/512)
	refused("WRITE(16) of 4 GiB", w16, edtl, 10)
	caw := make([]byte, 16)
	caw[0] = 0x89 // COMPARE AND WRITE, LBA 0
	caw[13] = 255
	refused("COMPARE AND WRITE of 255 blocks", caw, 2*255*512, 13)
	if disk.Mutations.Load() != 0 {
		t.Fatal("a refused command reached the disk")
	}
	if st, _, sense := c.command(cdb10(0x2a, 0, 1), 512, bytes.Repeat([]byte{1}, 512)); st != 0 {
		t.Fatalf("a WRITE(10) after the refusals: status %#x sense % x", st, sense)
	}
}
