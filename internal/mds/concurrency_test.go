package mds

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestConcurrentRequests checks that concurrent requests lose no update:
// every read-write open gets its own epoch, racing creates of one name let
// exactly one win, and ids stay unique. The racing calls go straight to the
// MDS over gRPC, each sent once: mdsclient retries an attempt that took over
// its AttemptTimeout (5 s, reached under load with 32 contending
// transactions), and a retried open that had committed takes a second epoch.
func TestConcurrentRequests(t *testing.T) {
	c := startWithPool(t, Config{}, 3)
	ctx := ctxT(t)
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "shared", Size: 4096}); err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(c.Active(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	raw := api.NewMDSClient(cc)

	const n = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	var epochs []int
	var created, exists int
	ids := map[uint64]bool{}
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			o, err := raw.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "shared", Client: fmt.Sprint(i)})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			epochs = append(epochs, int(o.Epoch))
			mu.Unlock()
		}()
		go func() {
			defer wg.Done()
			v, err := raw.CreateVolume(ctx, &api.CreateVolumeRequest{Name: fmt.Sprintf("v%d", i%4), Size: 4096})
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				created++
				if ids[v.Volume.Id] {
					t.Errorf("volume id %d issued twice", v.Volume.Id)
				}
				ids[v.Volume.Id] = true
			case codes.AlreadyExists:
				exists++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	sort.Ints(epochs)
	for i, e := range epochs {
		if e != i+1 {
			t.Fatalf("epochs %v: want 1..%d, each once", epochs, n)
		}
	}
	if created != 4 || exists != n-4 {
		t.Fatalf("created %d, already-exists %d; want 4 and %d", created, exists, n-4)
	}
	g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "shared"})
	if err != nil || g.Volume.Epoch != n {
		t.Fatalf("volume epoch %v, want %d (%v)", g.GetVolume().GetEpoch(), n, err)
	}
}

// TestDeposedMDSCannotWrite proves the fencing INVARIANT of doc.go: an MDS
// that still believes it is active but whose election key is gone (its
// session expired, another MDS took over) cannot commit a write.
func TestDeposedMDSCannotWrite(t *testing.T) {
	r := startMDS(t, Config{})
	defer r.stop(t)
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)

	r.s.mu.Lock()
	real := r.s.elKey
	r.s.elKey = electionPrefix + "deadbeef" // a key etcd does not hold
	r.s.mu.Unlock()
	_, err := r.s.cli.Get(ctx, real) // the real key is still there: only our view is stale
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = c.RegisterChunkServer(short, &api.RegisterChunkServerRequest{Zone: "z", Addr: "a:1"})
	if status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Unavailable {
		t.Fatalf("write by a deposed MDS: %v, want it refused", err)
	}
	list, err := r.s.cli.Get(ctx, chunkserverPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || list.Count != 0 {
		t.Fatalf("a deposed MDS wrote %d chunkservers (%v)", list.Count, err)
	}

	r.s.mu.Lock()
	r.s.elKey = real
	r.s.mu.Unlock()
	register(t, c, "z", "h", "a:1")
}
