package chunkserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/scrub"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// testMDS is a minimal in-process MDS for cluster tests: one pool whose
// copysets all have the first three registered chunkservers as members, and a
// fixed list of volumes.
type testMDS struct {
	api.UnimplementedMDSServer
	mu       sync.Mutex
	pool     *api.Pool
	vols     []*api.Volume
	rev      uint64
	nextID   uint64
	addrs    map[uint64]string
	hbs      map[uint64]*api.HeartbeatRequest
	grpcAddr string
	// members and epochs override the copysets' default members [1 2 3], epoch 0.
	members map[uint32][]uint64
	epochs  map[uint32]uint64
	// transfers go to every heartbeat answer (the leader acts on them).
	transfers []*api.LeaderTransfer
}

// setMembers changes a copyset's members (and bumps its epoch), as the
// scheduler would.
func (m *testMDS) setMembers(c uint32, members []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.members[c] = members
	m.epochs[c]++
}

func startTestMDS(t testing.TB, pool *api.Pool, vols []*api.Volume) *testMDS {
	t.Helper()
	m := &testMDS{pool: pool, vols: vols, rev: 1, addrs: map[uint64]string{}, hbs: map[uint64]*api.HeartbeatRequest{},
		members: map[uint32][]uint64{}, epochs: map[uint32]uint64{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	api.RegisterMDSServer(s, m)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	m.grpcAddr = ln.Addr().String()
	return m
}

func (m *testMDS) RegisterChunkServer(_ context.Context, r *api.RegisterChunkServerRequest) (*api.RegisterChunkServerResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := r.GetId()
	if id == 0 {
		m.nextID++
		id = m.nextID
	}
	m.addrs[id] = r.GetAddr()
	return &api.RegisterChunkServerResponse{Id: id}, nil
}

func (m *testMDS) Heartbeat(_ context.Context, r *api.HeartbeatRequest) (*api.HeartbeatResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hbs[r.GetId()] = r
	m.addrs[r.GetId()] = r.GetAddr()
	resp := &api.HeartbeatResponse{VolumesRevision: m.rev, TransferLeaders: m.transfers}
	if len(m.addrs) < 3 {
		return resp, nil
	}
	for id, a := range m.addrs {
		resp.Peers = append(resp.Peers, &api.ChunkServer{Id: id, Addr: a})
	}
	for c := uint32(0); c < m.pool.GetCopysetCount(); c++ {
		members := m.members[c]
		if members == nil {
			members = []uint64{1, 2, 3}
		}
		for _, id := range members {
			if id == r.GetId() {
				resp.Copysets = append(resp.Copysets, &api.Copyset{PoolId: m.pool.GetId(), Id: c,
					Members: members, Epoch: m.epochs[c]})
			}
		}
	}
	return resp, nil
}

func (m *testMDS) ListPools(context.Context, *api.ListPoolsRequest) (*api.ListPoolsResponse, error) {
	return &api.ListPoolsResponse{Pools: []*api.Pool{m.pool}}, nil
}

func (m *testMDS) ListVolumes(context.Context, *api.ListVolumesRequest) (*api.ListVolumesResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &api.ListVolumesResponse{Volumes: m.vols, Revision: m.rev}, nil
}

func (m *testMDS) heartbeat(id uint64) *api.HeartbeatRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hbs[id]
}

// testNode is one chunkserver of a test cluster.
type testNode struct {
	cs     *ChunkServer
	cfg    Config
	cancel context.CancelFunc
	done   chan error
}

type testCluster struct {
	t     testing.TB
	mds   *testMDS
	nodes []*testNode
	pool  *api.Pool

	tune func(*Config)
	// sec is how the test's own connections (conn) dial.
	sec transport.Security

	mu     sync.Mutex
	conns  map[string]*transport.Conn
	leader map[uint32]uint64 // copyset → chunkserver id
	next   int               // round-robin start when no leader is known
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("BASALT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newTestCluster(t testing.TB, pool *api.Pool, vols []*api.Volume, tune func(*Config)) *testCluster {
	t.Helper()
	mds := startTestMDS(t, pool, vols)
	tc := startNodes(t, mds.grpcAddr, tune)
	tc.mds, tc.pool = mds, pool
	return tc
}

// startNodes starts three chunkservers (servers s0, s1, s2 of one zone) that
// register with the MDS at mdsAddr, one after the other.
func startNodes(t testing.TB, mdsAddr string, tune func(*Config)) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, conns: map[string]*transport.Conn{}, leader: map[uint32]uint64{}}
	tc.tune = tune
	for i := 0; i < 3; i++ {
		tc.addNode(mdsAddr)
	}
	t.Cleanup(func() {
		tc.mu.Lock()
		for _, c := range tc.conns {
			c.Close()
		}
		tc.mu.Unlock()
		for i := range tc.nodes {
			tc.stop(i)
		}
	})
	return tc
}

// addNode starts one more chunkserver and waits for its registration.
func (tc *testCluster) addNode(mdsAddr string) int {
	tc.t.Helper()
	i := len(tc.nodes)
	cfg := Config{
		DataDir:           tc.t.TempDir(),
		MDS:               []string{mdsAddr},
		Listen:            "127.0.0.1:0",
		Zone:              "z",
		Server:            fmt.Sprintf("s%d", i),
		HeartbeatInterval: 50 * time.Millisecond,
		TickInterval:      20 * time.Millisecond,
		PreallocChunks:    -1,
		RaftWorkers:       2,
		Logger:            testLogger(tc.t).With("node", i),
	}
	if tc.tune != nil {
		tc.tune(&cfg)
	}
	tc.nodes = append(tc.nodes, &testNode{cfg: cfg})
	tc.start(i)
	tc.waitFor(fmt.Sprintf("node %d registered", i), func() bool { return tc.nodes[i].cs.ID() != 0 })
	return i
}

func (tc *testCluster) start(i int) {
	tc.t.Helper()
	n := tc.nodes[i]
	cs, err := New(n.cfg)
	if err != nil {
		tc.t.Fatalf("node %d: %v", i, err)
	}
	n.cfg.Listen = cs.Addr() // a restart keeps the address
	ctx, cancel := context.WithCancel(context.Background())
	n.cs, n.cancel, n.done = cs, cancel, make(chan error, 1)
	go func() { n.done <- cs.Run(ctx) }()
}

func (tc *testCluster) stop(i int) {
	n := tc.nodes[i]
	if n.cancel == nil {
		return
	}
	n.cancel()
	if err := <-n.done; err != nil {
		tc.t.Errorf("node %d Run: %v", i, err)
	}
	n.cancel = nil
}

func (tc *testCluster) waitFor(what string, cond func() bool) {
	tc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tc.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (tc *testCluster) node(id uint64) *testNode {
	for _, n := range tc.nodes {
		if n.cs.ID() == id {
			return n
		}
	}
	return nil
}

func (tc *testCluster) conn(addr string) *transport.Conn {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if c := tc.conns[addr]; c != nil && c.Err() == nil {
		return c
	}
	c, err := transport.Dial(context.Background(), addr, transport.ConnConfig{Security: tc.sec})
	if err != nil {
		return nil
	}
	tc.conns[addr] = c
	return c
}

// do sends one request to the copyset's leader, following NOT_LEADER hints and
// retrying while there is no leader, like the client library does.
func (tc *testCluster) do(h api.Header, payload, readBuf []byte) (api.Header, error) {
	deadline := time.Now().Add(60 * time.Second)
	try := 0
	for time.Now().Before(deadline) {
		tc.mu.Lock()
		id := tc.leader[h.Copyset]
		tc.mu.Unlock()
		if id == 0 || tc.node(id) == nil {
			tc.mu.Lock()
			tc.next++
			id = tc.nodes[tc.next%len(tc.nodes)].cs.ID()
			tc.mu.Unlock()
		}
		try++
		c := tc.conn(tc.node(id).cs.Addr())
		if c == nil {
			tc.mu.Lock()
			delete(tc.leader, h.Copyset)
			tc.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		call := &transport.Call{Header: h, Payload: payload, ReadBuf: readBuf}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := c.Do(ctx, call)
		cancel()
		if err != nil {
			tc.mu.Lock()
			delete(tc.leader, h.Copyset)
			tc.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		switch call.Reply.Status {
		case api.StatusNotLeader, api.StatusNoSuchCopyset:
			tc.mu.Lock()
			tc.leader[h.Copyset] = call.Reply.Hint
			tc.mu.Unlock()
			if call.Reply.Hint == 0 {
				time.Sleep(20 * time.Millisecond)
			}
			continue
		}
		tc.mu.Lock()
		if call.Reply.Status == api.StatusNoSpace || call.Reply.Status == api.StatusIOError {
			delete(tc.leader, h.Copyset) // a stopped replica: ask another member next time
		} else {
			tc.leader[h.Copyset] = id
		}
		tc.mu.Unlock()
		return call.Reply, nil
	}
	return api.Header{}, errors.New("no leader answered")
}

func (tc *testCluster) write(vol, epoch, off uint64, data []byte) api.Status {
	tc.t.Helper()
	cs := api.CopysetOf(vol, off/tc.pool.GetChunkSize(), tc.pool.GetCopysetCount())
	r, err := tc.do(api.Header{Op: api.OpWrite, Volume: vol, Epoch: epoch, Offset: off,
		Length: uint32(len(data)), Copyset: cs}, data, nil)
	if err != nil {
		tc.t.Fatalf("write at %d: %v", off, err)
	}
	return r.Status
}

func (tc *testCluster) read(vol, off uint64, n int) []byte {
	tc.t.Helper()
	cs := api.CopysetOf(vol, off/tc.pool.GetChunkSize(), tc.pool.GetCopysetCount())
	buf := make([]byte, n)
	r, err := tc.do(api.Header{Op: api.OpRead, Volume: vol, Offset: off, Length: uint32(n), Copyset: cs}, nil, buf)
	if err != nil || r.Status != api.StatusOK {
		tc.t.Fatalf("read at %d: %v %v", off, r.Status, err)
	}
	return buf
}

// checksums asks node i for copyset c's chunk checksums.
func (tc *testCluster) checksums(i int, c uint32) []scrub.ChunkSum {
	tc.t.Helper()
	conn := tc.conn(tc.nodes[i].cs.Addr())
	call := &transport.Call{Header: api.Header{Op: api.OpChecksum, Volume: uint64(tc.pool.GetId()), Copyset: c},
		ReadBuf: make([]byte, 4<<20)}
	if err := conn.Do(context.Background(), call); err != nil || call.Reply.Status != api.StatusOK {
		tc.t.Fatalf("checksum of copyset %d on node %d: %v %v", c, i, call.Reply.Status, err)
	}
	sums, err := scrub.DecodeChecksums(call.ReadBuf[:call.Reply.PayloadLen])
	if err != nil {
		tc.t.Fatal(err)
	}
	return sums
}

// converged waits until every replica of every copyset applied the same index,
// then checks that their chunk checksums are identical.
func (tc *testCluster) converged() {
	tc.t.Helper()
	tc.waitFor("replicas to apply the same index", func() bool {
		for c := uint32(0); c < tc.pool.GetCopysetCount(); c++ {
			g := api.GroupID(tc.pool.GetId(), c)
			var want uint64
			for i, n := range tc.nodes {
				var st raftstore.GroupStatus
				ok := false
				for _, s := range n.cs.Copysets() {
					if s.ID == g {
						st, ok = s, true
					}
				}
				if !ok || !st.Healthy {
					return false
				}
				if i == 0 {
					want = st.Applied
				} else if st.Applied != want {
					return false
				}
			}
		}
		return true
	})
	for c := uint32(0); c < tc.pool.GetCopysetCount(); c++ {
		ref := tc.checksums(0, c)
		for i := 1; i < len(tc.nodes); i++ {
			got := tc.checksums(i, c)
			if fmt.Sprint(got) != fmt.Sprint(ref) {
				tc.t.Fatalf("copyset %d: replica %d differs from replica 0:\n%v\n%v", c, i, got, ref)
			}
		}
	}
}

const (
	ctChunk   = 64 << 10
	ctVolume  = 7
	ctVolSize = 32 * ctChunk
)

func clusterPool(copysets uint32) *api.Pool {
	return &api.Pool{Id: 1, Name: "default", Replicas: 3, ChunkSize: ctChunk, CopysetCount: copysets}
}

// writeRandom writes n random 4 KiB blocks and records them in model.
func (tc *testCluster) writeRandom(rng *rand.Rand, model []byte, n int, epoch uint64) {
	tc.t.Helper()
	for i := 0; i < n; i++ {
		off := uint64(rng.Intn(ctVolSize/4096)) * 4096
		data := make([]byte, 4096)
		rng.Read(data)
		if st := tc.write(ctVolume, epoch, off, data); st != api.StatusOK {
			tc.t.Fatalf("write at %d: %v", off, st)
		}
		copy(model[off:], data)
	}
}

func (tc *testCluster) verify(model []byte) {
	tc.t.Helper()
	for off := 0; off < ctVolSize; off += ctChunk {
		if got := tc.read(ctVolume, uint64(off), ctChunk); !bytes.Equal(got, model[off:off+ctChunk]) {
			tc.t.Fatalf("chunk at %d reads back different data", off)
		}
	}
}

func TestClusterWriteReadRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	tc := newTestCluster(t, clusterPool(4), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}}, nil)
	rng := rand.New(rand.NewSource(2))
	model := make([]byte, ctVolSize)
	tc.writeRandom(rng, model, 100, 1)
	tc.verify(model)
	tc.converged()

	// Stop one node, keep writing, restart it from its data directory: it
	// catches up through the log.
	tc.stop(2)
	tc.writeRandom(rng, model, 100, 1)
	tc.start(2)
	tc.writeRandom(rng, model, 20, 1)
	tc.verify(model)
	tc.converged()

	// The heartbeats reported every copyset.
	var writes uint64
	for id := uint64(1); id <= 3; id++ {
		hb := tc.mds.heartbeat(id)
		if hb == nil || len(hb.GetCopysets()) != 4 || hb.GetDiskState() != api.DiskState_DISK_STATE_OK {
			t.Fatalf("heartbeat: %v", hb)
		}
		writes += hb.GetWriteOps()
	}
	if writes == 0 {
		t.Fatal("no write ops reported")
	}
}

func TestClusterSnapshotCatchUp(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}},
		func(c *Config) { c.SnapshotEntries = 20; c.CatchUpEntries = 5 })
	rng := rand.New(rand.NewSource(3))
	model := make([]byte, ctVolSize)
	tc.writeRandom(rng, model, 40, 1)
	tc.converged()
	tc.stop(1)
	tc.writeRandom(rng, model, 150, 1)
	tc.start(1)
	tc.converged()
	tc.verify(model)
	var received uint64
	for _, n := range tc.nodes {
		received += n.cs.HostStats().SnapshotsReceived
	}
	if received == 0 {
		t.Fatal("the restarted replica caught up without a snapshot")
	}
}

func TestClusterFencing(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}}, nil)
	if st := tc.write(ctVolume, 1, 0, []byte("first")); st != api.StatusOK {
		t.Fatal(st)
	}
	if st := tc.write(ctVolume, 2, 4096, []byte("second")); st != api.StatusOK {
		t.Fatal(st)
	}
	// chunk 0 is in one copyset: the old writer is fenced there now.
	if st := tc.write(ctVolume, 1, 0, []byte("stale")); st != api.StatusFenced {
		t.Fatalf("stale writer: %v", st)
	}
	if got := tc.read(ctVolume, 0, 5); string(got) != "first" {
		t.Fatalf("read %q", got)
	}
	// A newer writer's first IO on the other chunk's copyset is a read: it
	// fences through raft before reading; the epoch-2 writer is then refused there.
	off := uint64(ctChunk) // chunk 1: another copyset than chunk 0
	cs := api.CopysetOf(ctVolume, 1, tc.pool.GetCopysetCount())
	buf := make([]byte, 6)
	r, err := tc.do(api.Header{Op: api.OpRead, Volume: ctVolume, Epoch: 3, Offset: off, Length: 6, Copyset: cs}, nil, buf)
	if err != nil || r.Status != api.StatusOK {
		t.Fatalf("fencing read: %v %v", r.Status, err)
	}
	if st := tc.write(ctVolume, 2, off, []byte("late!!")); st != api.StatusFenced {
		t.Fatalf("write after a newer reader fenced: %v", st)
	}
	r, err = tc.do(api.Header{Op: api.OpRead, Volume: ctVolume, Epoch: 2, Offset: off, Length: 6, Copyset: cs}, nil, buf)
	if err != nil || r.Status != api.StatusFenced {
		t.Fatalf("stale read: %v %v", r.Status, err)
	}
	tc.converged()
}

// groupStatus returns node i's status of copyset c.
func (tc *testCluster) groupStatus(i int, c uint32) (raftstore.GroupStatus, bool) {
	g := api.GroupID(tc.pool.GetId(), c)
	for _, s := range tc.nodes[i].cs.Copysets() {
		if s.ID == g {
			return s, true
		}
	}
	return raftstore.GroupStatus{}, false
}

// convergedOn checks that the given nodes' replicas of copyset c applied the
// same index and hold identical chunks.
func (tc *testCluster) convergedOn(c uint32, nodes []int) {
	tc.t.Helper()
	tc.waitFor(fmt.Sprintf("copyset %d replicas to converge", c), func() bool {
		var want uint64
		for k, i := range nodes {
			st, ok := tc.groupStatus(i, c)
			if !ok || !st.Healthy || (k > 0 && st.Applied != want) {
				return false
			}
			want = st.Applied
		}
		return true
	})
	ref := tc.checksums(nodes[0], c)
	for _, i := range nodes[1:] {
		if got := tc.checksums(i, c); fmt.Sprint(got) != fmt.Sprint(ref) {
			tc.t.Fatalf("copyset %d: node %d differs from node %d", c, i, nodes[0])
		}
	}
}

// The MDS moves a replica (as its scheduler would): the leader adds the new
// member as a learner, promotes it once caught up, removes the old one, and
// the old one deletes its copy.
func TestClusterMembershipChange(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}}, nil)
	rng := rand.New(rand.NewSource(5))
	model := make([]byte, ctVolSize)
	tc.writeRandom(rng, model, 60, 1)
	n4 := tc.addNode(tc.mds.grpcAddr)
	if id := tc.nodes[n4].cs.ID(); id != 4 {
		t.Fatalf("new node id %d", id)
	}
	// Replace copyset 0's leader: the hardest case, since the leader is the one
	// that must carry out the change, and the MDS stops telling it about it.
	var gone int
	var keep []int
	var want []uint64
	tc.waitFor("a leader of copyset 0", func() bool {
		for i := 0; i < 3; i++ {
			if st, ok := tc.groupStatus(i, 0); ok && st.IsLeader {
				gone = i
				return true
			}
		}
		return false
	})
	for i := 0; i < 3; i++ {
		if i != gone {
			keep = append(keep, i)
			want = append(want, tc.nodes[i].cs.ID())
		}
	}
	want = append(want, 4)
	tc.mds.setMembers(0, want)
	tc.waitFor("the new member to become a voter and the old leader to leave", func() bool {
		st, ok := tc.groupStatus(n4, 0)
		if !ok || fmt.Sprint(st.Voters) != fmt.Sprint(want) || len(st.Learners) != 0 {
			return false
		}
		_, old := tc.groupStatus(gone, 0)
		return !old
	})
	tc.writeRandom(rng, model, 30, 1)
	tc.verify(model)
	tc.convergedOn(0, append(keep, n4))
	tc.convergedOn(1, []int{0, 1, 2})
	if _, ok := tc.groupStatus(n4, 1); ok {
		t.Fatal("the new node hosts a copyset it is not a member of")
	}
}

// setVolumes replaces the volume list and bumps its revision.
func (m *testMDS) setVolumes(vols []*api.Volume) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vols = vols
	m.rev++
}

// Resizes and deletions reach the chunkservers through the heartbeat's
// volumes_revision: a grown volume takes IO past its old end; a deleted one
// is refused and its chunks are removed from every replica.
func TestClusterVolumeResizeDelete(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctChunk, PoolId: 1}, {Id: 8, Size: ctChunk, PoolId: 1}}, nil)
	if st := tc.write(ctVolume, 1, ctChunk, []byte("x")); st != api.StatusOutOfRange {
		t.Fatalf("write past the end: %v", st)
	}
	if st := tc.write(8, 1, 0, []byte("doomed")); st != api.StatusOK {
		t.Fatal(st)
	}
	tc.mds.setVolumes([]*api.Volume{{Id: ctVolume, Size: 2 * ctChunk, PoolId: 1}})
	tc.waitFor("the resize to arrive", func() bool {
		return tc.write(ctVolume, 1, ctChunk, []byte("x")) == api.StatusOK
	})
	cs := api.CopysetOf(8, 0, 2)
	tc.waitFor("the deleted volume's chunks to go", func() bool {
		for i := range tc.nodes {
			for _, s := range tc.checksums(i, cs) {
				if s.Volume == 8 {
					return false
				}
			}
		}
		return true
	})
	if st := tc.write(8, 1, 0, []byte("again")); st != api.StatusNoSuchVolume {
		t.Fatalf("write to a deleted volume: %v", st)
	}
	if got := tc.read(ctVolume, ctChunk, 1); string(got) != "x" {
		t.Fatalf("read %q", got)
	}
}

// Leader balancing: the MDS names a copyset's new leader in heartbeat answers
// and the current leader hands over.
func TestClusterLeaderTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	tc := newTestCluster(t, clusterPool(1), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}}, nil)
	if st := tc.write(ctVolume, 1, 0, []byte("before")); st != api.StatusOK {
		t.Fatal(st)
	}
	var leader int
	for i := range tc.nodes {
		if st, ok := tc.groupStatus(i, 0); ok && st.IsLeader {
			leader = i
		}
	}
	to := tc.nodes[(leader+1)%3].cs.ID()
	tc.mds.mu.Lock()
	tc.mds.transfers = []*api.LeaderTransfer{{PoolId: 1, CopysetId: 0, To: to}}
	tc.mds.mu.Unlock()
	tc.waitFor("the named member to lead", func() bool {
		st, ok := tc.groupStatus((leader+1)%3, 0)
		return ok && st.IsLeader
	})
	if st := tc.write(ctVolume, 1, 0, []byte("after!")); st != api.StatusOK {
		t.Fatal(st)
	}
	if got := tc.read(ctVolume, 0, 6); string(got) != "after!" {
		t.Fatalf("read %q", got)
	}
}
