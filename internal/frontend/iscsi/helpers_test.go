package iscsi

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

const testCluster = "test"

// startServer serves cfg (Exports over vols, Cluster "test" unless set) on
// 127.0.0.1:0 and returns the portal address.
func startServer(t testing.TB, vols frontendtest.Disks, cfg Config) (*Server, string) {
	t.Helper()
	return startServerSized(t, vols, 0, cfg)
}

// startServerSized is startServer over exports that re-read watched sizes
// every sizeCheck (0: the default).
func startServerSized(t testing.TB, vols frontendtest.Disks, sizeCheck time.Duration, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.Cluster == "" {
		cfg.Cluster = testCluster
	}
	cfg.Exports = frontend.NewExports(frontend.ExportsConfig{Opener: vols, Logger: cfg.Logger, SizeCheck: sizeCheck})
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() {
		s.Close()
		cfg.Exports.Close()
	})
	return s, ln.Addr().String()
}
