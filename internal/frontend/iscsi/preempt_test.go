package iscsi

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/reservation"
)

// answer reads PDUs until the SCSI response (or the Data-In with status)
// of task itt and returns its status and sense; a response to any other
// task fails the test (an aborted task must never be answered).
// prOut sends PERSISTENT RESERVE OUT service action sa, type typ, with the
// reservation key key and the service action key saKey; it returns the task.
func (c *testClient) prOut(sa, typ byte, key, saKey uint64) uint32 {
	p := make([]byte, 24)
	for i := range 8 {
		p[7-i], p[15-i] = byte(key>>(8*i)), byte(saKey>>(8*i))
	}
	itt, _ := c.sendCommand([]byte{0x5f, sa, typ, 0, 0, 0, 0, 0, 24, 0}, 24, true, p)
	return itt
}

// wantGood fails t unless task itt of c is answered GOOD.
func wantGood(t *testing.T, what string, c *testClient, itt uint32) {
	t.Helper()
	if st, sense := c.answer(itt); st != 0 {
		t.Fatalf("%s: status %#x sense % x", what, st, sense)
	}
}

func (c *testClient) answer(itt uint32) (status byte, sense []byte) {
	c.t.Helper()
	for {
		r := c.mustRead()
		switch r.opcode() {
		case opSCSIResp, opDataIn:
			if r.itt() != itt {
				c.t.Fatalf("a response to task %#x (status %#x) while waiting for task %#x's", r.itt(), r.bhs[3], itt)
			}
			if r.opcode() == opDataIn && r.bhs[1]&0x01 == 0 {
				continue
			}
			if len(r.data) >= 2 && r.opcode() == opSCSIResp {
				sense = r.data[2:]
			}
			return r.bhs[3], sense
		case opNopIn:
		default:
			c.t.Fatalf("waiting for task %#x's response: opcode %#x", itt, r.opcode())
		}
	}
}

// quiet fails the test if the target sends anything within d.
func (c *testClient) quiet(d time.Duration) {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(d))
	r, err := c.read()
	c.nc.SetReadDeadline(time.Time{})
	var ne net.Error
	if err == nil {
		c.t.Fatalf("the target sent opcode %#x for task %#x; want nothing yet", r.opcode(), r.itt())
	} else if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatal(err)
	}
}

// TestPreemptAndAbort is what pacemaker's fence_scsi relies on: A and B
// registered, A holding WRITE EXCLUSIVE – REGISTRANTS ONLY; B has a write
// in the backend and another waiting for its data; A's PREEMPT AND ABORT
// of B's key aborts both (SPC-4 5.13.11.2.4, as ABORT TASK SET with TAS 0):
// neither is answered, the one waiting for data never writes, B's next
// commands get REGISTRATIONS PREEMPTED and COMMANDS CLEARED BY ANOTHER
// INITIATOR, then RESERVATION CONFLICT, and nothing B sends after the
// PREEMPT AND ABORT completed reaches the volume. On one access node the
// PREEMPT AND ABORT completes only once B's write left the backend; across
// two (each with its own copy of the shared state, as access nodes keep of
// the MDS's) node B aborts B's write when it completes and B's node reads
// the state again.
func TestPreemptAndAbort(t *testing.T) {
	for _, nodes := range []int{1, 2} {
		t.Run(map[int]string{1: "one access node", 2: "two access nodes"}[nodes], func(t *testing.T) {
			disk := frontendtest.NewDisk(1 << 20)
			disk.Gate = make(chan struct{}, 4) // every IO waits for a token
			vols := frontendtest.Disks{"disk": disk}
			var addrA, addrB string
			if nodes == 1 {
				_, addrA = startServer(t, vols, Config{})
				addrB = addrA
			} else {
				// Short: every PERSISTENT RESERVE OUT waits this long.
				const ttl = 200 * time.Millisecond
				mds := reservation.NewMemStore()
				_, addrA = startServer(t, vols, Config{TargetPort: 1, Reservations: reservation.NewCached(mds, ttl)})
				_, addrB = startServer(t, vols, Config{TargetPort: 2, Reservations: reservation.NewCached(mds, ttl)})
			}
			// Before the servers' close, which waits for the IO.
			t.Cleanup(func() { close(disk.Gate) })
			target := TargetName(testCluster, "disk")
			a, b := dialClient(t, addrA), dialClient(t, addrB)
			a.loginNormal(iqnA, target)
			b.loginNormal(iqnB, target)
			block := func(c byte) []byte { return bytes.Repeat([]byte{c}, 512) }
			wantGood(t, "A's REGISTER", a, a.prOut(6, 0, 0, 0xa))
			wantGood(t, "B's REGISTER", b, b.prOut(6, 0, 0, 0xb))
			wantGood(t, "A's RESERVE", a, a.prOut(1, 5, 0xa, 0)) // WRITE EXCLUSIVE – REGISTRANTS ONLY
			for _, c := range []*testClient{a, b} {
				disk.Gate <- struct{}{}
				itt, _ := c.sendCommand(cdb10(0x2a, 0, 1), 512, true, block('0'))
				wantGood(t, "a registrant's write", c, itt)
			}

			// B: a write held in the backend, and one waiting for its data.
			submitted := disk.Submitted.Load()
			b.sendCommand(cdb10(0x2a, 1, 1), 512, true, block('h'))
			disk.WaitSubmitted(t, submitted+1)
			waiting, _ := b.sendCommand(cdb10(0x2a, 2, 1), 512, true, nil)
			ttt := b.expectOp(opR2T, waiting).u32(20)

			pa := a.prOut(5, 5, 0xa, 0xb) // PREEMPT AND ABORT B's key
			if nodes == 1 {
				// Not complete while B's write may still write.
				a.quiet(time.Second)
				disk.Gate <- struct{}{}
				wantGood(t, "A's PREEMPT AND ABORT", a, pa)
			} else {
				// Node A does not wait for node B's commands; B's write,
				// still in the backend when the PREEMPT AND ABORT
				// completed, is not answered.
				wantGood(t, "A's PREEMPT AND ABORT", a, pa)
				disk.Gate <- struct{}{}
			}
			for deadline := time.Now().Add(time.Minute); disk.Pending.Load() != 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("B's held write is still in the backend a minute after its token")
				}
			}

			// Everything B sends now: refused, and not one of its earlier
			// writes answered.
			w, _ := b.sendCommand(cdb10(0x2a, 3, 1), 512, true, block('x'))
			st, sense := b.answer(w)
			wantSense(t, "B's first write after the PREEMPT AND ABORT", st, sense, 0x06, 0x2a, 0x05) // REGISTRATIONS PREEMPTED
			tur, _ := b.sendCommand(cdb10(0x00, 0, 0), 0, false, nil)
			st, sense = b.answer(tur)
			wantSense(t, "B's TEST UNIT READY", st, sense, 0x06, 0x2f, 0x00) // COMMANDS CLEARED BY ANOTHER INITIATOR
			b.sendDataOut(waiting, ttt, 0, 0, block('w'), true)
			w, _ = b.sendCommand(cdb10(0x2a, 4, 1), 512, true, block('x'))
			if st, sense := b.answer(w); st != 0x18 {
				t.Fatalf("B's write after the unit attentions: status %#x sense % x, want RESERVATION CONFLICT", st, sense)
			}
			if extra := b.ping(); len(extra) != 0 {
				t.Fatalf("B was sent opcode %#x for task %#x after its commands were aborted", extra[0].opcode(), extra[0].itt())
			}
			if got := disk.Bytes(2*512, 3*512); !bytes.Equal(got, make([]byte, 3*512)) {
				t.Fatal("B's aborted or refused writes changed the volume")
			}
			disk.Gate <- struct{}{}
			w, _ = a.sendCommand(cdb10(0x2a, 5, 1), 512, true, block('a'))
			wantGood(t, "the reservation holder's write", a, w)
		})
	}
}

// heldStore is a MemStore whose Apply for one initiator waits for a token
// (an MDS slow to answer that access node).
type heldStore struct {
	*reservation.MemStore
	initiator string
	gate      chan struct{}
	held      atomic.Int32 // Applies waiting for a token
}

func (s *heldStore) Apply(ctx context.Context, volume string, from reservation.Nexus, a reservation.Action) (*reservation.State, error) {
	if strings.HasPrefix(from.Initiator, s.initiator) {
		s.held.Add(1)
		<-s.gate
		s.held.Add(-1)
	}
	return s.MemStore.Apply(ctx, volume, from, a)
}

// A PREEMPT AND ABORT does not wait for the preempted nexus's reservation
// commands in flight, which never reach the backend: one of them may be a
// PREEMPT AND ABORT of the first one's nexus, waiting for it in turn (B
// re-registered by a REGISTER AND IGNORE EXISTING KEY in flight with it),
// and the two would wait for each other for good. The aborted command is
// not answered.
func TestPreemptAndAbortSkipsReservationCommands(t *testing.T) {
	store := &heldStore{MemStore: reservation.NewMemStore(), initiator: iqnB, gate: make(chan struct{}, 8)}
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20)}, Config{Reservations: store})
	t.Cleanup(func() { close(store.gate) }) // before the server's close, which waits for B's command
	target := TargetName(testCluster, "disk")
	a, b := dialClient(t, addr), dialClient(t, addr)
	a.loginNormal(iqnA, target)
	b.loginNormal(iqnB, target)
	wantGood(t, "A's REGISTER", a, a.prOut(6, 0, 0, 0xa))
	store.gate <- struct{}{}
	wantGood(t, "B's REGISTER", b, b.prOut(6, 0, 0, 0xb))
	wantGood(t, "A's RESERVE", a, a.prOut(1, 5, 0xa, 0))

	// B's REGISTER AND IGNORE EXISTING KEY, in the store when A's PREEMPT
	// AND ABORT commits.
	b.prOut(6, 0, 0, 0xb2)
	for deadline := time.Now().Add(time.Minute); store.held.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("B's REGISTER AND IGNORE EXISTING KEY did not reach the store")
		}
	}
	pa := a.prOut(5, 5, 0xa, 0xb)
	// Not answered before B's command leaves the store: a read timeout.
	a.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	wantGood(t, "A's PREEMPT AND ABORT with B's REGISTER AND IGNORE EXISTING KEY in the store", a, pa)
	a.nc.SetReadDeadline(time.Time{})
	store.gate <- struct{}{}
	for deadline := time.Now().Add(time.Minute); store.held.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("B's REGISTER AND IGNORE EXISTING KEY is still in the store a minute after its token")
		}
	}
	if extra := b.ping(); len(extra) != 0 {
		t.Fatalf("B's aborted command was answered: opcode %#x for task %#x", extra[0].opcode(), extra[0].itt())
	}
}

// A session that reinstated a registered nexus (same initiator and ISID)
// and has not run a command yet still has that nexus's commands aborted by
// a PREEMPT AND ABORT, and gets its unit attentions: its write waiting for
// data is not answered, its next command gets REGISTRATIONS PREEMPTED.
func TestPreemptAndAbortReinstatedSession(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	_, addr := startServer(t, frontendtest.Disks{"disk": disk}, Config{})
	target := TargetName(testCluster, "disk")
	a, b1 := dialClient(t, addr), dialClient(t, addr)
	a.loginNormal(iqnA, target)
	b1.loginNormal(iqnB, target)
	wantGood(t, "A's REGISTER", a, a.prOut(6, 0, 0, 0xa))
	wantGood(t, "B's REGISTER", b1, b1.prOut(6, 0, 0, 0xb))
	wantGood(t, "A's RESERVE", a, a.prOut(1, 5, 0xa, 0))

	// B reconnects (the same nexus) and sends a write, waiting for its data.
	b := dialClient(t, addr)
	b.isid = b1.isid
	b.loginNormal(iqnB, target)
	waiting, _ := b.sendCommand(cdb10(0x2a, 2, 1), 512, true, nil)
	ttt := b.expectOp(opR2T, waiting).u32(20)

	wantGood(t, "A's PREEMPT AND ABORT", a, a.prOut(5, 5, 0xa, 0xb))
	b.sendDataOut(waiting, ttt, 0, 0, bytes.Repeat([]byte{'w'}, 512), true)
	tur, _ := b.sendCommand(cdb10(0x00, 0, 0), 0, false, nil)
	st, sense := b.answer(tur)                                       // fails the test if the write is answered
	wantSense(t, "B's TEST UNIT READY", st, sense, 0x06, 0x2a, 0x05) // REGISTRATIONS PREEMPTED
	if got := disk.Bytes(2*512, 512); !bytes.Equal(got, make([]byte, 512)) {
		t.Fatal("B's aborted write changed the volume")
	}
}
