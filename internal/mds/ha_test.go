package mds

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestFailover runs three MDS on one external etcd, kills the active one
// without resigning (as kill -9 would) and checks that a standby takes over
// once the crashed one's election lease lapses, that mdsclient calls keep
// succeeding, that no state was lost, and that a clean stop hands over faster
// than a lease could lapse. Leases and timeouts are seconds long and bounds
// generous: a loaded machine delays everything.
func TestFailover(t *testing.T) {
	etcd := startEtcd(t)
	var ms []*running
	var addrs []string
	const electionTTL = 5 * time.Second
	for range 3 {
		r := startMDS(t, Config{EtcdEndpoints: []string{etcd}, ElectionTTL: electionTTL,
			HeartbeatTimeout: 10 * time.Second, SessionLease: time.Minute})
		ms = append(ms, r)
		addrs = append(addrs, r.s.Addr())
	}
	stopped := map[*running]bool{}
	defer func() {
		for _, r := range ms {
			if !stopped[r] {
				r.stop(t)
			}
		}
	}()
	active := func() *running {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			var found []*running
			for _, r := range ms {
				if !stopped[r] && r.s.active.Load() {
					found = append(found, r)
				}
			}
			if len(found) > 1 {
				t.Fatalf("%d MDS active at once", len(found))
			}
			if len(found) == 1 {
				return found[0]
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("no MDS became active")
		return nil
	}
	first := active()

	// A standby answers Unavailable and names the active MDS.
	for _, r := range ms {
		if r == first {
			continue
		}
		cc, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		_, err = api.NewMDSClient(cc).ListPools(ctxT(t), &api.ListPoolsRequest{})
		cc.Close()
		wantCode(t, "standby ListPools", err, codes.Unavailable)
		if msg := status.Convert(err).Message(); msg != "not the active MDS; active is "+first.s.Addr() {
			t.Fatalf("standby message %q", msg)
		}
	}

	// The client is given the addresses with the active one last.
	c := dial(t, addrs[2], addrs[1], addrs[0])
	ctx := ctxT(t)
	var ids []uint64
	for i, z := range []string{"z1", "z2", "z3"} {
		ids = append(ids, register(t, c, z, "h"+z, "cs:"+string(rune('1'+i))))
	}
	if _, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "vol", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	w1, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol"})
	if err != nil || w1.Epoch != 1 {
		t.Fatalf("open: %v %v", w1, err)
	}
	if c.Active() != first.s.Addr() {
		t.Fatalf("client talks to %s, active is %s", c.Active(), first.s.Addr())
	}

	killed := time.Now()
	first.crash(t)
	stopped[first] = true

	// The client keeps working through the failover.
	g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "vol"})
	if err != nil {
		t.Fatalf("GetVolume during failover: %v", err)
	}
	second := active()
	took := time.Since(killed)
	t.Logf("takeover after %v by %s", took, second.s.Addr())
	if took > time.Minute {
		t.Fatalf("takeover took %v", took)
	}
	if g.Volume.Size != 1<<20 || g.Volume.Epoch != 1 {
		t.Fatalf("volume after failover: %v", g.Volume)
	}
	if c.Active() != second.s.Addr() {
		t.Fatalf("client talks to %s, active is %s", c.Active(), second.s.Addr())
	}

	// State intact: pools, copysets, epochs, sessions.
	pools, err := c.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil || len(pools.Pools) != 1 || pools.Pools[0].CopysetCount != 8 {
		t.Fatalf("pools after failover: %v %v", pools, err)
	}
	if _, err := c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: w1.SessionId}); err != nil {
		t.Fatalf("session lost in failover: %v", err)
	}
	w2, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol"})
	if err != nil || w2.Epoch != 2 || w2.SessionId == w1.SessionId {
		t.Fatalf("open after failover: %v %v", w2, err)
	}
	_, err = c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: w1.SessionId})
	wantCode(t, "renew superseded after failover", err, codes.FailedPrecondition)

	// Liveness is rebuilt from heartbeats: nobody has beaten the new MDS yet.
	st, err := c.ClusterStatus(ctx, &api.ClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.ActiveMds != second.s.Addr() || len(st.Mds) != 2 || st.CopysetsUnavailable != 8 {
		t.Fatalf("status after failover: active %s mds %v unavailable %d", st.ActiveMds, st.Mds, st.CopysetsUnavailable)
	}
	for _, id := range ids {
		if _, err := c.Heartbeat(ctx, &api.HeartbeatRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.ListChunkServers(ctx, &api.ListChunkServersRequest{})
	if err != nil || len(list.Chunkservers) != 3 {
		t.Fatalf("chunkservers after failover: %v %v", list, err)
	}
	for _, cs := range list.Chunkservers {
		if !cs.Online {
			t.Fatalf("chunkserver %d offline after its heartbeat", cs.Id)
		}
	}

	// A clean stop hands over at once.
	stopAt := time.Now()
	second.stop(t)
	stopped[second] = true
	third := active()
	if d := time.Since(stopAt); d >= electionTTL {
		t.Errorf("clean stop: hand-over took %v, as long as the election lease (%v); resigning should make it immediate", d, electionTTL)
	}
	if _, err := c.ListVolumes(ctx, &api.ListVolumesRequest{}); err != nil {
		t.Fatalf("after the second handover: %v", err)
	}
	if !strings.HasPrefix(c.Active(), "127.0.0.1:") || c.Active() != third.s.Addr() {
		t.Fatalf("client talks to %s, active is %s", c.Active(), third.s.Addr())
	}
}
