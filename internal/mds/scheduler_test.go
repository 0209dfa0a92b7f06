package mds

import (
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestRecoveryScheduler stops the heartbeats of one of four chunkservers
// and checks that its copysets move to the spare one, across distinct
// zones, with bumped epochs, no faster than MaxRecoveryMoves moves in
// flight at a time. The heartbeat timeout is seconds long, so that survivors
// whose heartbeats run late on a loaded machine are not taken for dead too.
func TestRecoveryScheduler(t *testing.T) {
	r := startMDS(t, Config{HeartbeatTimeout: 3 * time.Second, RecoveryGrace: 3 * time.Second,
		ScheduleInterval: 100 * time.Millisecond, MaxRecoveryMoves: 2})
	defer r.stop(t)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	zones := map[uint64]string{}
	var ids []uint64
	for _, z := range []string{"z1", "z2", "z3", "z4"} {
		id := register(t, c, z, "h"+z, "cs-"+z+":1")
		ids = append(ids, id)
		zones[id] = z
	}
	pool, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 8})
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: pool.Pool.Id})
	if err != nil {
		t.Fatal(err)
	}
	victim := ids[3]
	var affected int
	for _, cs := range before.Copysets {
		for _, m := range cs.Members {
			if m == victim {
				affected++
			}
		}
	}
	if affected < 4 {
		t.Fatalf("victim is in %d copysets; the test needs at least 4", affected)
	}

	// The survivors heartbeat; each claims to lead its copysets with the
	// original members as voters, then (joint) the listed members as the
	// incoming half of a joint configuration whose outgoing half is the
	// original members, then (converged) the listed members alone.
	var mu sync.Mutex
	joint, converged := false, false
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			cur, err := c.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: pool.Pool.Id})
			if err != nil {
				continue
			}
			mu.Lock()
			conv, jnt := converged, joint
			mu.Unlock()
			for _, id := range ids[:3] {
				req := &api.HeartbeatRequest{Id: id}
				for i, cs := range cur.Copysets {
					voters, outgoing := before.Copysets[i].Members, []uint64(nil)
					if jnt && cs.Epoch != before.Copysets[i].Epoch {
						voters, outgoing = cs.Members, before.Copysets[i].Members
					}
					if conv {
						voters, outgoing = cs.Members, nil
					}
					req.Copysets = append(req.Copysets, &api.CopysetStatus{PoolId: cs.PoolId, CopysetId: cs.Id,
						Leader: true, Term: 1, Healthy: true, Voters: voters, VotersOutgoing: outgoing})
				}
				c.Heartbeat(ctx, req)
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()

	moved := func() (n int, cur *api.GetCopysetsResponse) {
		cur, err := c.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: pool.Pool.Id})
		if err != nil {
			t.Fatal(err)
		}
		for i, cs := range cur.Copysets {
			if cs.Epoch != before.Copysets[i].Epoch {
				n++
			}
		}
		return n, cur
	}
	// Moves in flight (leaders still report the old voters) hold the rest
	// back: two moves start, and rounds after that start no more.
	waitFor(t, 60*time.Second, "the first recovery moves", func() error {
		if n, _ := moved(); n < 2 {
			return fmt.Errorf("%d copysets moved", n)
		}
		return nil
	})
	time.Sleep(time.Second) // ten scheduling rounds, to (wrongly) start more
	if n, _ := moved(); n != 2 {
		t.Fatalf("%d copysets moved while earlier moves were in flight; want MaxRecoveryMoves = 2", n)
	}
	// A joint configuration is a move in flight too: the old member still
	// counts for quorum until the group leaves it.
	mu.Lock()
	joint = true
	mu.Unlock()
	time.Sleep(2 * time.Second)
	if n, _ := moved(); n != 2 {
		t.Fatalf("%d copysets moved while earlier moves were in a joint configuration; want MaxRecoveryMoves = 2", n)
	}
	mu.Lock()
	converged = true
	mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		n, cur := moved()
		if n == affected {
			for i, cs := range cur.Copysets {
				was := before.Copysets[i]
				seen := map[string]bool{}
				for _, m := range cs.Members {
					if m == victim {
						t.Fatalf("copyset %d still lists the dead chunkserver: %v", cs.Id, cs.Members)
					}
					if seen[zones[m]] {
						t.Fatalf("copyset %d members %v share zone %s", cs.Id, cs.Members, zones[m])
					}
					seen[zones[m]] = true
				}
				if cs.Epoch != 0 && cs.Epoch != 1 {
					t.Fatalf("copyset %d epoch %d after one move", cs.Id, cs.Epoch)
				}
				if len(cs.Members) != 3 || (cs.Epoch == 0) != equal(cs.Members, was.Members) {
					t.Fatalf("copyset %d: %v epoch %d, was %v", cs.Id, cs.Members, cs.Epoch, was.Members)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d copysets moved after 60 s", n, affected)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The counter moves just after the transaction committed.
	waitFor(t, 60*time.Second, "basalt_mds_copyset_moves_total", func() error {
		var m dto.Metric
		if err := r.s.m.moves.Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetCounter().GetValue(); int(got) != affected {
			return fmt.Errorf("basalt_mds_copyset_moves_total = %v, want %d", got, affected)
		}
		return nil
	})
	// The heartbeat of a survivor now lists the copysets it gained.
	hb, err := c.Heartbeat(ctx, &api.HeartbeatRequest{Id: ids[0]})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range hb.Copysets {
		if api.GroupID(cs.PoolId, cs.Id) == 0 || len(cs.Members) != 3 {
			t.Fatalf("heartbeat copyset %v", cs)
		}
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
