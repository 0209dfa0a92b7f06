package mds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/debughttp"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Config configures an MDS. Zero fields take the documented defaults.
type Config struct {
	Listen        string   // gRPC, e.g. 127.0.0.1:6700 (default)
	Advertise     string   // address other processes reach this MDS at; default: the bound Listen address (host name for 0.0.0.0)
	DataDir       string   // embedded etcd data (when EtcdEndpoints is empty); required then
	EtcdEndpoints []string // external etcd
	// Embedded etcd listeners, URLs or host:port
	// (default http://127.0.0.1:2379 and http://127.0.0.1:2380).
	EtcdClientURL, EtcdPeerURL string
	MetricsListen              string // Prometheus /metrics; "" = off
	// TLS is this MDS's identity (role mds): the gRPC API requires a
	// client certificate from the cluster CA and authorizes every RPC by
	// the caller's role (authz.go); the embedded etcd serves TLS with
	// client certificates, and the etcd client presents it. Required
	// unless Insecure.
	TLS *identity.Config
	// Insecure serves plain gRPC and etcd with no authentication or
	// authorization: for tests of other things, never a deployment.
	Insecure bool
	// MaxSessionsPerClient caps the open sessions of one client identity
	// (default 1024); OpenVolume beyond it fails with ResourceExhausted.
	MaxSessionsPerClient int
	HeartbeatTimeout     time.Duration // chunkserver offline after this (default 5 s)
	SessionLease         time.Duration // default 10 s
	// ElectionTTL is the TTL of the etcd session behind leader election:
	// a standby takes over at most about this long after the active MDS
	// died (default 3 s; etcd rounds it up to whole seconds, at least 2).
	ElectionTTL time.Duration
	// RecoveryGrace: a chunkserver offline this long has its copysets
	// re-replicated elsewhere (default 10 min; negative: never).
	RecoveryGrace time.Duration
	// ScheduleInterval: how often the scheduler looks (default 5 s).
	ScheduleInterval time.Duration
	// MaxRecoveryMoves bounds the copyset moves (repairs and balancing) in
	// flight at once, cluster-wide (default 4), so that rebuild traffic does
	// not swamp foreground IO.
	MaxRecoveryMoves int
	// MaxMovesPerChunkserver bounds the moves in flight that involve one
	// chunkserver, as the receiver of the new replica or as the leader that
	// streams it (default 2).
	MaxMovesPerChunkserver int
	// MaxLeaderTransfers bounds the leader transfers in flight (default 2).
	MaxLeaderTransfers int
	// DisableBalance turns copyset and leader balancing off (repairs go on).
	DisableBalance bool
	Logger         *slog.Logger
}

// Defaults.
const (
	DefaultListen           = "127.0.0.1:6700"
	DefaultEtcdClientURL    = "http://127.0.0.1:2379"
	DefaultEtcdPeerURL      = "http://127.0.0.1:2380"
	DefaultHeartbeatTimeout = 5 * time.Second
	DefaultSessionLease     = 10 * time.Second
	DefaultElectionTTL      = 3 * time.Second

	DefaultMaxSessionsPerClient = 1024
	// Limits of the gRPC server.
	maxConcurrentStreams = 256     // per connection
	maxRecvMsgSize       = 4 << 20 // requests are small
	maxSendMsgSize       = 64 << 20
)

// Server is one MDS process: active or standby. See doc.go.
type Server struct {
	cfg       Config
	log       *slog.Logger
	ln        net.Listener
	advertise string
	grpc      *grpc.Server
	reg       *prometheus.Registry
	m         metrics

	cli *clientv3.Client // set by Run before serving

	active atomic.Bool
	mu     sync.Mutex // guards the fields below
	// elKey is the election key while active, "" otherwise.
	elKey string
	// live is the in-memory heartbeat state, rebuilt from heartbeats
	// after every takeover.
	live map[uint64]*liveCS
	// activeSince: when this MDS last became active. A chunkserver not
	// heard from since counts as offline from then on, not from the epoch.
	activeSince time.Time
	// transfers: leader transfers the scheduler armed, by group id; the
	// leader's heartbeat answers carry them until done or timed out.
	transfers map[uint64]pendingTransfer
	// accessNodes is the in-memory heartbeat state of NVMe/TCP access
	// nodes (ana.go), rebuilt from heartbeats after every takeover.
	accessNodes map[uint64]*liveAN

	anaMu sync.Mutex // serializes ANA reassignments (ana.go); taken before mu

	topoMu sync.Mutex // guards topo; never held with mu
	topo   *topology  // last topology read (readTopology)

	etcdClosing atomic.Bool // set before the embedded etcd is closed

	crashed chan struct{} // closed by crash (tests): stop like kill -9
	once    sync.Once

	// volumeIDs and sessionIDs hand out ids from batches reserved in etcd.
	volumeIDs, sessionIDs *idAllocator

	caps capKeys // the session capabilities' signing keys (capkeys.go)
}

type metrics struct {
	active        prometheus.Gauge
	rpcs          *prometheus.CounterVec
	chunkservers  *prometheus.GaugeVec
	moves         prometheus.Counter
	movesInFlight prometheus.Gauge
	transfers     prometheus.Counter
}

// New validates cfg, binds the gRPC listener (so Addr is known) and
// prepares the server. Run starts it.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if cfg.SessionLease <= 0 {
		cfg.SessionLease = DefaultSessionLease
	}
	if cfg.ElectionTTL <= 0 {
		cfg.ElectionTTL = DefaultElectionTTL
	}
	if cfg.RecoveryGrace == 0 {
		cfg.RecoveryGrace = DefaultRecoveryGrace
	}
	if cfg.ScheduleInterval <= 0 {
		cfg.ScheduleInterval = DefaultScheduleInterval
	}
	if cfg.MaxRecoveryMoves <= 0 {
		cfg.MaxRecoveryMoves = DefaultMaxRecoveryMoves
	}
	if cfg.MaxMovesPerChunkserver <= 0 {
		cfg.MaxMovesPerChunkserver = DefaultMaxMovesPerChunkserver
	}
	if cfg.MaxLeaderTransfers <= 0 {
		cfg.MaxLeaderTransfers = DefaultMaxLeaderTransfers
	}
	if cfg.EtcdClientURL == "" {
		cfg.EtcdClientURL = DefaultEtcdClientURL
	}
	if cfg.EtcdPeerURL == "" {
		cfg.EtcdPeerURL = DefaultEtcdPeerURL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxSessionsPerClient <= 0 {
		cfg.MaxSessionsPerClient = DefaultMaxSessionsPerClient
	}
	if cfg.TLS == nil && !cfg.Insecure {
		return nil, fmt.Errorf("%w: give a TLS directory with this MDS's certificate "+
			"(make one: basalt cert init --dir D --cluster NAME; basalt cert issue --dir D --role mds), "+
			"or Insecure for a test", ErrNoTLS)
	}
	if len(cfg.EtcdEndpoints) == 0 && cfg.DataDir == "" {
		return nil, fmt.Errorf("%w: DataDir is required for the embedded etcd (or give EtcdEndpoints)", ErrInvalidArgument)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("mds: listen %s: %w", cfg.Listen, err)
	}
	s := &Server{
		cfg:         cfg,
		ln:          ln,
		advertise:   cfg.Advertise,
		reg:         prometheus.NewRegistry(),
		live:        map[uint64]*liveCS{},
		accessNodes: map[uint64]*liveAN{},
		transfers:   map[uint64]pendingTransfer{},
		crashed:     make(chan struct{}),
	}
	s.volumeIDs, s.sessionIDs = newIDAllocator(s, idVolume), newIDAllocator(s, idSession)
	if s.advertise == "" {
		s.advertise = defaultAdvertise(ln.Addr().(*net.TCPAddr))
	}
	s.log = cfg.Logger.With("mds", s.advertise)
	s.m = metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "basalt_mds_active",
			Help: "1 while this MDS is the active one, 0 while it is a standby."}),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "basalt_mds_rpcs_total",
			Help: "gRPC requests handled, by method and status code."}, []string{"method", "code"}),
		chunkservers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "basalt_mds_chunkservers",
			Help: "Chunkservers seen by the active MDS, by state (online, offline)."}, []string{"state"}),
	}
	s.m.moves = prometheus.NewCounter(prometheus.CounterOpts{Name: "basalt_mds_copyset_moves_total",
		Help: "Copyset member moves started by the scheduler (repairs and balancing)."})
	s.m.movesInFlight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "basalt_mds_copyset_moves_in_flight",
		Help: "Copyset member moves started and not yet reported done by the copyset's leader."})
	s.m.transfers = prometheus.NewCounter(prometheus.CounterOpts{Name: "basalt_mds_leader_transfers_total",
		Help: "Leader transfers requested by the scheduler (leader balancing)."})
	s.reg.MustRegister(s.m.active, s.m.rpcs, s.m.chunkservers, s.m.moves, s.m.movesInFlight, s.m.transfers,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.authorize, s.intercept),
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.MaxRecvMsgSize(maxRecvMsgSize),
		grpc.MaxSendMsgSize(maxSendMsgSize),
		grpc.ConnectionTimeout(10 * time.Second), // the TLS handshake
		// Clients ping at most every 10 s; idle connections are closed
		// after 10 min, and a peer that stops answering pings after 30 s.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 10 * time.Minute, Time: 20 * time.Second, Timeout: 10 * time.Second}),
	}
	if cfg.TLS != nil {
		if id := cfg.TLS.Identity(); id.Role != identity.RoleMDS {
			ln.Close()
			return nil, fmt.Errorf("%w: the MDS needs an mds certificate, not %s", ErrInvalidArgument, id)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS.ServerTLS())))
	}
	s.grpc = grpc.NewServer(opts...)
	api.RegisterMDSServer(s.grpc, &handler{s: s})
	return s, nil
}

// Addr returns the address this MDS advertises (by default the bound gRPC
// listener address).
func (s *Server) Addr() string { return s.advertise }

// Run starts etcd (embedded) or connects to it, serves gRPC (and metrics),
// and campaigns to become the active MDS; it returns when ctx is done,
// after a clean stop (an active MDS resigns, so a standby takes over at
// once).
func (s *Server) Run(ctx context.Context) error {
	defer s.ln.Close()
	endpoints := s.cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		e, err := s.startEtcd()
		if err != nil {
			return err
		}
		defer func() {
			s.etcdClosing.Store(true)
			e.Close()
		}()
		endpoints = []string{e.Clients[0].Addr().String()}
	}
	ecfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if s.cfg.TLS != nil {
		// The embedded etcd presents this MDS's own certificate; an
		// external one, an etcd certificate of the same CA.
		ecfg.TLS = s.cfg.TLS.ClientTLS(identity.RoleEtcd, identity.RoleMDS)
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return fmt.Errorf("mds: etcd client %v: %w", endpoints, err)
	}
	s.cli = cli
	defer cli.Close()

	if s.cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", s.cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("mds: metrics listen %s: %w", s.cfg.MetricsListen, err)
		}
		mux := debughttp.Mux(s.reg) // /metrics only
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(mln)
		defer hs.Close()
	}

	served := make(chan error, 1)
	go func() { served <- s.grpc.Serve(s.ln) }()
	s.log.Info("MDS serving", "etcd", endpoints)

	go s.monitor(ctx)
	go s.schedule(ctx)
	crashed := s.campaign(ctx)
	if crashed {
		s.grpc.Stop()
		return nil
	}
	s.grpc.GracefulStop()
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("mds: grpc: %w", err)
	}
	return nil
}

// crash stops the server the way kill -9 would, as far as the rest of the
// cluster can tell: no resignation, the election lease simply expires.
// For tests.
func (s *Server) crash() { s.once.Do(func() { close(s.crashed) }) }

// startEtcd starts the embedded single-member etcd and waits until it
// serves.
func (s *Server) startEtcd() (*embed.Etcd, error) {
	ec := embed.NewConfig()
	ec.Name = "basalt-mds"
	ec.Dir = filepath.Join(s.cfg.DataDir, "etcd")
	curl, err := parseURL(s.cfg.EtcdClientURL)
	if err != nil {
		return nil, err
	}
	purl, err := parseURL(s.cfg.EtcdPeerURL)
	if err != nil {
		return nil, err
	}
	if s.cfg.TLS != nil {
		// Clients (this MDS, other MDS sharing it) need a certificate of
		// the cluster CA; revoked ones are refused (ca.crl).
		curl.Scheme, purl.Scheme = "https", "https"
		info := transport.TLSInfo{
			CertFile: s.cfg.TLS.CertFile(), KeyFile: s.cfg.TLS.KeyFile(), TrustedCAFile: s.cfg.TLS.CAFile(),
			ClientCertAuth: true,
		}
		if _, err := os.Stat(s.cfg.TLS.CRLFile()); err == nil {
			info.CRLFile = s.cfg.TLS.CRLFile()
		}
		ec.ClientTLSInfo, ec.PeerTLSInfo = info, info
		ec.TlsMinVersion = "TLS1.3"
	}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*curl}, []url.URL{*curl}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*purl}, []url.URL{*purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(s.log, &s.etcdClosing))
	ec.EnableGRPCGateway = false
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = "1h"
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("mds: start embedded etcd in %s: %w", ec.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("mds: embedded etcd: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("mds: embedded etcd did not become ready in 60 s")
	}
	s.log.Info("embedded etcd ready", "dir", ec.Dir, "client_url", curl.String())
	return e, nil
}

// defaultAdvertise is the bound address, with the host name in place of an
// unspecified IP (listening on all interfaces).
func defaultAdvertise(a *net.TCPAddr) string {
	if a.IP.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			return net.JoinHostPort(h, strconv.Itoa(a.Port))
		}
	}
	return a.String()
}

func parseURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: etcd URL %q: %v", ErrInvalidArgument, s, err)
	}
	return u, nil
}

// campaign runs the election loop until ctx is done (returns false) or
// crash is called (returns true). It owns the etcd session.
// dropOwnStaleCandidacy revokes election keys that name this MDS's own address
// but belong to an earlier incarnation (killed before its lease expired). This
// process holds the listener at that address, so no live MDS can own them; left
// alone they would make a restarted single MDS wait out their lease (ElectionTTL)
// before it serves, long enough for clients' sessions to lapse.
func (s *Server) dropOwnStaleCandidacy(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := s.cli.Get(cctx, electionPrefix, clientv3.WithPrefix())
	if err != nil {
		return
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) != s.advertise || kv.Lease == 0 {
			continue
		}
		if _, err := s.cli.Revoke(cctx, clientv3.LeaseID(kv.Lease)); err == nil {
			s.log.Info("revoked the election candidacy of this MDS's previous incarnation", "key", string(kv.Key))
		}
	}
}

func (s *Server) campaign(ctx context.Context) (crashed bool) {
	ttl := max(1, int((s.cfg.ElectionTTL+time.Second-1)/time.Second))
	for {
		if ctx.Err() != nil {
			return false
		}
		select {
		case <-s.crashed:
			return true
		default:
		}
		s.dropOwnStaleCandidacy(ctx)
		sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			s.log.Warn("etcd session failed; retrying", "err", err)
			if s.sleep(ctx, time.Second) {
				return true
			}
			continue
		}
		el := concurrency.NewElection(sess, electionPrefix)
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-sess.Done():
			case <-s.crashed:
			case <-cctx.Done():
			}
			cancel()
		}()
		err = el.Campaign(cctx, s.advertise)
		select {
		case <-s.crashed:
			cancel()
			return true
		default:
		}
		if err != nil || cctx.Err() != nil {
			cancel()
			if ctx.Err() == nil {
				s.log.Warn("election campaign interrupted; retrying", "err", err)
			}
			sess.Close()
			continue
		}
		s.becomeActive(el.Key())
		select {
		case <-ctx.Done():
			s.becomeStandby("shutting down")
			rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
			el.Resign(rctx)
			rcancel()
			cancel()
			sess.Close()
			return false
		case <-sess.Done():
			s.becomeStandby("etcd session lost")
			cancel()
		case <-s.crashed:
			s.becomeStandby("crashed")
			cancel()
			return true
		}
	}
}

// sleep waits d; it reports whether crash was called meanwhile.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-s.crashed:
		return true
	}
	return false
}

func (s *Server) becomeActive(key string) {
	s.mu.Lock()
	s.elKey = key
	s.live = map[uint64]*liveCS{} // rebuilt from heartbeats
	s.transfers = map[uint64]pendingTransfer{}
	s.accessNodes = map[uint64]*liveAN{}
	s.activeSince = time.Now()
	s.mu.Unlock()
	s.active.Store(true)
	s.m.active.Set(1)
	s.log.Info("MDS became active")
}

func (s *Server) becomeStandby(why string) {
	s.active.Store(false)
	s.m.active.Set(0)
	s.mu.Lock()
	s.elKey = ""
	s.mu.Unlock()
	s.log.Info("MDS is no longer active", "reason", why)
}

func (s *Server) leaderKey() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.elKey
}

// activeMDS returns the address of the active MDS as etcd knows it, or "".
func (s *Server) activeMDS(ctx context.Context) string {
	if s.cli == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := s.cli.Get(ctx, electionPrefix, append(clientv3.WithFirstCreate(), clientv3.WithSerializable())...)
	if err != nil || len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// allMDS returns every MDS taking part in the election, oldest first.
func (s *Server) allMDS(ctx context.Context) ([]string, error) {
	resp, err := s.cli.Get(ctx, electionPrefix, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Value))
	}
	return out, nil
}

// intercept gates every RPC on being active and turns errors into gRPC
// statuses.
func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	var resp any
	var err error
	if !s.active.Load() {
		err = s.notActive(ctx)
	} else {
		resp, err = h(ctx, req)
		if errors.Is(err, ErrNotActive) {
			err = s.notActive(ctx)
		}
		err = toStatus(err)
	}
	s.m.rpcs.WithLabelValues(method, status.Code(err).String()).Inc()
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Server) notActive(ctx context.Context) error {
	if a := s.activeMDS(ctx); a != "" && a != s.advertise {
		return status.Errorf(codes.Unavailable, "not the active MDS; active is %s", a)
	}
	return status.Error(codes.Unavailable, "not the active MDS; no MDS is active yet")
}

// handler implements api.MDSServer; its methods are in topology.go,
// pools.go, volumes.go, sessions.go and status.go.
type handler struct {
	api.UnimplementedMDSServer
	s *Server
}
