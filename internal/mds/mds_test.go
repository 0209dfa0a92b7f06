package mds

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

func register(t *testing.T, c *mdsclient.Client, zone, server, addr string) uint64 {
	t.Helper()
	resp, err := c.RegisterChunkServer(ctxT(t), &api.RegisterChunkServerRequest{Zone: zone, Server: server, Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Id == 0 {
		t.Fatal("RegisterChunkServer returned id 0")
	}
	return resp.Id
}

func TestPoolsAndVolumes(t *testing.T) {
	r := startMDS(t, Config{})
	defer r.stop(t)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)

	// No pool yet.
	_, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 1 << 20})
	wantCode(t, "CreateVolume without a pool", err, codes.FailedPrecondition)
	// No chunkservers yet.
	_, err = c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p"})
	wantCode(t, "CreatePool without chunkservers", err, codes.FailedPrecondition)

	ids := []uint64{
		register(t, c, "z1", "h1", "127.0.0.1:7001"),
		register(t, c, "z2", "h2", "127.0.0.1:7002"),
		register(t, c, "z3", "h3", "127.0.0.1:7003"),
	}
	if ids[0] == ids[1] || ids[1] == ids[2] {
		t.Fatalf("ids not distinct: %v", ids)
	}
	// Re-register keeps the id and updates the address.
	resp, err := c.RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Id: ids[0], Zone: "z1", Server: "h1", Addr: "127.0.0.1:7101"})
	if err != nil || resp.Id != ids[0] {
		t.Fatalf("re-register: %v, id %v want %d", err, resp, ids[0])
	}
	_, err = c.RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Id: 999, Addr: "x:1"})
	wantCode(t, "re-register unknown id", err, codes.NotFound)
	_, err = c.RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{})
	wantCode(t, "register without addr", err, codes.InvalidArgument)
	list, err := c.ListChunkServers(ctx, &api.ListChunkServersRequest{})
	if err != nil || len(list.Chunkservers) != 3 || list.Chunkservers[0].Addr != "127.0.0.1:7101" || !list.Chunkservers[0].Online {
		t.Fatalf("ListChunkServers = %v, %v", list, err)
	}

	for _, bad := range []*api.CreatePoolRequest{
		{Name: ""},
		{Name: "bad name"},
		{Name: strings.Repeat("a", 129)},
		{Name: "p", Replicas: 6},
		{Name: "p", ChunkSize: 3 << 20},
		{Name: "p", ChunkSize: 512 << 10},
		{Name: "p", ChunkSize: 2 << 30},
		{Name: "p", CopysetCount: MaxCopysetsPerPool + 1},
	} {
		_, err := c.CreatePool(ctx, bad)
		wantCode(t, "CreatePool "+bad.String(), err, codes.InvalidArgument)
	}
	_, err = c.CreatePool(ctx, &api.CreatePoolRequest{Name: "wide", Replicas: 4})
	wantCode(t, "CreatePool with 4 replicas on 3 zones", err, codes.FailedPrecondition)

	pool, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if p := pool.Pool; p.Replicas != 3 || p.ChunkSize != 16<<20 || p.CopysetCount != 100 || p.Id == 0 {
		t.Fatalf("pool defaults: %v", p)
	}
	_, err = c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p"})
	wantCode(t, "duplicate pool", err, codes.AlreadyExists)
	cs, err := c.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: pool.Pool.Id})
	if err != nil || len(cs.Copysets) != 100 || len(cs.Chunkservers) != 3 {
		t.Fatalf("GetCopysets: %v copysets, %v", len(cs.GetCopysets()), err)
	}
	for _, x := range cs.Copysets {
		if len(x.Members) != 3 || x.Epoch != 0 {
			t.Fatalf("copyset %v", x)
		}
	}
	_, err = c.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: 77})
	wantCode(t, "GetCopysets unknown pool", err, codes.NotFound)

	// Volumes.
	lv, err := c.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rev0 := lv.Revision
	for _, bad := range []*api.CreateVolumeRequest{
		{Name: "", Size: 4096},
		{Name: "a/b", Size: 4096},
		{Name: strings.Repeat("v", 129), Size: 4096},
		{Name: "v", Size: 0},
		{Name: "v", Size: 4097},
	} {
		_, err := c.CreateVolume(ctx, bad)
		wantCode(t, "CreateVolume "+bad.String(), err, codes.InvalidArgument)
	}
	_, err = c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 4096, Pool: "nope"})
	wantCode(t, "CreateVolume unknown pool", err, codes.NotFound)
	v1, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "db-1.data_x", Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if v1.Volume.PoolName != "p" || v1.Volume.Size != 1<<30 || v1.Volume.Id == 0 {
		t.Fatalf("volume %v", v1.Volume)
	}
	_, err = c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "db-1.data_x", Size: 4096})
	wantCode(t, "duplicate volume", err, codes.AlreadyExists)
	v2, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v2", Size: 8192, Pool: "p"})
	if err != nil || v2.Volume.Id == v1.Volume.Id {
		t.Fatalf("second volume: %v %v", v2, err)
	}
	lv, err = c.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil || len(lv.Volumes) != 2 || lv.Volumes[0].Name != "db-1.data_x" || lv.Revision == rev0 {
		t.Fatalf("ListVolumes %v %v (rev0 %d)", lv, err, rev0)
	}
	rev1 := lv.Revision

	g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Id: v2.Volume.Id})
	if err != nil || g.Volume.Name != "v2" {
		t.Fatalf("GetVolume by id: %v %v", g, err)
	}
	_, err = c.GetVolume(ctx, &api.GetVolumeRequest{Name: "missing"})
	wantCode(t, "GetVolume missing", err, codes.NotFound)
	_, err = c.GetVolume(ctx, &api.GetVolumeRequest{Id: 12345})
	wantCode(t, "GetVolume missing id", err, codes.NotFound)
	_, err = c.GetVolume(ctx, &api.GetVolumeRequest{})
	wantCode(t, "GetVolume neither", err, codes.InvalidArgument)

	// Resize: grow only.
	rz, err := c.ResizeVolume(ctx, &api.ResizeVolumeRequest{Name: "v2", Size: 1 << 20})
	if err != nil || rz.Volume.Size != 1<<20 {
		t.Fatalf("grow: %v %v", rz, err)
	}
	_, err = c.ResizeVolume(ctx, &api.ResizeVolumeRequest{Name: "v2", Size: 4096})
	wantCode(t, "shrink", err, codes.InvalidArgument)
	if !strings.Contains(status.Convert(err).Message(), "shrink") {
		t.Errorf("shrink message %q does not say why", status.Convert(err).Message())
	}
	_, err = c.ResizeVolume(ctx, &api.ResizeVolumeRequest{Name: "v2", Size: 1<<20 + 1})
	wantCode(t, "unaligned resize", err, codes.InvalidArgument)
	_, err = c.ResizeVolume(ctx, &api.ResizeVolumeRequest{Name: "nope", Size: 1 << 20})
	wantCode(t, "resize missing", err, codes.NotFound)
	lv, _ = c.ListVolumes(ctx, &api.ListVolumesRequest{})
	if lv.Revision == rev1 {
		t.Fatal("volumes revision unchanged by resize")
	}
	rev2 := lv.Revision

	// Heartbeats carry the revision and the copysets.
	hb, err := c.Heartbeat(ctx, &api.HeartbeatRequest{Id: ids[1]})
	if err != nil {
		t.Fatal(err)
	}
	if hb.VolumesRevision != rev2 || len(hb.Copysets) != 100 || len(hb.Peers) != 2 ||
		len(hb.Pools) != 1 || hb.Pools[0].ChunkSize != 16<<20 {
		t.Fatalf("heartbeat: rev %d (want %d), %d copysets, %d peers", hb.VolumesRevision, rev2, len(hb.Copysets), len(hb.Peers))
	}
	_, err = c.Heartbeat(ctx, &api.HeartbeatRequest{Id: 4242})
	wantCode(t, "heartbeat unknown", err, codes.NotFound)

	// Delete.
	_, err = c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "v2"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "v2"})
	wantCode(t, "delete twice", err, codes.NotFound)
	lv, _ = c.ListVolumes(ctx, &api.ListVolumesRequest{})
	if len(lv.Volumes) != 1 || lv.Revision == rev2 {
		t.Fatalf("after delete: %v", lv)
	}

	// Several pools: the pool must be named unless one is "default".
	if _, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "small", CopysetCount: 3, ChunkSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v3", Size: 4096})
	wantCode(t, "ambiguous pool", err, codes.InvalidArgument)
	pools, err := c.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil || len(pools.Pools) != 2 || pools.Pools[1].CopysetCount != 3 {
		t.Fatalf("ListPools %v %v", pools, err)
	}
}

// TestDeleteVolumeRefusedWhileAttached: a volume with a read-only session (every
// front-end attachment starts as one) cannot be deleted, as `rbd rm` refuses an
// image with watchers; once the session closes it can.
func TestDeleteVolumeRefusedWhileAttached(t *testing.T) {
	c := startWithPool(t, Config{SessionLease: 10 * time.Second}, 3)
	ctx := ctxT(t)
	for _, name := range []string{"attached", "other"} {
		if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: name, Size: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	ro, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "attached", ReadOnly: true, Client: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "attached"})
	wantCode(t, "delete while attached read-only", err, codes.FailedPrecondition)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, `attached by "host-a"`) {
		t.Fatalf("delete refusal names no client: %q", msg)
	}
	// Another volume's session does not hold this one.
	if _, err := c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "other"}); err != nil {
		t.Fatalf("delete of an unattached volume: %v", err)
	}
	if _, err := c.CloseSession(ctx, &api.CloseSessionRequest{SessionId: ro.SessionId}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "attached"}); err != nil {
		t.Fatalf("delete after detach: %v", err)
	}
}

func TestSessionsAndEpochs(t *testing.T) {
	c := startWithPool(t, Config{SessionLease: 2 * time.Second}, 6)
	ctx := ctxT(t)
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "vol", Size: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	_, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "nope"})
	wantCode(t, "open missing", err, codes.NotFound)

	w1, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol", Client: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	if w1.Epoch != 1 || w1.Volume.Epoch != 1 || w1.LeaseMs != 2000 || len(w1.Copysets) != 6 ||
		len(w1.Chunkservers) != 3 || w1.Pool.Name != "p" {
		t.Fatalf("first open: %v", w1)
	}
	if _, err := c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: w1.SessionId}); err != nil {
		t.Fatal(err)
	}
	_, err = c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "vol"})
	wantCode(t, "delete while open", err, codes.FailedPrecondition)

	ro, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol", ReadOnly: true})
	if err != nil || ro.Epoch != 0 || ro.SessionId == w1.SessionId {
		t.Fatalf("read-only open: %v %v", ro, err)
	}
	w2, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol", Client: "host-b"})
	if err != nil || w2.Epoch != 2 {
		t.Fatalf("second writer: %v %v", w2, err)
	}
	_, err = c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: w1.SessionId})
	wantCode(t, "renew superseded", err, codes.FailedPrecondition)
	if !strings.Contains(status.Convert(err).Message(), "superseded by a newer writer") {
		t.Fatalf("superseded message: %q", status.Convert(err).Message())
	}
	if _, err := c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: ro.SessionId}); err != nil {
		t.Fatalf("read-only renew after a new writer: %v", err)
	}
	w3, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol"})
	if err != nil || w3.Epoch != 3 {
		t.Fatalf("third writer: %v %v", w3, err)
	}
	g, _ := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "vol"})
	if g.Volume.Epoch != 3 {
		t.Fatalf("volume epoch %d, want 3", g.Volume.Epoch)
	}

	// Close: renew then fails; closing twice is fine.
	if _, err := c.CloseSession(ctx, &api.CloseSessionRequest{SessionId: w3.SessionId}); err != nil {
		t.Fatal(err)
	}
	_, err = c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: w3.SessionId})
	wantCode(t, "renew closed", err, codes.NotFound)
	if _, err := c.CloseSession(ctx, &api.CloseSessionRequest{SessionId: w3.SessionId}); err != nil {
		t.Fatalf("close twice: %v", err)
	}

	// A session not renewed expires.
	w4, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol"})
	if err != nil || w4.Epoch != 4 {
		t.Fatalf("fourth writer: %v %v", w4, err)
	}
	// The session's etcd lease lapses 2 s on, or later on a loaded machine:
	// polled by deleting the volume, which is refused while a writer is
	// attached and, unlike a renewal, does not extend the lease.
	time.Sleep(3500 * time.Millisecond)
	waitFor(t, 60*time.Second, "delete after the writer expired", func() error {
		_, err := c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "vol"})
		return err
	})
	_, err = c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: w4.SessionId})
	wantCode(t, "renew expired", err, codes.NotFound)
	_, err = c.RenewSession(ctx, &api.RenewSessionRequest{SessionId: ro.SessionId})
	wantCode(t, "renew on deleted volume", err, codes.NotFound)
}
