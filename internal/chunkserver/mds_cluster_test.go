package chunkserver

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/mds"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// The real MDS wants chunks of at least 1 MiB.
const (
	mChunk   = 1 << 20
	mVolSize = 8 * mChunk
)

// wholeTestMDS bounds the MDS calls of a whole test, so a hung MDS fails it. It
// is not a speed limit: the test's waits for the chunkservers between the calls
// spend it too, and on a loaded machine 30 s ran out before the last call (a CI
// rehearsal: TestRealMDSCluster's ClusterStatus after 40 s).
const wholeTestMDS = 5 * time.Minute

// startRealMDS runs internal/mds with embedded etcd in a temp dir.
func startRealMDS(t *testing.T) string {
	return startRealMDSWith(t, func(*mds.Config) {})
}

func startRealMDSWith(t *testing.T, tune func(*mds.Config)) string {
	t.Helper()
	cfg := mds.Config{
		Listen:           "127.0.0.1:0",
		DataDir:          t.TempDir(),
		EtcdClientURL:    "http://" + testutil.FreeAddr(t),
		EtcdPeerURL:      "http://" + testutil.FreeAddr(t),
		HeartbeatTimeout: 2 * time.Second,
		ElectionTTL:      2 * time.Second,
		Logger:           testLogger(t).With("component", "mds"),
		// In-process chunkservers without certificates: these tests are
		// about the chunkserver; the MDS's authorization has its own tests.
		Insecure: true,
	}
	tune(&cfg)
	s, err := mds.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("MDS did not stop")
		}
	})
	return s.Addr()
}

// TestRealMDSCluster runs three chunkservers against the real MDS: a pool and
// a volume created through the MDS API, a writer session's epoch, IO to the
// leaders, a restart from the data directory that keeps the id and catches up.
func TestRealMDSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test with etcd: -short")
	}
	addr := startRealMDS(t)
	tc := startNodes(t, addr, nil)
	cl, err := mdsclient.Dial([]string{addr}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wholeTestMDS)
	defer cancel()
	var pool *api.Pool
	tc.waitFor("pool creation", func() bool {
		r, err := cl.CreatePool(ctx, &api.CreatePoolRequest{Name: "default", Replicas: 3, ChunkSize: mChunk, CopysetCount: 4})
		if err != nil {
			return false
		}
		pool = r.GetPool()
		return true
	})
	tc.pool = pool
	vr, err := cl.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: mVolSize, Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	vol := vr.GetVolume().GetId()
	open, err := cl.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v", Client: "test"})
	if err != nil {
		t.Fatal(err)
	}
	epoch := open.GetEpoch()
	if epoch == 0 {
		t.Fatal("writer session with epoch 0")
	}

	rng := rand.New(rand.NewSource(9))
	model := make([]byte, mVolSize)
	write := func(n int) {
		for i := 0; i < n; i++ {
			off := uint64(rng.Intn(mVolSize/4096)) * 4096
			data := make([]byte, 4096)
			rng.Read(data)
			if st := tc.write(vol, epoch, off, data); st != api.StatusOK {
				t.Fatalf("write at %d: %v", off, st)
			}
			copy(model[off:], data)
		}
	}
	verify := func() {
		for off := 0; off < mVolSize; off += mChunk {
			got := tc.read(vol, uint64(off), mChunk)
			for i := range got {
				if got[i] != model[off+i] {
					t.Fatalf("byte %d reads back %d, want %d", off+i, got[i], model[off+i])
				}
			}
		}
	}
	write(60)
	verify()
	tc.converged()

	id := tc.nodes[1].cs.ID()
	tc.stop(1)
	write(60)
	tc.start(1)
	if got := tc.nodes[1].cs.ID(); got != id {
		t.Fatalf("restarted chunkserver has id %d, had %d", got, id)
	}
	write(10)
	verify()
	tc.converged()

	// The MDS sees every chunkserver online, ok, with its copysets.
	st, err := cl.ClusterStatus(ctx, &api.ClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	tc.waitFor("MDS to see healthy copysets", func() bool {
		st, err = cl.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		return err == nil && st.GetCopysetsHealthy() == 4
	})
	for _, cs := range st.GetChunkservers() {
		if !cs.GetOnline() || cs.GetDiskState() != api.DiskState_DISK_STATE_OK {
			t.Fatalf("chunkserver %d: online=%v disk state %v", cs.GetId(), cs.GetOnline(), cs.GetDiskState())
		}
	}
}

// A data directory whose id the MDS does not know (another cluster's, or the
// MDS's metadata was lost) is refused instead of retried forever.
func TestRealMDSUnknownID(t *testing.T) {
	if testing.Short() {
		t.Skip("etcd: -short")
	}
	addr := startRealMDS(t)
	dir := t.TempDir()
	if err := writeID(dir, 4242); err != nil {
		t.Fatal(err)
	}
	cs, err := New(Config{DataDir: dir, MDS: []string{addr}, Logger: testLogger(t), PreallocChunks: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cs.Run(ctx); !errors.Is(err, ErrIdentity) {
		t.Fatalf("Run with an unknown id: %v", err)
	}
}

// The real MDS's recovery scheduler replaces a chunkserver that stays down:
// the chunkservers carry the moves out (learner, catch up, promote, remove)
// and every copyset ends with three identical, healthy replicas again.
func TestRealMDSRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test with etcd: -short")
	}
	addr := startRealMDSWith(t, func(c *mds.Config) {
		c.HeartbeatTimeout = time.Second
		c.RecoveryGrace = time.Second
		c.ScheduleInterval = 200 * time.Millisecond
		c.MaxRecoveryMoves = 8
	})
	tc := startNodes(t, addr, nil)
	tc.addNode(addr) // a fourth chunkserver to move replicas to
	cl, err := mdsclient.Dial([]string{addr}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wholeTestMDS)
	defer cancel()
	pr, err := cl.CreatePool(ctx, &api.CreatePoolRequest{Name: "default", Replicas: 3, ChunkSize: mChunk, CopysetCount: 4})
	if err != nil {
		t.Fatal(err)
	}
	tc.pool = pr.GetPool()
	vr, err := cl.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: mVolSize, Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	vol := vr.GetVolume().GetId()
	open, err := cl.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v", Client: "test"})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(21))
	model := make([]byte, mVolSize)
	write := func(n int) {
		for i := 0; i < n; i++ {
			off := uint64(rng.Intn(mVolSize/4096)) * 4096
			data := make([]byte, 4096)
			rng.Read(data)
			if st := tc.write(vol, open.GetEpoch(), off, data); st != api.StatusOK {
				t.Fatalf("write at %d: %v", off, st)
			}
			copy(model[off:], data)
		}
	}
	write(80)
	// Stop the chunkserver that holds the most copysets.
	var victim int
	most := -1
	for i := 0; i < 4; i++ {
		if n := len(tc.nodes[i].cs.Copysets()); n > most {
			victim, most = i, n
		}
	}
	gone := tc.nodes[victim].cs.ID()
	tc.stop(victim)
	write(40)
	tc.waitFor("the scheduler to re-replicate every copyset", func() bool {
		st, err := cl.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil || st.GetCopysetsHealthy() != 4 {
			return false
		}
		for _, c := range st.GetCopysets() {
			if slices.Contains(c.GetMembers(), gone) || c.GetMove() != nil {
				return false
			}
		}
		return true
	})
	write(20)
	for off := 0; off < mVolSize; off += mChunk {
		if got := tc.read(vol, uint64(off), mChunk); !bytes.Equal(got, model[off:off+mChunk]) {
			t.Fatalf("chunk at %d differs after recovery", off)
		}
	}
	// Every copyset's three replicas are identical.
	st, err := cl.ClusterStatus(ctx, &api.ClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	idx := map[uint64]int{}
	for i, n := range tc.nodes {
		idx[n.cs.ID()] = i
	}
	for _, c := range st.GetCopysets() {
		var nodes []int
		for _, m := range c.GetMembers() {
			nodes = append(nodes, idx[m])
		}
		tc.convergedOn(c.GetId(), nodes)
	}
}
