package access_test

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/reservation"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Persistent reservations live in the MDS: two iSCSI portals (two access
// nodes) on one volume, libiscsi's PR tests with their first path on one
// and their second path on the other — a reservation taken through one is
// enforced on the other as soon as the PERSISTENT RESERVE OUT returns.
// Then the store itself: actions racing from many nexuses are serialized,
// and a retried request is applied once.
func TestReservationsAcrossAccessNodes(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	c.CreateVolume("vol", 64<<20)
	id := c.Identity(identity.RoleAccess, "access-pr")
	mdsAddrs := strings.Split(c.MDSAddr, ",")

	t.Run("libiscsi two portals", func(t *testing.T) {
		testutil.RequireTool(t, "iscsi-test-cu")
		var urls []string
		for i := range 2 {
			node, err := access.Start(access.Config{
				MDS: mdsAddrs, MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
				ClientName: fmt.Sprintf("access-pr-%d", i),
				// Short: every PERSISTENT RESERVE OUT waits this long.
				ReservationTTL: 200 * time.Millisecond,
				ISCSI:          access.ISCSIConfig{Listen: "127.0.0.1:0", Cluster: "c"},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { node.Close() })
			urls = append(urls, "iscsi://"+node.ISCSIPortal().String()+"/"+iscsi.TargetName("c", "vol")+"/0")
		}
		// Tests that write only through the first path: the second path's
		// writes are all refused by the reservation (a write through it
		// would take the volume's writer role from the first node).
		for _, test := range []string{"ALL.ProutReserve.AccessEA", "ALL.ProutReserve.AccessWE",
			"ALL.ProutPreempt.RemoveRegistration", "ALL.PrinReadKeys.Simple", "ALL.ProutClear.Simple"} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			cmd := exec.CommandContext(ctx, "iscsi-test-cu", "--dataloss", "--verbose",
				"-i", "iqn.2026-11.io.basalt.test:pr-1", "-I", "iqn.2026-11.io.basalt.test:pr-2",
				"-t", test, urls[0], urls[1])
			cmd.Dir = t.TempDir()
			cmd.WaitDelay = 5 * time.Second
			out, _ := cmd.Output()
			cancel()
			name := test[strings.LastIndex(test, ".")+1:]
			ok := regexp.MustCompile(`(?m)^  Test: ` + regexp.QuoteMeta(name) + ` \.\.\.[\s\S]*passed\s*$`).Match(out)
			if !ok || strings.Contains(string(out), "FAILED") || strings.Contains(string(out), "[SKIPPED]") {
				t.Errorf("iscsi-test-cu %s through two access nodes did not pass:\n%s", test, tail(out, 100))
			}
		}
	})

	t.Run("store", func(t *testing.T) {
		mc, err := mdsclient.Dial(mdsAddrs, id.ClientTLS(identity.RoleMDS))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mc.Close() })
		store := access.MDSReservations{MDS: mc}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const n = 16
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				from := reservation.Nexus{Initiator: fmt.Sprintf("iqn.race-%d,i,0x1", i), TargetPort: uint16(1 + i%2)}
				_, err := store.Apply(ctx, "vol", from, reservation.Action{ServiceAction: reservation.RegisterAndIgnore, SAKey: uint64(100 + i)})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		st, err := store.Read(ctx, "vol")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Registrations) != n || st.Generation < n {
			t.Fatalf("after %d racing registrations: %d registrations, generation %d", n, len(st.Registrations), st.Generation)
		}
		// A retried request (same request id) is applied once.
		req := &api.ApplyReservationRequest{Volume: "vol",
			From:      reservation.NexusProto(reservation.Nexus{Initiator: "iqn.race-0,i,0x1", TargetPort: 1}),
			Action:    reservation.Action{ServiceAction: reservation.Register, Key: 100, SAKey: 200}.Proto(),
			RequestId: "retry-1"}
		first, err := mc.ApplyReservation(ctx, req)
		if err != nil || first.ErrorCode != 0 {
			t.Fatalf("apply: %v %v", first, err)
		}
		again, err := mc.ApplyReservation(ctx, req)
		if err != nil || again.ErrorCode != 0 || again.State.Generation != first.State.Generation {
			t.Fatalf("the retry: %v %v (first: generation %d)", again, err, first.State.Generation)
		}
		// The old key is gone: the same action as a new request conflicts.
		req.RequestId = "retry-2"
		if r, err := mc.ApplyReservation(ctx, req); err != nil || reservation.Code(r.ErrorCode) != reservation.CodeConflict {
			t.Fatalf("a new request with the old key: %v %v, want a conflict", r, err)
		}
		if _, err := store.Read(ctx, "no-such-volume"); err == nil {
			t.Fatal("the reservations of a volume that does not exist")
		}
		// PREEMPT AND ABORT: the MDS keeps the preempted nexus's "abort"
		// (what another access node aborts its commands by).
		preempted := reservation.Nexus{Initiator: "iqn.race-2,i,0x1", TargetPort: 1}
		before, err := store.Read(ctx, "vol")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Apply(ctx, "vol", reservation.Nexus{Initiator: "iqn.race-1,i,0x1", TargetPort: 2},
			reservation.Action{ServiceAction: reservation.PreemptAndAbort, Key: 101, SAKey: 102}); err != nil {
			t.Fatal(err)
		}
		if after, err := store.Read(ctx, "vol"); err != nil || !after.AbortedFor(preempted, before.Seq) || after.Registration(preempted) != nil {
			t.Fatalf("after PREEMPT AND ABORT of key 102: %v, %+v; want the registration gone and its nexus's commands aborted", err, after)
		}
		// CLEAR for the next run.
		if _, err := store.Apply(ctx, "vol", reservation.Nexus{Initiator: "iqn.race-1,i,0x1", TargetPort: 2},
			reservation.Action{ServiceAction: reservation.Clear, Key: 101}); err != nil {
			t.Fatal(err)
		}
	})
}

// tail returns the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
