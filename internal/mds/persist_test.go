package mds

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

var update = flag.Bool("update", false, "rewrite testdata/records.golden")

// TestRestartKeepsState stops the MDS and starts it again on the same data
// directory: everything registered and created before is still there, and
// ids and epochs continue where they were.
func TestRestartKeepsState(t *testing.T) {
	cfg := Config{Insecure: true, Listen: "127.0.0.1:0", DataDir: t.TempDir(), EtcdClientURL: "http://" + testutil.FreeAddr(t),
		EtcdPeerURL: "http://" + testutil.FreeAddr(t), ElectionTTL: 2 * time.Second, Logger: quietLogger()}
	r := startMDS(t, cfg)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	for i, z := range []string{"z1", "z2", "z3"} {
		register(t, c, z, z, "cs:"+string(rune('1'+i)))
	}
	if _, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 5}); err != nil {
		t.Fatal(err)
	}
	v1, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v1", Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v1"}); err != nil {
		t.Fatal(err)
	}
	before, err := c.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.stop(t)

	r2 := startMDS(t, cfg)
	defer r2.stop(t)
	waitActive(t, r2, 30*time.Second)
	c2 := dial(t, r2.s.Addr())
	g, err := c2.GetVolume(ctx, &api.GetVolumeRequest{Name: "v1"})
	if err != nil || g.Volume.Id != v1.Volume.Id || g.Volume.Epoch != 1 {
		t.Fatalf("volume after restart: %v %v", g, err)
	}
	after, err := c2.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range before.Copysets {
		b, a := before.Copysets[i].Members, after.Copysets[i].Members
		if len(a) != len(b) || a[0] != b[0] || a[1] != b[1] || a[2] != b[2] {
			t.Fatalf("copyset %d members %v before, %v after", i, b, a)
		}
	}
	v2, err := c2.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v2", Size: 4096})
	if err != nil || v2.Volume.Id <= v1.Volume.Id {
		t.Fatalf("new volume id %v after %d (%v)", v2.GetVolume().GetId(), v1.Volume.Id, err)
	}
	o, err := c2.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v1"})
	if err != nil || o.Epoch != 2 {
		t.Fatalf("epoch after restart: %v %v", o.GetEpoch(), err)
	}
	id, err := c2.RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Zone: "z4", Addr: "cs:4"})
	if err != nil || id.Id != 4 {
		t.Fatalf("fourth chunkserver id %v (%v), want 4", id.GetId(), err)
	}
}

// TestRecordsGolden freezes the JSON of the etcd records: a change to them
// must be deliberate (and readable by older MDS during a rolling upgrade).
func TestRecordsGolden(t *testing.T) {
	got := encode(chunkserverRecord{ID: 7, Zone: "z1", Server: "host-a", Addr: "10.0.0.1:6800", DataDir: "/data/1",
		Capacity: 1 << 40, RegisteredMs: 1700000000000}) + "\n" +
		encode(poolRecord{ID: 1, Name: "default", Replicas: 3, ChunkSize: 16 << 20, CopysetCount: 100, CreatedMs: 1700000000001}) + "\n" +
		encode([]copysetRecord{{ID: 0, Members: []uint64{1, 2, 3}}, {ID: 1, Members: []uint64{2, 3, 4}, Epoch: 2}}) + "\n" +
		encode(volumeRecord{ID: 9, Name: "db1", Size: 10 << 30, PoolID: 1, PoolName: "default", CreatedMs: 1700000000002,
			Epoch: 3, Writer: 12}) + "\n" +
		encode(sessionRecord{ID: 12, Volume: 9, Epoch: 3, Client: "host-b pid 42", Lease: 0x1234, OpenedMs: 1700000000003}) + "\n"
	path := filepath.Join("testdata", "records.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Fatalf("etcd records changed:\n got: %s\nwant: %s", got, want)
	}
	// And they decode back.
	if v, err := decode[volumeRecord](encode(volumeRecord{ID: 9, Epoch: 3, Writer: 12})); err != nil || v.Writer != 12 || v.Epoch != 3 {
		t.Fatalf("volume record round trip: %v %v", v, err)
	}
}
