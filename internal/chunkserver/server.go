package chunkserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/capability"
	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/internal/debughttp"
	"github.com/basalt-storage/basalt/internal/fsdir"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/raftnet"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/scrub"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/internal/wal"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Config configures a chunkserver.
type Config struct {
	DataDir string   // holds id, wal/, data/
	MDS     []string // MDS addresses
	// TLS is this chunkserver's identity (a chunkserver certificate naming
	// its id; docs/security.md). The MDS is dialed with it; nil only for
	// an --insecure MDS (tests).
	TLS       *identity.Config
	Listen    string // data-plane TCP (client IO + raft), e.g. 127.0.0.1:0
	Advertise string // address given to the MDS; default: the bound Listen address
	// DataMode is the least security a data-plane connection (a client's or
	// a peer's) must use when TLS is set: transport.ModeAuthenticated (the
	// default, also for ModeNone) or transport.ModeEncrypted. Without TLS
	// the data plane authenticates nobody.
	DataMode transport.Mode
	// TCPOnly: no same-host socket (transport.ListenLocal) beside Listen, so
	// processes on this host reach the chunkserver over TCP too.
	TCPOnly           bool
	Zone, Server      string        // failure domains; Server defaults to the host name
	MetricsListen     string        // Prometheus /metrics; "" = off
	HeartbeatInterval time.Duration // default 1 s
	Logger            *slog.Logger

	// Tuning, mostly for tests. Zero values take the defaults.
	TickInterval    time.Duration // raft tick (default 100 ms)
	SnapshotEntries uint64        // raft entries between automatic snapshots (default 10000)
	CatchUpEntries  uint64        // entries kept below a snapshot for slow followers (default 1000)
	WALSegmentSize  int64         // default wal.DefaultSegmentSize
	MaxWALSegments  int           // force snapshots of pinning groups above this (default 8)
	PreallocChunks  int           // datastore chunk-file pool depth (default datastore.DefaultPreallocChunks; <0 = off)
	RaftWorkers     int           // default 4
	// OrphanTimeout: a copyset the MDS stopped listing for this chunkserver,
	// whose replica knows no leader, is deleted after this long (default 30 s).
	OrphanTimeout time.Duration
	// Background scrub of the copysets this chunkserver leads (internal/scrub):
	// ScrubRate bytes/s of chunk data checksummed over all replicas (0:
	// scrub.DefaultScrubRate; < 0: off), ScrubInterval the pause after each
	// copyset, ScrubPassInterval the least time between passes (0: defaults).
	ScrubRate         int64
	ScrubInterval     time.Duration
	ScrubPassInterval time.Duration
	// SnapshotRate bounds this chunkserver's InstallSnapshot traffic, bytes
	// sent plus received per second, so that rebuilding and rebalancing
	// copysets leave disk and network to foreground IO (0:
	// raftnet.DefaultSnapshotRate; < 0: no limit).
	SnapshotRate int64
	// DrainTimeout: a clean stop (Run's ctx done) first hands the leadership
	// of every copyset this chunkserver leads to a caught-up peer and waits up
	// to this long until it leads none, so a planned restart costs transfers,
	// not elections (0: DefaultDrainTimeout; < 0: no hand-over).
	DrainTimeout time.Duration
	// WALStallTimeout: when the WAL has waited this long for a write or an
	// fdatasync (a hung disk), every leadership held here is handed to a
	// peer and the disk is reported failing until the WAL completes writes
	// again (stall.go; 0: DefaultWALStallTimeout; < 0: off).
	WALStallTimeout time.Duration
	// Knobs are fault-injection points for tests, handed to the WAL and the
	// datastore (slow or failing fsync, full disk).
	Knobs Knobs
}

// DefaultDrainTimeout is Config.DrainTimeout's default.
const DefaultDrainTimeout = 5 * time.Second

// Knobs are the fault-injection points of a chunkserver (STYLE 11).
type Knobs struct {
	WAL       wal.Knobs
	Datastore datastore.Knobs
	// AfterDeleteVolume, if set, runs on the raft worker right after a
	// replica applied a delete-volume entry (before anything else: the next
	// entry, the next snapshot), e.g. to crash the process there.
	AfterDeleteVolume func(group, volume uint64)
	// Transport, if set, wraps the raft peer transport the host sends
	// through (messages before send, snapshot streams mid-way).
	Transport func(raftstore.Transport) raftstore.Transport
	// AfterMoveStep, if set, runs on the raft worker when a membership
	// change this leader proposed for a move has applied here.
	AfterMoveStep func(group uint64, step raftstore.MoveStep)
}

// Errors of New and Run.
var (
	// ErrConfig: the Config is unusable (no data directory, no MDS).
	ErrConfig = errors.New("chunkserver: invalid config")
	// ErrIdentity: the MDS gave this data directory another id than the one it
	// holds, or the id file is corrupt.
	ErrIdentity = errors.New("chunkserver: data directory identity mismatch")
	// ErrAlreadyRan: Run was called twice.
	ErrAlreadyRan = errors.New("chunkserver: Run called twice")
)

// transferBackoff is the least time between two leader transfers of one
// copyset started on the MDS's request.
const transferBackoff = 5 * time.Second

// idFileName is the file in DataDir that holds the chunkserver id (decimal, "\n").
const idFileName = "id"

// ChunkServer is one chunkserver process: one data directory (one disk).
//
// Goroutines (see doc.go): Run's goroutine runs the heartbeat loop and owns
// group creation; the transport server's connection goroutines run the handler;
// raftstore's workers drive the groups; the peer transport has a sender per peer.
type ChunkServer struct {
	cfg     Config
	log     *slog.Logger
	lock    *os.File // DataDir/LOCK, held for the process's life
	ln      net.Listener
	lnLocal net.Listener // same-host socket of addr; nil with TCPOnly or when taken
	addr    string
	wal     *wal.WAL
	store   *datastore.Store
	metrics *metrics
	ran     atomic.Bool
	id      atomic.Uint64

	// Set up by Run before the listener is served.
	mds    *mdsclient.Client
	vols   *volumeCache
	host   *raftstore.Host
	peers  *raftnet.Transport
	peerIn *raftnet.Receiver
	srv    *transport.Server
	hd     *handler
	// capKeys are the MDS's capability keys, from heartbeat answers.
	capKeys capability.Keys
	// local is hd once the data plane serves, nil before and from shutdown on:
	// what Go (the local fast path, local.go) hands requests to.
	local atomic.Pointer[handler]

	mu          sync.RWMutex // guards replicas, diskErr, confPending
	replicas    map[uint64]*replica
	diskErr     error           // first disk error that stopped a replica
	confPending map[uint64]bool // copysets with a membership change in flight
	// walStalled: the WAL has been stalled for WALStallTimeout (stall.go).
	walStalled atomic.Bool

	// unlisted: when each hosted copyset was first missing from a heartbeat
	// response. Owned by Run's goroutine.
	unlisted map[uint64]time.Time
	// transferAt: when this chunkserver last started a leader transfer the
	// MDS asked for, per copyset. Owned by Run's goroutine.
	transferAt map[uint64]time.Time
	// want: the members the MDS lists for each copyset it moved (epoch != 0),
	// from the last heartbeat answer; reconciled every reconcileInterval
	// besides every heartbeat. Owned by Run's goroutine.
	want map[uint64][]uint64

	stats ioStats
	// ready is the host once Run started it (for Copysets and HostStats).
	ready atomic.Pointer[raftstore.Host]
	// scrubber is the background scrub once Run started it (nil when off).
	scrubber atomic.Pointer[scrub.Scrubber]
}

// Copysets returns the raft status of every hosted copyset (nil before Run
// started the raft host).
func (c *ChunkServer) Copysets() []raftstore.GroupStatus {
	if h := c.ready.Load(); h != nil {
		return h.Groups()
	}
	return nil
}

// HostStats returns the raft host's counters (zero before Run started it).
func (c *ChunkServer) HostStats() raftstore.Stats {
	if h := c.ready.Load(); h != nil {
		return h.Stats()
	}
	return raftstore.Stats{}
}

// ScrubStats returns the background scrub's counts (zero when it is off or
// before Run started it).
func (c *ChunkServer) ScrubStats() scrub.Stats {
	if sc := c.scrubber.Load(); sc != nil {
		return sc.Stats()
	}
	return scrub.Stats{}
}

// scrubTargets is what the background scrub compares now: the copysets this
// chunkserver leads whose followers are caught up (scrub.LeaderTargets).
func (c *ChunkServer) scrubTargets() []scrub.Target {
	self := c.ID()
	addrOf := func(id uint64) string {
		if id == self {
			return c.addr
		}
		return c.peers.Addr(id)
	}
	chunkSize := func(pool uint32) uint64 {
		cs, _ := c.vols.poolChunkSize(pool)
		return cs
	}
	return scrub.LeaderTargets(c.host.Groups(), addrOf, chunkSize)
}

// ioStats are the cumulative IO counters sent in heartbeats.
type ioStats struct {
	readOps, writeOps, readBytes, writeBytes atomic.Uint64
}

// New opens the data directory (id, WAL, chunk files) and binds the listener.
// Nothing is served until Run.
func New(cfg Config) (*ChunkServer, error) {
	if cfg.DataDir == "" || len(cfg.MDS) == 0 {
		return nil, fmt.Errorf("%w: DataDir and MDS are required", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = time.Second
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Server == "" {
		cfg.Server, _ = os.Hostname()
	}
	if cfg.OrphanTimeout <= 0 {
		cfg.OrphanTimeout = 30 * time.Second
	}
	if cfg.MaxWALSegments <= 0 {
		cfg.MaxWALSegments = 8
	}
	switch {
	case cfg.PreallocChunks == 0:
		cfg.PreallocChunks = datastore.DefaultPreallocChunks
	case cfg.PreallocChunks < 0:
		cfg.PreallocChunks = 0
	}
	if err := fsdir.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, err
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c := &ChunkServer{cfg: cfg, log: cfg.Logger.With("component", "chunkserver"),
		metrics: newMetrics(), replicas: make(map[uint64]*replica),
		confPending: make(map[uint64]bool), unlisted: make(map[uint64]time.Time), lock: lock,
		transferAt: make(map[uint64]time.Time)}
	ok := false
	defer func() {
		if !ok {
			lock.Close()
		}
	}()
	id, err := readID(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c.id.Store(id)
	if id != 0 {
		c.log = c.log.With("chunkserver", id)
	}
	walDir := filepath.Join(cfg.DataDir, "wal")
	c.wal, err = wal.Open(wal.Config{Dir: walDir, SegmentSize: cfg.WALSegmentSize,
		Logger: cfg.Logger, Knobs: cfg.Knobs.WAL, OnCommit: c.metrics.walCommit})
	if errors.Is(err, wal.ErrCorrupt) || errors.Is(err, wal.ErrVersion) {
		// Acknowledged writes may be gone: this replica must not vote or
		// serve. Its copysets still have their other replicas.
		return nil, fmt.Errorf("refusing to start: the WAL at %s cannot be trusted (%w); "+
			"the MDS will re-replicate its copysets; move the data directory %s aside to rejoin empty",
			walDir, err, cfg.DataDir)
	}
	if err != nil {
		return nil, err
	}
	c.store, err = datastore.Open(datastore.Config{Dir: filepath.Join(cfg.DataDir, "data"),
		PreallocChunks: cfg.PreallocChunks, Logger: cfg.Logger, Knobs: cfg.Knobs.Datastore})
	if err != nil {
		c.wal.Close()
		return nil, err
	}
	c.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		c.store.Close()
		c.wal.Close()
		return nil, err
	}
	c.addr = cfg.Advertise
	if c.addr == "" {
		c.addr = c.ln.Addr().String()
	}
	if !cfg.TCPOnly {
		if c.lnLocal, err = transport.ListenLocal(c.addr); err != nil {
			c.log.Warn("same-host socket unavailable; clients on this host use TCP",
				"socket", transport.LocalName(c.addr), "err", err)
			c.lnLocal = nil
		}
	}
	ok = true
	return c, nil
}

// Addr returns the data-plane address given to the MDS.
func (c *ChunkServer) Addr() string { return c.addr }

// ID returns the chunkserver id (0 until the first registration of a new data
// directory succeeded).
func (c *ChunkServer) ID() uint64 { return c.id.Load() }

// Registry returns the Prometheus registry of this chunkserver's metrics.
func (c *ChunkServer) Registry() *prometheus.Registry { return c.metrics.reg }

// Run registers with the MDS, serves IO and raft, and heartbeats until ctx is
// done; then it stops cleanly (listener, raft host, WAL, chunk files).
func (c *ChunkServer) Run(ctx context.Context) (err error) {
	if !c.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRan
	}
	defer c.shutdown()
	var mdsTLS *tls.Config
	if c.cfg.TLS != nil {
		mdsTLS = c.cfg.TLS.ClientTLS(identity.RoleMDS)
	}
	c.mds, err = mdsclient.Dial(c.cfg.MDS, mdsTLS)
	if err != nil {
		return err
	}
	deleteKick := make(chan struct{}, 1)
	c.vols = newVolumeCache(c.mds, c.log, func([]uint64) {
		select {
		case deleteKick <- struct{}{}:
		default:
		}
	})
	if err := c.register(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the MDS ever answered
		}
		return err
	}
	id := c.ID()
	c.log = c.cfg.Logger.With("component", "chunkserver", "chunkserver", id)
	dataSec := c.dataSecurity()
	c.peers = raftnet.New(raftnet.Config{Self: id, Logger: c.log, SnapshotRate: c.cfg.SnapshotRate,
		Security: dataSec, AlignSkip: proposalRoom})
	var peers raftstore.Transport = c.peers
	if c.cfg.Knobs.Transport != nil {
		peers = c.cfg.Knobs.Transport(peers)
	}
	c.host, err = raftstore.New(raftstore.Config{
		NodeID:          id,
		Log:             c.wal,
		Transport:       peers,
		Workers:         c.cfg.RaftWorkers,
		TickInterval:    c.cfg.TickInterval,
		SnapshotEntries: c.cfg.SnapshotEntries,
		CatchUpEntries:  c.cfg.CatchUpEntries,
		Logger:          c.cfg.Logger.With("chunkserver", id),
	})
	if err != nil {
		return err
	}
	c.host.Start()
	c.ready.Store(c.host)
	c.metrics.reg.MustRegister(newHostCollector(c))
	c.peerIn = c.peers.Receiver(c.host)
	c.hd = &handler{
		log:     c.log,
		ctx:     ctx,
		vols:    c.vols,
		host:    c.host,
		replica: c.replica,
		peerIn:  c.peerIn,
		metrics: c.metrics,
		stats:   &c.stats,
		caps:    &c.capKeys,
	}
	if err := c.vols.refresh(ctx); err != nil {
		c.log.Warn("volume list unavailable; retrying at the next heartbeat", "err", err)
	}
	if err := c.recoverGroups(); err != nil {
		return err
	}
	dataSec.Allow = dataRoles
	c.srv = transport.NewServer(transport.ServerConfig{Logger: c.log, Security: dataSec}, c.hd)
	c.local.Store(c.hd)
	srvDone := make(chan error, 1)
	go func() { srvDone <- c.srv.Serve(c.ln) }()
	if c.lnLocal != nil {
		go func() { _ = c.srv.Serve(c.lnLocal) }()
	}
	var metricsSrv *http.Server
	if c.cfg.MetricsListen != "" {
		metricsSrv, err = c.serveMetrics()
		if err != nil {
			return err
		}
	}
	if c.cfg.ScrubRate >= 0 {
		sc := scrub.NewScrubber(scrub.ScrubberConfig{Targets: c.scrubTargets, BytesPerSec: c.cfg.ScrubRate,
			Interval: c.cfg.ScrubInterval, PassInterval: c.cfg.ScrubPassInterval,
			Check:  scrub.Config{Security: c.peerSecurity()},
			Logger: c.cfg.Logger.With("chunkserver", c.ID())})
		c.metrics.reg.MustRegister(sc.Collector("basalt_chunkserver_"))
		c.scrubber.Store(sc)
		scrubCtx, stopScrub := context.WithCancel(ctx)
		scrubDone := make(chan struct{})
		go func() { defer close(scrubDone); sc.Run(scrubCtx) }()
		defer func() { stopScrub(); <-scrubDone }() // before shutdown closes the listener
	}
	delCtx, stopDeletes := context.WithCancel(ctx)
	delDone := make(chan struct{})
	go func() { defer close(delDone); c.deleteLoop(delCtx, deleteKick) }()
	defer func() { stopDeletes(); <-delDone }() // before shutdown stops the raft host
	stallCtx, stopStall := context.WithCancel(ctx)
	stallDone := make(chan struct{})
	go func() { defer close(stallDone); c.watchStall(stallCtx) }()
	c.log.Info("chunkserver serving", "addr", c.addr, "copysets", len(c.replicaIDs()))
	err = c.heartbeatLoop(ctx, srvDone)
	stopStall()
	<-stallDone // it sets the host's draining too
	if err == nil && ctx.Err() != nil {
		c.drainLeaders()
	}
	if metricsSrv != nil {
		_ = metricsSrv.Close()
	}
	return err
}

// dataRoles may connect to the data plane: peers (raft, snapshots),
// clients and front ends (IO), operators (checksums, tools). What each may
// do is the handler's (authorize).
var dataRoles = []identity.Role{identity.RoleChunkserver, identity.RoleClient, identity.RoleAccess, identity.RoleAdmin}

// dataSecurity is the data plane's transport.Security (see Config.DataMode).
func (c *ChunkServer) dataSecurity() transport.Security {
	if c.cfg.TLS == nil {
		return transport.Security{}
	}
	mode := c.cfg.DataMode
	if mode == transport.ModeNone {
		mode = transport.ModeAuthenticated
	}
	return transport.Security{Mode: mode, TLS: c.cfg.TLS}
}

// peerSecurity is how this chunkserver dials its peers' data planes (raft,
// snapshots, scrub checksums): as itself, accepting only chunkservers.
func (c *ChunkServer) peerSecurity() transport.Security {
	sec := c.dataSecurity()
	if sec.Mode != transport.ModeNone {
		sec.Allow = []identity.Role{identity.RoleChunkserver}
	}
	return sec
}

// shutdown stops everything Run started, in dependency order.
func (c *ChunkServer) shutdown() {
	c.local.Store(nil)
	if c.srv != nil {
		_ = c.srv.Close()
	} else {
		_ = c.ln.Close()
		if c.lnLocal != nil {
			_ = c.lnLocal.Close()
		}
	}
	if c.hd != nil {
		c.hd.missWG.Wait()
	}
	if c.peerIn != nil {
		c.peerIn.Close()
	}
	if c.host != nil {
		c.host.Stop()
	}
	if c.peers != nil {
		c.peers.Close()
	}
	if err := c.wal.Close(); err != nil {
		c.log.Warn("closing the WAL", "err", err)
	}
	if err := c.store.Close(); err != nil {
		c.log.Warn("closing the datastore", "err", err)
	}
	_ = c.lock.Close()
	if c.mds != nil {
		_ = c.mds.Close()
	}
	c.log.Info("chunkserver stopped")
}

// register obtains (or confirms) the id, retrying until the MDS answers.
func (c *ChunkServer) register(ctx context.Context) error {
	capacity, _, _ := c.store.Usage()
	req := &api.RegisterChunkServerRequest{Zone: c.cfg.Zone, Server: c.cfg.Server, Addr: c.addr,
		DataDir: c.cfg.DataDir, CapacityBytes: capacity, Id: c.ID()}
	backoff := 100 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.mds.RegisterChunkServer(rctx, req)
		cancel()
		if err == nil {
			got := resp.GetId()
			if got == 0 || (req.Id != 0 && got != req.Id) {
				return fmt.Errorf("%w: holds id %d, MDS answered %d", ErrIdentity, req.Id, got)
			}
			if req.Id == 0 {
				if err := writeID(c.cfg.DataDir, got); err != nil {
					return err
				}
				c.id.Store(got)
			}
			c.log.Info("registered with the MDS", "id", got, "addr", c.addr)
			return nil
		}
		switch status.Code(err) {
		case codes.NotFound:
			return fmt.Errorf("%w: the MDS does not know id %d: %w", ErrIdentity, req.Id, err)
		case codes.InvalidArgument, codes.AlreadyExists:
			return err
		}
		c.log.Warn("MDS unreachable; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// recoverGroups restarts every group found in the WAL.
func (c *ChunkServer) recoverGroups() error {
	for _, g := range c.wal.Groups() {
		pool, _ := api.SplitGroupID(g)
		chunkSize, ok := c.vols.poolChunkSize(pool)
		if !ok {
			// The heartbeat restarts it once the pool is known.
			c.log.Warn("group in the WAL of an unknown pool; not restarted yet", "copyset", g)
			continue
		}
		if err := c.startGroup(g, int64(chunkSize), nil, true); err != nil {
			return err
		}
	}
	return nil
}

// startGroup opens the copyset's chunk files and starts its raft group.
func (c *ChunkServer) startGroup(g uint64, chunkSize int64, peers []uint64, join bool) error {
	cs, err := c.store.Copyset(g, chunkSize)
	if err != nil {
		return fmt.Errorf("copyset %#x: %w", g, err)
	}
	sm := newStateMachine(g, chunkSize, cs, c.replicaFailed)
	sm.log = c.log
	sm.afterDelete = c.cfg.Knobs.AfterDeleteVolume
	pool, _ := api.SplitGroupID(g)
	sm.copysets = func() (uint32, bool) { return c.vols.poolCopysets(pool) }
	if err := c.host.CreateGroup(g, peers, sm, join); err != nil {
		return fmt.Errorf("copyset %#x: %w", g, err)
	}
	c.mu.Lock()
	c.replicas[g] = &replica{group: g, chunkSize: chunkSize, sm: sm, store: cs}
	c.mu.Unlock()
	_, id := api.SplitGroupID(g)
	c.log.Debug("copyset started", "copyset", g, "pool", pool, "id", id, "join", join, "peers", peers)
	return nil
}

func (c *ChunkServer) replica(g uint64) *replica {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.replicas[g]
}

func (c *ChunkServer) replicaIDs() []uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]uint64, 0, len(c.replicas))
	for g := range c.replicas {
		out = append(out, g)
	}
	return out
}

// replicaFailed records the disk error that stopped a replica (heartbeat state).
func (c *ChunkServer) replicaFailed(g uint64, err error) {
	c.log.Error("copyset replica stopped by a disk error", "copyset", g, "err", err)
	c.mu.Lock()
	if c.diskErr == nil {
		c.diskErr = err
	}
	c.mu.Unlock()
	// raftstore stops the group itself: Apply, Persist and InstallSnapshot
	// return this error to it.
}

func (c *ChunkServer) serveMetrics() (*http.Server, error) {
	ln, err := net.Listen("tcp", c.cfg.MetricsListen)
	if err != nil {
		return nil, err
	}
	s := &http.Server{Handler: debughttp.Mux(c.metrics.reg), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.Serve(ln) }()
	return s, nil
}

// readID returns the id kept in dir, or 0 if there is none yet.
func readID(dir string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, idFileName))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("%w: id file %q", ErrIdentity, b)
	}
	return id, nil
}

// writeID stores id atomically: temp file, fsync, rename, fsync the directory.
func writeID(dir string, id uint64) error {
	tmp := filepath.Join(dir, idFileName+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = io.WriteString(f, strconv.FormatUint(id, 10)+"\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, idFileName))
	}
	if err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
