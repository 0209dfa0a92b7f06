package mds

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

func TestHeartbeatsAndStatus(t *testing.T) {
	metrics := testutil.FreeAddr(t)
	r := startMDS(t, Config{HeartbeatTimeout: 700 * time.Millisecond, MetricsListen: metrics})
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
	beat := func(ids ...uint64) {
		t.Helper()
		for _, id := range ids {
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

	beat(ids...)
	st := status()
	if st.CopysetsHealthy != 4 || st.CopysetsDegraded != 0 || st.CopysetsUnavailable != 0 {
		t.Fatalf("all up: healthy %d degraded %d unavailable %d", st.CopysetsHealthy, st.CopysetsDegraded, st.CopysetsUnavailable)
	}
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
	if _, err := c.Heartbeat(ctx, moving); err != nil {
		t.Fatal(err)
	}
	st = status()
	if st.CopysetsHealthy != 3 || st.CopysetsDegraded != 1 {
		t.Fatalf("one move in flight: healthy %d degraded %d", st.CopysetsHealthy, st.CopysetsDegraded)
	}

	// ids[2] stops heartbeating: degraded once the timeout passed.
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		beat(ids[0], ids[1])
	}
	st = status()
	if st.CopysetsDegraded != 4 || st.CopysetsHealthy != 0 {
		t.Fatalf("one down: healthy %d degraded %d unavailable %d", st.CopysetsHealthy, st.CopysetsDegraded, st.CopysetsUnavailable)
	}
	if st.Chunkservers[2].Online || !st.Chunkservers[0].Online {
		t.Fatalf("online flags: %v", st.Chunkservers)
	}
	// Only ids[0] left: no majority.
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		beat(ids[0])
	}
	st = status()
	if st.CopysetsUnavailable != 4 {
		t.Fatalf("two down: healthy %d degraded %d unavailable %d", st.CopysetsHealthy, st.CopysetsDegraded, st.CopysetsUnavailable)
	}
	// A pool cannot be created on one online chunkserver.
	_, err = c.CreatePool(ctx, &api.CreatePoolRequest{Name: "q"})
	wantCode(t, "CreatePool with two chunkservers offline", err, codes.FailedPrecondition)

	// Metrics: our registry, not etcd's.
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{"basalt_mds_active 1", `basalt_mds_rpcs_total{code="OK",method="Heartbeat"}`, `basalt_mds_chunkservers{state="offline"} 2`} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(text, "etcd_") {
		t.Error("metrics include etcd's own metrics")
	}
}
