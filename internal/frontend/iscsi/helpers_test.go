package iscsi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
)

// memBackend is an in-memory frontend.Backend (as package nbd's tests use),
// thin like a chunk file: a write allocates the api.MapGranule granules it
// touches, a trim or write-zeroes deallocates those it covers whole
// (frontend.Mapper).
type memBackend struct {
	mu       sync.Mutex
	data     []byte
	alloc    []bool // per api.MapGranule
	readOnly bool
}

func newMem(size int) *memBackend {
	return &memBackend{data: make([]byte, size), alloc: make([]bool, (size+api.MapGranule-1)/api.MapGranule)}
}

func (m *memBackend) Mapped(bits []byte, off, length int64, done func(error)) {
	if off%api.MapAlign != 0 || length%api.MapAlign != 0 || off+length > int64(len(m.data)) || int64(len(bits)) != api.MappedBytes(length) {
		done(fmt.Errorf("memBackend: mapped [%d, +%d) with %d bytes: %w", off, length, len(bits), frontend.ErrInvalid))
		return
	}
	m.mu.Lock()
	clear(bits)
	for i := range length / api.MapGranule {
		if m.alloc[off/api.MapGranule+i] {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	m.mu.Unlock()
	done(nil)
}

func (m *memBackend) Info() frontend.Info {
	return frontend.Info{
		Size: int64(len(m.data)), ReadOnly: m.readOnly,
		CanFlush: true, CanFUA: true, CanTrim: !m.readOnly, CanWriteZeroes: !m.readOnly,
		BlockSizes: frontend.BlockSizes{Minimum: 1, Preferred: 4096},
	}
}

func (m *memBackend) Check(context.Context) error { return nil }
func (m *memBackend) Close() error                { return nil }

func (m *memBackend) Submit(op api.Op, buf []byte, off, length int64, done func(error)) {
	if off < 0 || length < 0 || off+length > int64(len(m.data)) {
		done(fmt.Errorf("memBackend: IO [%d, +%d) beyond the end: %w", off, length, frontend.ErrOutOfRange))
		return
	}
	m.mu.Lock()
	switch op {
	case api.OpRead:
		copy(buf, m.data[off:off+length])
	case api.OpWrite:
		copy(m.data[off:], buf)
		for g := off / api.MapGranule; g < (off+length+api.MapGranule-1)/api.MapGranule; g++ {
			m.alloc[g] = true
		}
	case api.OpTrim, api.OpWriteZeroes:
		clear(m.data[off : off+length])
		for g := (off + api.MapGranule - 1) / api.MapGranule; g < (off+length)/api.MapGranule; g++ {
			m.alloc[g] = false
		}
	}
	m.mu.Unlock()
	done(nil)
}

// memExports is a frontend.Opener over fixed memBackends.
type memExports map[string]frontend.Backend

func (e memExports) Open(_ context.Context, name string) (frontend.Backend, error) {
	if b, ok := e[name]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("%w: %q", frontend.ErrNoSuchExport, name)
}

func (e memExports) Stat(ctx context.Context, name string) (frontend.Info, error) {
	b, err := e.Open(ctx, name)
	if err != nil {
		return frontend.Info{}, err
	}
	return b.Info(), nil
}

func (e memExports) List(context.Context) ([]string, error) {
	var names []string
	for n := range e {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

func (e memExports) Classify(err error) error { return err }

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

const testCluster = "test"

// startServer serves cfg (Exports over vols, Cluster "test" unless set) on
// 127.0.0.1:0 and returns the portal address.
func startServer(t testing.TB, vols memExports, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	if cfg.Cluster == "" {
		cfg.Cluster = testCluster
	}
	cfg.Exports = frontend.NewExports(frontend.ExportsConfig{Opener: vols, Logger: cfg.Logger})
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
