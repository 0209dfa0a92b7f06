package mds

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// running is an MDS started by a test.
type running struct {
	s      *Server
	cancel context.CancelFunc
	done   chan error
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("Run did not return 20 s after cancel")
	}
}

// crash kills the MDS as kill -9 would (no resignation) and waits for Run.
func (r *running) crash(t *testing.T) {
	t.Helper()
	r.s.crash()
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after crash")
	}
	r.cancel()
}

// startMDS starts an MDS; with no EtcdEndpoints it embeds etcd in a temp dir
// on free ports.
func startMDS(t *testing.T, cfg Config) *running {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an MDS with etcd; skipped with -short")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if len(cfg.EtcdEndpoints) == 0 && cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
		cfg.EtcdClientURL = "http://" + testutil.FreeAddr(t)
		cfg.EtcdPeerURL = "http://" + testutil.FreeAddr(t)
	}
	if cfg.ElectionTTL == 0 {
		cfg.ElectionTTL = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.TLS == nil {
		// Tests of the MDS's logic talk to it without certificates;
		// authz_test.go runs it with TLS and checks every refusal.
		cfg.Insecure = true
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{s: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	return r
}

// waitActive waits until r is the active MDS.
func waitActive(t *testing.T, r *running, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !r.s.active.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("MDS %s not active after %v", r.s.Addr(), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startEtcd starts a bare single-member etcd for MDS processes that use it
// as an external cluster, and returns its client URL.
func startEtcd(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd; skipped with -short")
	}
	ec := embed.NewConfig()
	ec.Name = "test"
	ec.Dir = filepath.Join(t.TempDir(), "etcd")
	cu, _ := url.Parse("http://" + testutil.FreeAddr(t))
	pu, _ := url.Parse("http://" + testutil.FreeAddr(t))
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(ec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	return cu.String()
}

func dial(t *testing.T, addrs ...string) *mdsclient.Client {
	t.Helper()
	c, err := mdsclient.Dial(addrs, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ctxT is a context for a whole test: generous, since tests that wait out
// heartbeat timeouts on a loaded machine take a while.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails unless err carries gRPC code want.
func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: got %v (%v), want %v", what, got, err, want)
	}
}

// startWithPool starts an MDS with cfg, registers three chunkservers in three
// zones and creates pool "p" with the given copysets: the setup of the session
// and volume tests. The MDS is stopped at cleanup.
func startWithPool(t *testing.T, cfg Config, copysets uint32) *mdsclient.Client {
	t.Helper()
	r := startMDS(t, cfg)
	t.Cleanup(func() { r.stop(t) })
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	register(t, c, "z1", "h1", "a:1")
	register(t, c, "z2", "h2", "a:2")
	register(t, c, "z3", "h3", "a:3")
	if _, err := c.CreatePool(ctxT(t), &api.CreatePoolRequest{Name: "p", CopysetCount: copysets}); err != nil {
		t.Fatal(err)
	}
	return c
}
