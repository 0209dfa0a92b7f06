package volumes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// Config says how to reach the cluster.
type Config struct {
	MDS        []string
	ReadOnly   bool
	ClientName string
	Logger     *slog.Logger
	// Lister lists volume names for NBD_OPT_LIST; usually the MDS client.
	Lister api.MDSClient
	// Metrics, if set, is given to every volume's client (client.NewMetrics).
	Metrics *client.Metrics
	// Local, if set, is the in-process short cut to a chunkserver hosting
	// this front end (client.Config.Local, the local fast path).
	Local client.Local
}

// Exports opens volumes by name, one shared client per volume.
type Exports struct {
	cfg Config

	mu     sync.Mutex
	opened map[string]*backend // guarded by mu
}

// New returns Exports over the cluster named by cfg.
func New(cfg Config) *Exports {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Exports{cfg: cfg, opened: map[string]*backend{}}
}

// Open returns the shared backend of the named volume, opening it on first use.
func (e *Exports) Open(name string) (frontend.Backend, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if b, ok := e.opened[name]; ok {
		return b, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := client.Open(ctx, client.Config{
		MDS:        e.cfg.MDS,
		Volume:     name,
		ReadOnly:   e.cfg.ReadOnly,
		ClientName: e.cfg.ClientName,
		Logger:     e.cfg.Logger,
		Metrics:    e.cfg.Metrics,
		Local:      e.cfg.Local,
	})
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: %q", frontend.ErrNoSuchExport, name)
		}
		return nil, fmt.Errorf("open volume %q: %w", name, err)
	}
	e.cfg.Logger.Info("volume opened for export", "volume", name, "size", v.Size(), "read_only", e.cfg.ReadOnly)
	b := &backend{v: v, readOnly: e.cfg.ReadOnly}
	e.opened[name] = b
	return b, nil
}

// List returns the names of all volumes.
func (e *Exports) List() []string {
	if e.cfg.Lister == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.cfg.Lister.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil {
		e.cfg.Logger.Warn("listing volumes for an NBD client failed", "err", err)
		return nil
	}
	names := make([]string, 0, len(resp.Volumes))
	for _, v := range resp.Volumes {
		names = append(names, v.Name)
	}
	sort.Strings(names)
	return names
}

// Close closes every opened volume.
func (e *Exports) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for name, b := range e.opened {
		errs = append(errs, b.v.Close())
		delete(e.opened, name)
	}
	return errors.Join(errs...)
}

type backend struct {
	v        *client.Volume
	readOnly bool
}

func (b *backend) Size() int64    { return b.v.Size() }
func (b *backend) ReadOnly() bool { return b.readOnly }

var ops = [...]client.Op{
	frontend.OpRead:        client.OpRead,
	frontend.OpWrite:       client.OpWrite,
	frontend.OpFlush:       client.OpFlush,
	frontend.OpTrim:        client.OpTrim,
	frontend.OpWriteZeroes: client.OpWriteZeroes,
}

func (b *backend) Submit(op frontend.Op, buf []byte, off, length int64, done func(error)) {
	if int(op) >= len(ops) || op == 0 {
		done(api.ErrBadRequest)
		return
	}
	b.v.Submit(ops[op], buf, off, length, done)
}

func isNotFound(err error) bool {
	s, ok := status.FromError(errors.Unwrap(err))
	if !ok {
		s, ok = status.FromError(err)
	}
	return ok && s.Code() == codes.NotFound
}
