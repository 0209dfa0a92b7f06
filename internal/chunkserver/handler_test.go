package chunkserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/scrub"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// fakeMDS answers ListPools and ListVolumes from fixed lists.
type fakeMDS struct {
	api.MDSClient // nil: other methods panic (not used by the volume cache)
	mu            sync.Mutex
	pools         []*api.Pool
	vols          []*api.Volume
	rev           uint64
	lists         int
	err           error         // returned by ListVolumes when set
	gate          chan struct{} // when set, ListVolumes waits for it to close
	blocked       int           // ListVolumes calls waiting on gate
}

func (f *fakeMDS) ListPools(context.Context, *api.ListPoolsRequest, ...grpc.CallOption) (*api.ListPoolsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &api.ListPoolsResponse{Pools: f.pools}, nil
}

func (f *fakeMDS) ListVolumes(context.Context, *api.ListVolumesRequest, ...grpc.CallOption) (*api.ListVolumesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if f.err != nil {
		return nil, f.err
	}
	if g := f.gate; g != nil {
		f.blocked++
		f.mu.Unlock()
		<-g
		f.mu.Lock()
		f.blocked--
	}
	return &api.ListVolumesResponse{Volumes: f.vols, Revision: f.rev}, nil
}

// directHost applies proposals at once on a single replica (no raft): enough
// to check what the handler validates and proposes.
type directHost struct {
	mu       sync.Mutex
	applyMu  sync.Mutex // held while applying; guards index
	replicas map[uint64]*replica
	index    uint64
	proposed int
	notLead  uint64 // if set, every proposal fails NOT_LEADER with this hint
	// hold, while set, parks every proposal (in order) until release.
	hold   bool
	parked []func()
	// term is the leader term ReadBarrierTerm tells (1 while 0);
	// ProposeInTerm refuses NOT_LEADER for another.
	term uint64
	// moveTerm: every barrier's term ends right after it is told.
	moveTerm bool
}

func (d *directHost) Propose(id uint64, data []byte, done func(error)) {
	d.mu.Lock()
	d.proposed++
	if d.notLead != 0 {
		d.mu.Unlock()
		done(&api.Error{Status: api.StatusNotLeader, Hint: d.notLead})
		return
	}
	r := d.replicas[id]
	if r == nil {
		d.mu.Unlock()
		done(api.ErrNoSuchCopyset)
		return
	}
	apply := func() {
		d.applyMu.Lock()
		d.index++
		res := r.sm.Apply(d.index, data[raftstore.ProposalHeader:]) // as raftstore.Host does
		d.applyMu.Unlock()
		done(res) // unlocked: done may propose again
	}
	if d.hold {
		d.parked = append(d.parked, apply)
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	apply()
}

// release applies the parked proposals, and those they let in, in order,
// and stops parking.
func (d *directHost) release() {
	for {
		d.mu.Lock()
		d.hold = false
		if len(d.parked) == 0 {
			d.mu.Unlock()
			return
		}
		p := d.parked[0]
		d.parked = d.parked[1:]
		d.mu.Unlock()
		p()
	}
}

// nParked is the number of proposals parked.
func (d *directHost) nParked() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.parked)
}

func (d *directHost) ReadBarrier(id uint64, done func(error)) { done(nil) }

func (d *directHost) ReadBarrierTerm(id uint64, done func(uint64, error)) {
	d.mu.Lock()
	term := max(d.term, 1)
	if d.moveTerm {
		d.term = term + 1
	}
	d.mu.Unlock()
	done(term, nil)
}

func (d *directHost) ProposeInTerm(id uint64, data []byte, term uint64, done func(error)) {
	d.mu.Lock()
	now := max(d.term, 1)
	d.mu.Unlock()
	if term != now {
		done(&raftstore.NotLeaderError{})
		return
	}
	d.Propose(id, data, done)
}

const (
	hPool      = 1
	hCopysets  = 4
	hChunk     = 64 << 10
	hVolume    = 42
	hVolSize   = 10 * hChunk
	hEpoch     = 5
	hDeleted   = 43
	hOtherPool = 2
	hBigChunks = 44 // in hOtherPool, whose chunks are 1 GiB
)

type handlerEnv struct {
	t     *testing.T
	mds   *fakeMDS
	host  *directHost
	hd    *handler
	srv   *transport.Server
	addr  string
	store *datastore.Store
}

// newHandlerEnv serves a handler over real TCP that hosts every copyset of
// pool hPool on a real datastore, with proposals applied directly.
func newHandlerEnv(t *testing.T) *handlerEnv {
	t.Helper()
	return newHandlerEnvWith(t, transport.Security{}, noPeers{})
}

// newHandlerEnvWith is newHandlerEnv with the server's security and peer
// transport given.
func newHandlerEnvWith(t *testing.T, sec transport.Security, peers peerHandler) *handlerEnv {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := datastore.Open(datastore.Config{Dir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mds := &fakeMDS{
		pools: []*api.Pool{{Id: hPool, ChunkSize: hChunk, CopysetCount: hCopysets, Replicas: 3},
			{Id: hOtherPool, ChunkSize: 1 << 30, CopysetCount: 1, Replicas: 3}},
		vols: []*api.Volume{{Id: hVolume, Size: hVolSize, PoolId: hPool}, {Id: hBigChunks, Size: 1 << 30, PoolId: hOtherPool},
			{Id: hDeleted, Size: hVolSize, PoolId: hPool}},
		rev: 1,
	}
	host := &directHost{replicas: map[uint64]*replica{}}
	vc := newVolumeCache(mds, log, nil)
	for c := uint32(0); c < hCopysets; c++ {
		g := api.GroupID(hPool, c)
		cs, err := st.Copyset(g, hChunk)
		if err != nil {
			t.Fatal(err)
		}
		host.replicas[g] = &replica{group: g, chunkSize: hChunk, store: cs,
			sm: newStateMachine(g, hChunk, cs, nil)}
	}
	if err := vc.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	// hDeleted goes away.
	mds.vols = mds.vols[:2]
	mds.rev = 2
	if err := vc.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	hd := &handler{
		log:     log,
		ctx:     context.Background(),
		vols:    vc,
		host:    host,
		replica: func(g uint64) *replica { host.mu.Lock(); defer host.mu.Unlock(); return host.replicas[g] },
		peerIn:  peers,
		metrics: newMetrics(),
	}
	srv := transport.NewServer(transport.ServerConfig{Logger: log, Security: sec}, hd)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); hd.missWG.Wait() })
	return &handlerEnv{t: t, mds: mds, host: host, hd: hd, srv: srv, addr: ln.Addr().String(), store: st}
}

func (e *handlerEnv) dial() *transport.Conn {
	e.t.Helper()
	c, err := transport.Dial(context.Background(), e.addr, transport.ConnConfig{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// io sends one IO frame and returns the reply status and payload.
func (e *handlerEnv) do(c *transport.Conn, h api.Header, payload []byte) (api.Header, []byte) {
	e.t.Helper()
	call := &transport.Call{Header: h, Payload: payload, ReadBuf: make([]byte, hChunk+1)}
	// Generous: a 64 MiB payload under the race detector on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Do(ctx, call); err != nil {
		e.t.Fatalf("%v: %v", h.Op, err)
	}
	return call.Reply, call.ReadBuf[:call.Reply.PayloadLen]
}

func csOf(vol, off uint64) uint32 { return api.CopysetOf(vol, off/hChunk, hCopysets) }

func ioHdr(op api.Op, off uint64, n uint32) api.Header {
	return api.Header{Op: op, Volume: hVolume, Epoch: hEpoch, Offset: off, Length: n, Copyset: csOf(hVolume, off)}
}

// snapshotData reads the whole volume through the handler.
func (e *handlerEnv) snapshotData(c *transport.Conn) []byte {
	var out []byte
	for off := uint64(0); off < hVolSize; off += hChunk {
		h := ioHdr(api.OpRead, off, hChunk)
		h.Epoch = 0
		r, p := e.do(c, h, nil)
		if r.Status != api.StatusOK {
			e.t.Fatalf("read at %d: %v", off, r.Status)
		}
		out = append(out, p...)
	}
	return out
}

func TestHandlerIO(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	rng := rand.New(rand.NewSource(1))
	data := make([]byte, 8192)
	rng.Read(data)
	off := uint64(3*hChunk - 4096) // last 4 KiB of chunk 2
	if r, _ := e.do(c, ioHdr(api.OpWrite, off, 4096), data[:4096]); r.Status != api.StatusOK {
		t.Fatalf("write: %v", r.Status)
	}
	if r, _ := e.do(c, ioHdr(api.OpWrite, off+4096, 4096), data[4096:]); r.Status != api.StatusOK {
		t.Fatalf("write: %v", r.Status)
	}
	r, p := e.do(c, ioHdr(api.OpRead, off, 4096), nil)
	if r.Status != api.StatusOK || !bytes.Equal(p, data[:4096]) {
		t.Fatalf("read back: %v, equal=%v", r.Status, bytes.Equal(p, data[:4096]))
	}
	// Large writes are proposed from the buffer the transport read them into
	// (header room before the data): whole chunk 3, then 20 KiB of chunk 4,
	// then a 16 KiB write the volume refuses (past its end).
	big := make([]byte, hChunk)
	rng.Read(big)
	for _, w := range []struct {
		off uint64
		n   int
	}{{3 * hChunk, hChunk}, {4*hChunk + 1000, 20 << 10}} {
		if r, _ := e.do(c, ioHdr(api.OpWrite, w.off, uint32(w.n)), big[:w.n]); r.Status != api.StatusOK {
			t.Fatalf("%d-byte write: %v", w.n, r.Status)
		}
		if r, p := e.do(c, ioHdr(api.OpRead, w.off, uint32(w.n)), nil); r.Status != api.StatusOK || !bytes.Equal(p, big[:w.n]) {
			t.Fatalf("%d-byte write read back: %v, equal=%v", w.n, r.Status, bytes.Equal(p, big[:w.n]))
		}
	}
	if r, _ := e.do(c, ioHdr(api.OpWrite, hVolSize-8<<10, 16<<10), big[:16<<10]); r.Status != api.StatusOutOfRange {
		t.Fatalf("16 KiB write past the end: %v", r.Status)
	}
	if r, _ := e.do(c, ioHdr(api.OpWriteZeroes, off, 100), nil); r.Status != api.StatusOK {
		t.Fatalf("zeroes: %v", r.Status)
	}
	if r, _ := e.do(c, ioHdr(api.OpTrim, off+100, 100), nil); r.Status != api.StatusOK {
		t.Fatalf("trim: %v", r.Status)
	}
	_, p = e.do(c, ioHdr(api.OpRead, off, 300), nil)
	want := append(make([]byte, 200), data[200:300]...)
	if !bytes.Equal(p, want) {
		t.Fatal("zeroes/trim did not read back as zeros")
	}
	for _, op := range []api.Op{api.OpFlush, api.OpPing} {
		if r, _ := e.do(c, api.Header{Op: op}, nil); r.Status != api.StatusOK {
			t.Fatalf("%v: %v", op, r.Status)
		}
	}
	// A newer writer's read fences the old writer out.
	h := ioHdr(api.OpRead, off, 10)
	h.Epoch = hEpoch + 1
	if r, _ := e.do(c, h, nil); r.Status != api.StatusOK {
		t.Fatalf("fencing read: %v", r.Status)
	}
	if r, _ := e.do(c, ioHdr(api.OpWrite, off, 4), []byte("old!")); r.Status != api.StatusFenced {
		t.Fatalf("stale write after fence: %v", r.Status)
	}
	if r, _ := e.do(c, ioHdr(api.OpRead, off, 4), nil); r.Status != api.StatusFenced {
		t.Fatalf("stale read after fence: %v", r.Status)
	}
	// NOT_LEADER carries the hint.
	e.host.mu.Lock()
	e.host.notLead = 77
	e.host.mu.Unlock()
	w := ioHdr(api.OpWrite, 0, 1)
	w.Epoch = hEpoch + 1
	if r, _ := e.do(c, w, []byte{1}); r.Status != api.StatusNotLeader || r.Hint != 77 {
		t.Fatalf("not leader: %v hint %d", r.Status, r.Hint)
	}
	// Checksums: one copyset holds chunk 2; its list names it.
	ch := api.Header{Op: api.OpChecksum, Volume: hPool, Copyset: csOf(hVolume, off)}
	r, p = e.do(c, ch, nil)
	sums, err := scrub.DecodeChecksums(p)
	if r.Status != api.StatusOK || err != nil || len(sums) != 1 || sums[0].Volume != hVolume || sums[0].Index != 2 {
		t.Fatalf("checksum: %v %v %+v", r.Status, err, sums)
	}
}

func TestHandlerBadInput(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	// Some data to protect.
	seed := bytes.Repeat([]byte("basalt!!"), hChunk/8)
	for off := uint64(0); off < hVolSize; off += hChunk {
		if r, _ := e.do(c, ioHdr(api.OpWrite, off, hChunk), seed); r.Status != api.StatusOK {
			t.Fatalf("seed write: %v", r.Status)
		}
	}
	before := e.snapshotData(c)
	e.host.mu.Lock()
	proposedBefore := e.host.proposed
	e.host.mu.Unlock()

	wrongCS := ioHdr(api.OpWrite, 0, 4)
	wrongCS.Copyset = (wrongCS.Copyset + 1) % hCopysets
	bigCS := ioHdr(api.OpWrite, 0, 4)
	bigCS.Copyset = 1 << 30
	epoch0 := ioHdr(api.OpWrite, 0, 4)
	epoch0.Epoch = 0
	trim0 := ioHdr(api.OpTrim, 0, 4)
	trim0.Epoch = 0
	unknown := ioHdr(api.OpWrite, 0, 4)
	unknown.Volume = 999
	deleted := ioHdr(api.OpWrite, 0, 4)
	deleted.Volume = hDeleted
	deleted.Copyset = csOf(hDeleted, 0)
	stale := ioHdr(api.OpWrite, 0, 4)
	stale.Epoch = 0
	badOp := ioHdr(api.Op(99), 0, 4)
	zeroLen := ioHdr(api.OpWrite, 0, 0)
	readPayload := ioHdr(api.OpRead, 0, 4)
	badChecksum := api.Header{Op: api.OpChecksum, Volume: 1 << 40}
	noCS := api.Header{Op: api.OpChecksum, Volume: hOtherPool}
	cases := []struct {
		name    string
		h       api.Header
		payload []byte
		want    api.Status
	}{
		{"unknown op", badOp, []byte("abcd"), api.StatusBadRequest},
		{"past the end", ioHdr(api.OpWrite, hVolSize-2, 4), []byte("abcd"), api.StatusOutOfRange},
		{"offset far past the end", ioHdr(api.OpRead, 1<<62, 4), nil, api.StatusOutOfRange},
		{"offset+length overflows", ioHdr(api.OpRead, ^uint64(0)-1, 4), nil, api.StatusOutOfRange},
		{"crosses a chunk", ioHdr(api.OpWrite, hChunk-2, 4), []byte("abcd"), api.StatusOutOfRange},
		{"zeroes cross a chunk", ioHdr(api.OpWriteZeroes, hChunk-2, 4), nil, api.StatusOutOfRange},
		{"huge length", ioHdr(api.OpRead, 0, 1<<31), nil, api.StatusOutOfRange},
		{"unknown volume", unknown, []byte("abcd"), api.StatusNoSuchVolume},
		{"deleted volume", deleted, []byte("abcd"), api.StatusNoSuchVolume},
		{"wrong copyset", wrongCS, []byte("abcd"), api.StatusBadRequest},
		{"copyset out of range", bigCS, []byte("abcd"), api.StatusBadRequest},
		{"write with epoch 0", epoch0, []byte("abcd"), api.StatusReadOnly},
		{"trim with epoch 0", trim0, nil, api.StatusReadOnly},
		{"payload shorter than length", ioHdr(api.OpWrite, 0, 8), []byte("abcd"), api.StatusBadRequest},
		{"payload longer than length", ioHdr(api.OpWrite, 0, 2), []byte("abcd"), api.StatusBadRequest},
		{"zero length", zeroLen, nil, api.StatusBadRequest},
		{"read with payload", readPayload, []byte("abcd"), api.StatusBadRequest},
		{"trim with payload", ioHdr(api.OpTrim, 0, 4), []byte("abcd"), api.StatusBadRequest},
		{"checksum of a bad pool id", badChecksum, nil, api.StatusBadRequest},
		{"read longer than a frame", api.Header{Op: api.OpRead, Volume: hBigChunks, Length: api.MaxPayload + 1}, nil, api.StatusBadRequest},
		// Its raft entry would not fit in a peer frame: the followers' servers
		// would close the connection on every retry.
		{"write too long for a raft entry", api.Header{Op: api.OpWrite, Volume: hBigChunks, Epoch: hEpoch, Length: api.MaxPayload},
			make([]byte, api.MaxPayload), api.StatusBadRequest},
		{"checksum of a copyset not here", noCS, nil, api.StatusNoSuchCopyset},
	}
	_ = stale
	for _, tc := range cases {
		r, _ := e.do(c, tc.h, tc.payload)
		if r.Status != tc.want {
			t.Errorf("%s: status %v, want %v", tc.name, r.Status, tc.want)
		}
		if r.ID == 0 || r.Op != tc.h.Op {
			t.Errorf("%s: reply header %+v does not echo the request", tc.name, r)
		}
	}
	// A copyset not hosted here.
	e.host.mu.Lock()
	g := api.GroupID(hPool, csOf(hVolume, 0))
	saved := e.host.replicas[g]
	delete(e.host.replicas, g)
	e.host.mu.Unlock()
	if r, _ := e.do(c, ioHdr(api.OpWrite, 0, 4), []byte("abcd")); r.Status != api.StatusNoSuchCopyset {
		t.Errorf("copyset not hosted: %v", r.Status)
	}
	e.host.mu.Lock()
	e.host.replicas[g] = saved
	e.host.mu.Unlock()

	// Raw garbage on fresh connections: the connection is closed, nothing else.
	garbage := [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 64))),
		badHeader(func(b []byte) { b[4] = 9 }),                                                              // bad version
		badHeader(func(b []byte) { binary.BigEndian.PutUint32(b[20:], api.MaxPayload+1) }),                  // huge payload
		append(badHeader(func(b []byte) { binary.BigEndian.PutUint32(b[20:], 1000) }), make([]byte, 10)...), // truncated payload
		badHeader(nil)[:30], // truncated header
		badHeader(func(b []byte) { binary.BigEndian.PutUint16(b[6:], uint16(api.FlagReply)) }), // a reply as request
	}
	for i, g := range garbage {
		nc, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(g)
		if tcp, ok := nc.(*net.TCPConn); ok {
			tcp.CloseWrite()
		}
		nc.SetReadDeadline(time.Now().Add(60 * time.Second))
		rest, err := io.ReadAll(nc)
		nc.Close()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("garbage %d: connection left open", i)
			}
		}
		if len(rest) != 0 {
			t.Errorf("garbage %d: got %d bytes of reply", i, len(rest))
		}
	}
	// Raft and snapshot garbage must not crash anything either.
	var rw captureRW
	e.hd.ServeFrame(&rw, api.Header{Op: api.OpRaft}, []byte{1, 2, 3})

	// The process is up, the good connection still works, no data changed and
	// nothing was proposed.
	if r, _ := e.do(c, api.Header{Op: api.OpPing}, nil); r.Status != api.StatusOK {
		t.Fatalf("ping after bad input: %v", r.Status)
	}
	if !bytes.Equal(e.snapshotData(e.dial()), before) {
		t.Fatal("bad input changed data")
	}
	e.host.mu.Lock()
	defer e.host.mu.Unlock()
	if e.host.proposed != proposedBefore {
		t.Fatalf("bad input proposed %d commands", e.host.proposed-proposedBefore)
	}
}

// An unknown volume makes the cache look again before the answer: a volume
// created after the last refresh is served without waiting for a heartbeat,
// and one the MDS does not list is refused.
func TestHandlerUnknownVolumeRefresh(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	e.mds.mu.Lock()
	e.mds.vols = append(e.mds.vols, &api.Volume{Id: 500, Size: hChunk, PoolId: hPool})
	e.mds.mu.Unlock()
	h := api.Header{Op: api.OpWrite, Volume: 500, Epoch: 1, Length: 3, Copyset: csOf(500, 0)}
	if r, _ := e.do(c, h, []byte("new")); r.Status != api.StatusOK {
		t.Fatalf("write to a new volume: %v", r.Status)
	}
	// Every miss looks again: a second new volume right after the first.
	e.mds.mu.Lock()
	e.mds.vols = append(e.mds.vols, &api.Volume{Id: 501, Size: hChunk, PoolId: hPool})
	e.mds.mu.Unlock()
	h.Volume, h.Copyset = 501, csOf(501, 0)
	if r, _ := e.do(c, h, []byte("new")); r.Status != api.StatusOK {
		t.Fatalf("write to a second new volume: %v", r.Status)
	}
	h.Volume, h.Copyset = 600, csOf(600, 0)
	if r, _ := e.do(c, h, []byte("new")); r.Status != api.StatusNoSuchVolume {
		t.Fatalf("unknown volume: %v", r.Status)
	}
	// The MDS unreachable: BUSY (retried by the client), not a final refusal.
	e.mds.mu.Lock()
	e.mds.err = errors.New("test: MDS down")
	e.mds.mu.Unlock()
	h.Volume, h.Copyset = 601, csOf(601, 0)
	if r, _ := e.do(c, h, []byte("new")); r.Status != api.StatusBusy {
		t.Fatalf("unknown volume, MDS down: %v", r.Status)
	}
}

// Concurrent misses share refreshes: while one refresh runs, every miss that
// arrives joins the next one, which starts after they arrived.
func TestVolumeCacheMissesCoalesce(t *testing.T) {
	e := newHandlerEnv(t)
	vc := e.hd.vols
	gate := make(chan struct{})
	e.mds.mu.Lock()
	e.mds.gate = gate
	lists := e.mds.lists
	e.mds.mu.Unlock()
	const n = 20
	var wg sync.WaitGroup
	found := make([]bool, n)
	first := make(chan struct{})
	wg.Go(func() {
		close(first)
		found[0], _ = vc.refreshMiss(context.Background(), 700)
	})
	<-first
	// Wait until the first miss's refresh is in ListVolumes.
	waitFor(t, func() bool { e.mds.mu.Lock(); defer e.mds.mu.Unlock(); return e.mds.blocked == 1 })
	// The volume is created now: only a refresh started after this sees it.
	e.mds.mu.Lock()
	e.mds.vols = append(e.mds.vols, &api.Volume{Id: 700, Size: hChunk, PoolId: hPool})
	e.mds.mu.Unlock()
	for i := 1; i < n; i++ {
		wg.Go(func() { found[i], _ = vc.refreshMiss(context.Background(), 700) })
	}
	waitFor(t, func() bool {
		vc.missMu.Lock()
		defer vc.missMu.Unlock()
		return vc.next != nil && vc.next.waiters == n-1
	})
	close(gate)
	wg.Wait()
	for i, ok := range found {
		if !ok {
			t.Errorf("miss %d did not find the volume", i)
		}
	}
	e.mds.mu.Lock()
	defer e.mds.mu.Unlock()
	if got := e.mds.lists - lists; got != 2 {
		t.Fatalf("%d volume lists for %d concurrent misses, want 2", got, n)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 60 s")
		}
		time.Sleep(time.Millisecond)
	}
}

func badHeader(mod func([]byte)) []byte {
	h := ioHdr(api.OpPing, 0, 0)
	b := make([]byte, api.HeaderSize)
	h.Encode(b)
	if mod != nil {
		mod(b)
	}
	return b
}

type captureRW struct {
	mu      sync.Mutex
	replies []api.Header
}

func (c *captureRW) Reply(h api.Header, _ []byte, release func()) {
	c.mu.Lock()
	c.replies = append(c.replies, h)
	c.mu.Unlock()
	if release != nil {
		release()
	}
}
func (c *captureRW) Retain()              {}
func (c *captureRW) RemoteAddr() net.Addr { return &net.TCPAddr{} }

// noPeers is the peer transport of a handler without peers: raft frames are
// dropped, snapshot frames refused.
type noPeers struct{}

func (noPeers) ServeFrame(rw transport.ReplyWriter, h api.Header, _ []byte) {
	if h.Op == api.OpSnapshot {
		h.Status = api.StatusBadRequest
		rw.Reply(h, nil, nil)
	}
}

func (noPeers) AllocPayload(api.Header, int) (*[]byte, int) { return nil, 0 }

// TestAllocPayloadStagedWritesExact: a client write larger than
// transport.StagedPayload gets a buffer of its own size, not a pool class
// up to twice it: the transport asks for it once half the payload arrived,
// and a client that then stalls would make the server hold four times what
// it sent (the transport's bound is twice).
func TestAllocPayloadStagedWritesExact(t *testing.T) {
	hd := &handler{}
	for _, n := range []int{inPlaceMin, 256 << 10, transport.StagedPayload, transport.StagedPayload + 1, 1 << 20, 8<<20 + 17} {
		buf, off := hd.AllocPayload(api.Header{Op: api.OpWrite}, n)
		if buf == nil || off != proposalRoom || len(*buf) < off+n {
			t.Fatalf("%d bytes: buffer %v at %d", n, buf != nil, off)
		}
		if n > transport.StagedPayload && cap(*buf) > proposalRoom+n {
			t.Errorf("%d-byte write: a %d-byte buffer, over its %d bytes", n, cap(*buf), proposalRoom+n)
		}
	}
}
