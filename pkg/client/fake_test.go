package client

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
	"google.golang.org/grpc"
)

// A fake cluster: chunkservers built on transport.Server that share one "replicated"
// byte array per volume, with a leader and members per copyset, and a fake MDS.
const (
	tVolume  = 77
	tChunk   = 64 << 10
	tCS      = 8
	tServers = 4
	tSize    = 40 * tChunk
)

// action is what a hook tells a fake chunkserver to do with one request.
type action int

const (
	serve      action = iota // normal handling
	busy                     // answer BUSY
	ignore                   // never answer
	drop                     // close the connection
	delayed                  // answer after the cluster's delay
	noSpace                  // answer NO_SPACE (a replica stopped by a full disk)
	gated                    // answer once the cluster's gate is closed
	fenced                   // answer FENCED (a newer writer reached the copyset)
	outOfRange               // answer OUT_OF_RANGE (a chunkserver that has not heard of a grow yet)
	stall                    // never answer, and stop reading the connection (as a chunkserver whose requests hang does at MaxInFlight)
)

type fakeCluster struct {
	t   testing.TB
	mds *fakeMDS

	mu        sync.Mutex
	data      []byte
	members   map[uint32][]uint64
	leaders   map[uint32]uint64
	noHint    bool       // NOT_LEADER without a hint
	minEpoch  uint64     // requests below get FENCED
	force     api.Status // nonzero: the leader answers every valid request with it
	forceAll  api.Status // nonzero: every member answers every valid request with it
	delay     time.Duration
	gate      chan struct{} // holds the answers of gated requests until closed
	hook      func(server uint64, h api.Header) action
	servers   map[uint64]*fakeServer
	bad       []string // protocol violations seen (pieces crossing chunks, wrong copyset)
	frames    map[api.Op]int
	notLeader int
	fenced    map[uint32][]uint64 // copyset → epochs of the fences its leader applied
	unstall   chan struct{}       // closed at the end of the test: stalled server readers go on
}

type fakeServer struct {
	id   uint64
	addr string
	srv  *transport.Server
	c    *fakeCluster
	mu   sync.Mutex
	conn []net.Conn
	down bool
}

func newFakeCluster(t testing.TB) *fakeCluster {
	c := &fakeCluster{
		t:       t,
		data:    make([]byte, tSize),
		members: make(map[uint32][]uint64),
		leaders: make(map[uint32]uint64),
		servers: make(map[uint64]*fakeServer),
		frames:  make(map[api.Op]int),
		unstall: make(chan struct{}),
	}
	for cs := range uint32(tCS) {
		m := []uint64{1 + uint64(cs)%tServers, 1 + uint64(cs+1)%tServers, 1 + uint64(cs+2)%tServers}
		c.members[cs] = m
		c.leaders[cs] = m[0]
	}
	for id := range uint64(tServers) {
		c.addServer(id + 1)
	}
	// Registered after the servers' Close, before the volume's Close: runs between them.
	t.Cleanup(func() { close(c.unstall) })
	c.mds = &fakeMDS{c: c, leaseMs: 3000, epoch: 1, hints: make(map[uint32]uint64)} // a first writer; takeover tests raise epoch
	return c
}

func (c *fakeCluster) addServer(id uint64) *fakeServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	s := &fakeServer{id: id, addr: ln.Addr().String(), c: c}
	s.srv = transport.NewServer(transport.ServerConfig{Logger: quietLog()}, s)
	go s.srv.Serve(trackingListener{ln, s})
	c.t.Cleanup(func() { s.srv.Close() })
	c.mu.Lock()
	c.servers[id] = s
	c.mu.Unlock()
	return s
}

type trackingListener struct {
	net.Listener
	s *fakeServer
}

func (l trackingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err == nil {
		l.s.mu.Lock()
		l.s.conn = append(l.s.conn, nc)
		if l.s.down {
			nc.Close()
		}
		l.s.mu.Unlock()
	}
	return nc, err
}

// setDown makes the server drop every connection (and refuse new ones) or serve again.
func (s *fakeServer) setDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
	if down {
		for _, nc := range s.conn {
			nc.Close()
		}
		s.conn = nil
	}
}

func (s *fakeServer) dropConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, nc := range s.conn {
		nc.Close()
	}
	s.conn = nil
}

func (s *fakeServer) ServeFrame(rw transport.ReplyWriter, h api.Header, payload []byte) {
	c := s.c
	c.mu.Lock()
	c.frames[h.Op]++
	act := serve
	if c.hook != nil {
		act = c.hook(s.id, h)
	}
	c.mu.Unlock()
	switch act {
	case busy:
		h.Status = api.StatusBusy
		rw.Reply(h, nil, nil)
		return
	case ignore:
		return
	case stall:
		<-c.unstall // ServeFrame runs on the connection's reader
		return
	case noSpace:
		h.Status = api.StatusNoSpace
		rw.Reply(h, nil, nil)
		return
	case fenced:
		h.Status = api.StatusFenced
		rw.Reply(h, nil, nil)
		return
	case outOfRange:
		h.Status = api.StatusOutOfRange
		rw.Reply(h, nil, nil)
		return
	case drop:
		s.dropConns()
		return
	case delayed:
		p := append([]byte(nil), payload...)
		time.AfterFunc(c.delay, func() { s.serve(rw, h, p) })
		return
	case gated:
		p, gate := append([]byte(nil), payload...), c.gate
		go func() { <-gate; s.serve(rw, h, p) }()
		return
	}
	s.serve(rw, h, payload)
}

func (s *fakeServer) serve(rw transport.ReplyWriter, h api.Header, payload []byte) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	reply := func(st api.Status, hint uint64, p []byte) {
		h.Status, h.Hint = st, hint
		rw.Reply(h, p, nil)
	}
	if h.Op == api.OpFence {
		s.fence(h, reply)
		return
	}
	chunk := h.Offset / tChunk
	switch {
	case h.Volume != tVolume:
		reply(api.StatusNoSuchVolume, 0, nil)
		return
	case h.Offset+uint64(h.Length) > tSize || h.Offset%tChunk+uint64(h.Length) > tChunk:
		c.bad = append(c.bad, fmt.Sprintf("out of range %d+%d", h.Offset, h.Length))
		reply(api.StatusOutOfRange, 0, nil)
		return
	case h.Copyset != api.CopysetOf(tVolume, chunk, tCS):
		c.bad = append(c.bad, fmt.Sprintf("copyset %d for chunk %d", h.Copyset, chunk))
		reply(api.StatusBadRequest, 0, nil)
		return
	case h.Op == api.OpWrite && int(h.Length) != len(payload):
		c.bad = append(c.bad, "payload length")
		reply(api.StatusBadRequest, 0, nil)
		return
	}
	member := false
	for _, m := range c.members[h.Copyset] {
		member = member || m == s.id
	}
	if !member {
		reply(api.StatusNoSuchCopyset, 0, nil)
		return
	}
	if c.forceAll != api.StatusOK {
		reply(c.forceAll, 0, nil)
		return
	}
	if l := c.leaders[h.Copyset]; l != s.id {
		c.notLeader++
		if c.noHint {
			l = 0
		}
		reply(api.StatusNotLeader, l, nil)
		return
	}
	if c.force != api.StatusOK {
		reply(c.force, 0, nil)
		return
	}
	if h.Epoch < c.minEpoch {
		reply(api.StatusFenced, 0, nil)
		return
	}
	c.minEpoch = max(c.minEpoch, h.Epoch)
	region := c.data[h.Offset : h.Offset+uint64(h.Length)]
	switch h.Op {
	case api.OpRead:
		reply(api.StatusOK, 0, append([]byte(nil), region...))
	case api.OpWrite:
		copy(region, payload)
		reply(api.StatusOK, 0, nil)
	case api.OpTrim, api.OpWriteZeroes:
		clear(region)
		reply(api.StatusOK, 0, nil)
	case api.OpCompareAndWrite:
		if len(payload) != 2*int(h.Length) || h.Seq == 0 || h.Flags&api.FlagFUA == 0 {
			c.bad = append(c.bad, fmt.Sprintf("compare-and-write %+v with %d bytes", h, len(payload)))
			reply(api.StatusBadRequest, 0, nil)
			return
		}
		for i := range region {
			if region[i] != payload[i] {
				reply(api.StatusMiscompare, uint64(i), nil)
				return
			}
		}
		copy(region, payload[h.Length:])
		reply(api.StatusOK, 0, nil)
	default:
		reply(api.StatusBadRequest, 0, nil)
	}
}

// fence serves OpFence as a chunkserver does: on the copyset's leader only,
// FENCED below the epoch seen, recorded in c.fenced. Called with c.mu held.
func (s *fakeServer) fence(h api.Header, reply func(api.Status, uint64, []byte)) {
	c := s.c
	switch {
	case h.Volume != tVolume:
		reply(api.StatusNoSuchVolume, 0, nil)
		return
	case h.Copyset >= tCS || h.Offset != 0 || h.Length != 0 || h.Epoch == 0:
		c.bad = append(c.bad, fmt.Sprintf("fence %+v", h))
		reply(api.StatusBadRequest, 0, nil)
		return
	}
	if l := c.leaders[h.Copyset]; l != s.id {
		if !slices.Contains(c.members[h.Copyset], s.id) {
			reply(api.StatusNoSuchCopyset, 0, nil)
			return
		}
		c.notLeader++
		reply(api.StatusNotLeader, l, nil)
		return
	}
	if h.Epoch < c.minEpoch {
		reply(api.StatusFenced, 0, nil)
		return
	}
	c.minEpoch = max(c.minEpoch, h.Epoch)
	if c.fenced == nil {
		c.fenced = make(map[uint32][]uint64)
	}
	c.fenced[h.Copyset] = append(c.fenced[h.Copyset], h.Epoch)
	reply(api.StatusOK, 0, nil)
}

func (c *fakeCluster) setHook(f func(server uint64, h api.Header) action) {
	c.mu.Lock()
	c.hook = f
	c.mu.Unlock()
}

func (c *fakeCluster) violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.bad...)
}

func (c *fakeCluster) open(t testing.TB, mod func(*Config)) *Volume {
	t.Helper()
	cfg := Config{Volume: "vol", MDSClient: c.mds, IOTimeout: time.Second, Logger: quietLog()}
	if mod != nil {
		mod(&cfg)
	}
	v, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

// fakeMDS implements the part of api.MDSClient the client uses; the embedded nil
// interface makes any other call panic.
type fakeMDS struct {
	api.MDSClient
	c *fakeCluster

	mu          sync.Mutex
	leaseMs     int64
	epoch       uint64
	hints       map[uint32]uint64 // leader hints to give; absent: the true leader
	renewErr    error
	renewals    int
	getCopysets int
	closed      int
}

func (m *fakeMDS) copysets() ([]*api.Copyset, []*api.ChunkServer) {
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var css []*api.Copyset
	for id := range uint32(tCS) {
		hint, ok := m.hints[id]
		if !ok {
			hint = c.leaders[id]
		}
		css = append(css, &api.Copyset{PoolId: 1, Id: id, Members: append([]uint64(nil), c.members[id]...), LeaderHint: hint})
	}
	var servers []*api.ChunkServer
	for id, s := range c.servers {
		servers = append(servers, &api.ChunkServer{Id: id, Addr: s.addr, Online: true})
	}
	return css, servers
}

func (m *fakeMDS) OpenVolume(_ context.Context, in *api.OpenVolumeRequest, _ ...grpc.CallOption) (*api.OpenVolumeResponse, error) {
	if in.GetName() != "vol" {
		return nil, fmt.Errorf("no volume %q", in.GetName())
	}
	css, servers := m.copysets()
	m.mu.Lock()
	defer m.mu.Unlock()
	return &api.OpenVolumeResponse{
		Volume:       &api.Volume{Id: tVolume, Name: "vol", Size: tSize, PoolId: 1, Epoch: m.epoch},
		Pool:         &api.Pool{Id: 1, Name: "p", Replicas: 3, ChunkSize: tChunk, CopysetCount: tCS},
		SessionId:    9,
		Epoch:        m.epoch,
		LeaseMs:      m.leaseMs,
		Copysets:     css,
		Chunkservers: servers,
	}, nil
}

func (m *fakeMDS) GetCopysets(_ context.Context, in *api.GetCopysetsRequest, _ ...grpc.CallOption) (*api.GetCopysetsResponse, error) {
	css, servers := m.copysets()
	m.mu.Lock()
	m.getCopysets++
	m.mu.Unlock()
	return &api.GetCopysetsResponse{Copysets: css, Chunkservers: servers}, nil
}

func (m *fakeMDS) RenewSession(_ context.Context, in *api.RenewSessionRequest, _ ...grpc.CallOption) (*api.RenewSessionResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.renewals++
	if m.renewErr != nil {
		return nil, m.renewErr
	}
	return &api.RenewSessionResponse{LeaseMs: m.leaseMs}, nil
}

func (m *fakeMDS) CloseSession(context.Context, *api.CloseSessionRequest, ...grpc.CallOption) (*api.CloseSessionResponse, error) {
	m.mu.Lock()
	m.closed++
	m.mu.Unlock()
	return &api.CloseSessionResponse{}, nil
}

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelError}))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func (c *fakeCluster) notLeaders() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notLeader
}

// frameCount is the number of frames of op the servers got.
func (c *fakeCluster) frameCount(op api.Op) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames[op]
}
