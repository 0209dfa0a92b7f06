package nvmf

import (
	"bytes"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/reservation"
)

// abortedOn reports whether a Preempt and Abort aborted the commands of
// s's controller of host id on namespace 1.
func abortedOn(s *Server, id [16]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.ctrls {
		if ns := c.namespace(1); c.hostID == id && ns != nil && ns.fence.lastAbort() != nil {
			return true
		}
	}
	return false
}

// TestPreemptAndAbort is what a cluster's fencing relies on: hosts A and B
// registered, A holding Write Exclusive – Registrants Only, B has a write
// in the backend; A's Reservation Acquire with Preempt and Abort of B's key
// aborts it (NVMe base spec 2.0, 8.19): B's write is answered Command
// Aborted due to Preempt and Abort (1Bh), B's next write gets Reservation
// Conflict and nothing B sends after the Acquire completed reaches the
// volume. On one access node the Acquire completes only once B's write left
// the backend; across two (each with its own copy of the shared state, as
// access nodes keep of the MDS's) B's node aborts B's write when it reads
// the state. The wait on one node outlasts the Acquire's store timeout
// (resvTimeout; a basalt volume's IO may retry for a minute).
func TestPreemptAndAbort(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes int
		short bool // resvTimeout shorter than the wait
	}{{"one access node", 1, false}, {"two access nodes", 2, false}, {"one access node past the timeout", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := tc.nodes
			if tc.short {
				old := resvTimeout
				resvTimeout = 50 * time.Millisecond
				t.Cleanup(func() { resvTimeout = old })
			}
			disk := newDisk(1 << 20)
			disk.Gate = make(chan struct{}, 4) // every IO waits for a token
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			mds := reservation.NewMemStore()
			start := func(store reservation.Store) (*Server, string) {
				ex := frontend.NewExports(frontend.ExportsConfig{Opener: frontendtest.Disks{"vol": disk}, Logger: quiet})
				return serve(t, Config{Exports: ex, AllowedHosts: []string{hostA}, Logger: quiet,
					Reservations: store, ReservationCheck: 20 * time.Millisecond})
			}
			var addrA, addrB string
			var nodeB *Server
			if nodes == 1 {
				nodeB, addrA = start(mds)
				addrB = addrA
			} else {
				// Short: every Acquire waits this long.
				const ttl = 200 * time.Millisecond
				_, addrA = start(reservation.NewCached(mds, ttl))
				nodeB, addrB = start(reservation.NewCached(mds, ttl))
			}
			// Before the servers' close, which waits for the IO.
			t.Cleanup(func() { close(disk.Gate) })
			idB := [16]byte{2}
			_, a := sessionAs(t, addrA, false, false, [16]byte{1})
			_, b := sessionAs(t, addrB, false, false, idB)
			block := func(c byte) []byte { return bytes.Repeat([]byte{c}, 512) }
			do := func(in *initiator, sqe, out []byte) uint16 {
				t.Helper()
				r, err := in.do(sqe, out, len(out) > 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				return r.status
			}
			good := func(what string, st uint16) {
				t.Helper()
				if st != 0 {
					t.Fatalf("%s: status %#x", what, st)
				}
			}
			good("A's Register", do(a, newSQE(ioResvRegister, 1, 0), resvData(0, 0xa)))
			good("B's Register", do(b, newSQE(ioResvRegister, 1, 0), resvData(0, 0xb)))
			good("A's Acquire", do(a, newSQE(ioResvAcquire, 1, 3<<8), resvData(0xa, 0))) // Write Exclusive – Registrants Only
			for _, in := range []*initiator{a, b} {
				disk.Gate <- struct{}{}
				good("a registrant's write", do(in, rw(ioWrite, 0, 1), block('0')))
			}

			// B: a write held in the backend.
			submitted := disk.Submitted.Load()
			held := make(chan uint16, 1)
			go func() {
				r, err := b.do(rw(ioWrite, 1, 1), block('h'), true, 0)
				if err != nil {
					t.Error(err)
				}
				held <- r.status
			}()
			disk.WaitSubmitted(t, submitted+1)

			acquired := make(chan uint16, 1)
			go func() {
				r, err := a.do(newSQE(ioResvAcquire, 1, 2|3<<8), resvData(0xa, 0xb), true, 0) // Preempt and Abort B's key
				if err != nil {
					t.Error(err)
				}
				acquired <- r.status
			}()
			if nodes == 1 {
				// Not complete while B's write may still write.
				select {
				case st := <-acquired:
					t.Fatalf("the Preempt and Abort completed (status %#x) with B's write in the backend", st)
				case <-time.After(time.Second):
				}
				disk.Gate <- struct{}{}
				good("A's Preempt and Abort", <-acquired)
			} else {
				// Node A does not wait for node B's commands; node B aborts
				// B's write when it reads the state.
				good("A's Preempt and Abort", <-acquired)
				for deadline := time.Now().Add(time.Minute); !abortedOn(nodeB, idB); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("node B has not aborted B's commands a minute after the Preempt and Abort")
					}
				}
				disk.Gate <- struct{}{}
			}
			if st := <-held; st != scPreemptAbort {
				t.Fatalf("B's write in the backend at the Preempt and Abort: status %#x, want %#x (Command Aborted due to Preempt and Abort)", st, scPreemptAbort)
			}

			// Everything B writes now: refused.
			if st := do(b, rw(ioWrite, 2, 1), block('x')); st != scResvConflict {
				t.Fatalf("B's write after the Preempt and Abort: status %#x, want Reservation Conflict", st)
			}
			if got := disk.Bytes(2*512, 512); !bytes.Equal(got, make([]byte, 512)) {
				t.Fatal("B's refused write changed the volume")
			}
			disk.Gate <- struct{}{}
			good("the reservation holder's write", do(a, rw(ioWrite, 3, 1), block('a')))
		})
	}
}
