package mds

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

// TestHeartbeatsAndStatus: ClusterStatus follows heartbeats; chunkservers that
// stop heartbeating go offline after the timeout and their copysets degraded,
// then unavailable. Each state is polled for while the live chunkservers keep
// heartbeating; the timeout is seconds long so that no live one looks dead
// on a loaded machine.
func TestHeartbeatsAndStatus(t *testing.T) {
	metrics := testutil.FreeAddr(t)
	r := startMDS(t, Config{HeartbeatTimeout: 3 * time.Second, MetricsListen: metrics})
	defer r.stop(t)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	ids := []uint64{
		register(t, c, "z1", "h1", "a:1"),
		register(t, c, "z2", "h2", "a:2"),
		register(t, c, "z3", "h3", "a:3"),
	}
	pool, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 4096}); err != nil {
		t.Fatal(err)
	}
	// beat sends one heartbeat from each of ids; ids[0] leads every copyset.
	beat := func(who ...uint64) {
		t.Helper()
		for _, id := range who {
			req := &api.HeartbeatRequest{Id: id, CapacityBytes: 100, UsedBytes: 10, DiskState: api.DiskState_DISK_STATE_OK}
			for cs := range uint32(4) {
				req.Copysets = append(req.Copysets, &api.CopysetStatus{PoolId: pool.Pool.Id, CopysetId: cs,
					Leader: id == ids[0], LeaderId: ids[0], Term: 2, Healthy: true})
			}
			if _, err := c.Heartbeat(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	status := func() *api.ClusterStatusResponse {
		t.Helper()
		st, err := c.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	// until beats ids until status passes check.
	until := func(what string, check func(*api.ClusterStatusResponse) error, ids ...uint64) *api.ClusterStatusResponse {
		t.Helper()
		var st *api.ClusterStatusResponse
		waitFor(t, 60*time.Second, what, func() error {
			beat(ids...)
			st = status()
			return check(st)
		})
		return st
	}
	counts := func(healthy, degraded, unavailable uint32) func(*api.ClusterStatusResponse) error {
		return func(st *api.ClusterStatusResponse) error {
			if st.CopysetsHealthy != healthy || st.CopysetsDegraded != degraded || st.CopysetsUnavailable != unavailable {
				return fmt.Errorf("healthy %d degraded %d unavailable %d", st.CopysetsHealthy, st.CopysetsDegraded, st.CopysetsUnavailable)
			}
			return nil
		}
	}

	st := until("all up", counts(4, 0, 0), ids...)
	if st.LeadersPerChunkserver[ids[0]] != 4 || st.LeadersPerChunkserver[ids[1]] != 0 {
		t.Fatalf("leaders per chunkserver %v", st.LeadersPerChunkserver)
	}
	if st.ActiveMds != r.s.Addr() || len(st.Mds) != 1 || st.Volumes != 1 || len(st.Pools) != 1 || len(st.Copysets) != 4 {
		t.Fatalf("status: %v", st)
	}
	for _, cs := range st.Copysets {
		if cs.LeaderHint != ids[0] {
			t.Fatalf("copyset %d leader hint %d, want %d", cs.Id, cs.LeaderHint, ids[0])
		}
	}
	for _, cs := range st.Chunkservers {
		if !cs.Online || cs.UsedBytes != 10 || cs.DiskState != api.DiskState_DISK_STATE_OK {
			t.Fatalf("chunkserver %v", cs)
		}
	}

	// A leader whose Raft voters differ from the listed members (a move
	// in flight) makes its copyset degraded.
	moving := &api.HeartbeatRequest{Id: ids[0], CapacityBytes: 100, UsedBytes: 10, DiskState: api.DiskState_DISK_STATE_OK}
	for cs := range uint32(4) {
		voters := []uint64{ids[0], ids[1], ids[2]}
		if cs == 0 {
			voters = []uint64{ids[0], ids[1], 999}
		}
		moving.Copysets = append(moving.Copysets, &api.CopysetStatus{PoolId: pool.Pool.Id, CopysetId: cs,
			Leader: true, LeaderId: ids[0], Term: 2, Healthy: true, Voters: voters})
	}
	waitFor(t, 60*time.Second, "one move in flight", func() error {
		beat(ids[1], ids[2])
		if _, err := c.Heartbeat(ctx, moving); err != nil {
			t.Fatal(err)
		}
		return counts(3, 1, 0)(status())
	})

	// ids[2] stops heartbeating: degraded once the timeout passed.
	st = until("one down", counts(0, 4, 0), ids[0], ids[1])
	if st.Chunkservers[2].Online || !st.Chunkservers[0].Online || !st.Chunkservers[1].Online {
		t.Fatalf("online flags: %v", st.Chunkservers)
	}
	// Only ids[0] left: no majority.
	until("two down", counts(0, 0, 4), ids[0])
	// A pool cannot be created on one online chunkserver.
	_, err = c.CreatePool(ctx, &api.CreatePoolRequest{Name: "q"})
	wantCode(t, "CreatePool with two chunkservers offline", err, codes.FailedPrecondition)

	// Metrics: our registry, not etcd's. The chunkserver gauges follow the
	// MDS's periodic liveness check: polled.
	var text string
	waitFor(t, 60*time.Second, "metrics", func() error {
		beat(ids[0])
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text = string(body)
		for _, want := range []string{"basalt_mds_active 1", `basalt_mds_rpcs_total{code="OK",method="Heartbeat"}`, `basalt_mds_chunkservers{state="offline"} 2`} {
			if !strings.Contains(text, want) {
				return fmt.Errorf("metrics lack %q", want)
			}
		}
		return nil
	})
	if strings.Contains(text, "etcd_") {
		t.Error("metrics include etcd's own metrics")
	}
}
