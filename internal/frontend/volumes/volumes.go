package volumes

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// Config says how to reach the cluster and how to open volumes.
type Config struct {
	// MDS is the metadata service: volume lookups (Stat, List) and every
	// volume's session. Required; the Opener does not close it.
	MDS api.MDSClient
	// ReadOnly opens every volume read-only: its exports never write, so they
	// can serve alongside a writer elsewhere.
	ReadOnly   bool
	ClientName string // shown in the MDS's sessions
	Logger     *slog.Logger
	// Metrics, if set, is given to every volume's client (client.NewMetrics).
	Metrics *client.Metrics
	// Local, if set, is the in-process short cut to a chunkserver hosting
	// this front end (client.Config.Local, the local fast path).
	Local client.Local
	// DataTLS is the front end's identity toward chunkservers
	// (client.Config.DataTLS); nil only for a cluster without TLS.
	DataTLS *tls.Config
	// ClaimTimeout bounds taking the writer role on a volume's first write.
	// Default 30 s.
	ClaimTimeout time.Duration
}

// refreshTimeout bounds Check's size lookup at the MDS.
const refreshTimeout = 2 * time.Second

// Opener opens basalt volumes as frontend backends.
type Opener struct {
	cfg Config
}

// New returns an Opener over the cluster named by cfg.
func New(cfg Config) *Opener {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ClaimTimeout <= 0 {
		cfg.ClaimTimeout = 30 * time.Second
	}
	return &Opener{cfg: cfg}
}

func (o *Opener) openVolume(ctx context.Context, name string, readOnly bool) (*client.Volume, error) {
	v, err := client.Open(ctx, client.Config{
		MDSClient:  o.cfg.MDS,
		Volume:     name,
		ReadOnly:   readOnly,
		ClientName: o.cfg.ClientName,
		Logger:     o.cfg.Logger,
		Metrics:    o.cfg.Metrics,
		Local:      o.cfg.Local,
		DataTLS:    o.cfg.DataTLS,
	})
	if isNotFound(err) {
		return nil, fmt.Errorf("%w: %q", frontend.ErrNoSuchExport, name)
	}
	return v, err
}

// Open opens the named volume with a read-only session: it takes no writer
// role. The backend claims the role on its first write, trim or write-zeroes.
func (o *Opener) Open(ctx context.Context, name string) (frontend.Backend, error) {
	v, err := o.openVolume(ctx, name, true)
	if err != nil {
		return nil, err
	}
	return &backend{o: o, name: name, ro: v, writable: !o.cfg.ReadOnly}, nil
}

// Stat describes the named volume from the MDS's metadata; it opens no session.
func (o *Opener) Stat(ctx context.Context, name string) (frontend.Info, error) {
	resp, err := o.cfg.MDS.GetVolume(ctx, &api.GetVolumeRequest{Name: name})
	if isNotFound(err) {
		return frontend.Info{}, fmt.Errorf("%w: %q", frontend.ErrNoSuchExport, name)
	}
	if err != nil {
		return frontend.Info{}, fmt.Errorf("look up volume %q: %w", name, err)
	}
	return o.info(int64(resp.GetVolume().GetSize())), nil
}

func (o *Opener) info(size int64) frontend.Info {
	writable := !o.cfg.ReadOnly
	return frontend.Info{
		Size:           size,
		ReadOnly:       !writable,
		CanFlush:       true,
		CanFUA:         writable,
		CanTrim:        writable,
		CanWriteZeroes: writable,
		// Any byte range works; 4 KiB is what the chunk files and the WAL like.
		BlockSizes: frontend.BlockSizes{Minimum: 1, Preferred: 4096},
	}
}

// List returns the names of all volumes.
func (o *Opener) List(ctx context.Context) ([]string, error) {
	resp, err := o.cfg.MDS.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	names := make([]string, 0, len(resp.Volumes))
	for _, v := range resp.Volumes {
		names = append(names, v.Name)
	}
	sort.Strings(names)
	return names, nil
}

// Classify maps the client library's errors to the frontend's error classes.
func (o *Opener) Classify(err error) error {
	var class error
	switch {
	case errors.Is(err, api.ErrFenced), errors.Is(err, client.ErrLeaseExpired):
		class = frontend.ErrFenced
	case errors.Is(err, api.ErrReadOnly):
		class = frontend.ErrReadOnly
	case errors.Is(err, api.ErrNoSpace):
		class = frontend.ErrNoSpace
	case errors.Is(err, api.ErrOutOfRange):
		class = frontend.ErrOutOfRange
	case errors.Is(err, api.ErrBadRequest):
		class = frontend.ErrInvalid
	case errors.Is(err, client.ErrTimeout), errors.Is(err, client.ErrNoRoute), mdsAway(err):
		class = frontend.ErrUnavailable
	case errors.Is(err, client.ErrClosed):
		class = frontend.ErrShuttingDown
	default:
		class = frontend.ErrIO
	}
	return fmt.Errorf("%w: %w", class, err)
}

// backend is one open volume. It starts with a read-only session and opens a
// writer session on the first mutation (claim); from then on every IO goes to
// the writer session. The read-only session stays open until Close, since IO
// may still be on its way to it.
type backend struct {
	o        *Opener
	name     string
	ro       *client.Volume
	writable bool // the export may take the writer role

	rw atomic.Pointer[client.Volume] // the writer session, once claimed

	mu       sync.Mutex
	claiming bool        // a claim goroutine runs; guarded by mu
	waiting  []pendingIO // IO that waits for the claim; guarded by mu
	closed   bool        // guarded by mu
}

// pendingIO is an IO held until the writer role is claimed.
type pendingIO struct {
	op          api.Op
	buf         []byte
	off, length int64
	done        func(error)
}

func (b *backend) Submit(op api.Op, buf []byte, off, length int64, done func(error)) {
	if !op.IsBlockIO() {
		done(api.ErrBadRequest)
		return
	}
	if w := b.rw.Load(); w != nil {
		w.Submit(op, buf, off, length, done)
		return
	}
	if op == api.OpRead || !b.writable {
		b.ro.Submit(op, buf, off, length, done)
		return
	}
	b.beforeClaim(pendingIO{op, buf, off, length, done})
}

// Mapped implements frontend.Mapper: the chunkservers answer from the
// chunks that exist (client OpMapped), through the session IO goes to.
func (b *backend) Mapped(bits []byte, off, length int64, done func(error)) {
	b.session().Submit(api.OpMapped, bits, off, length, done)
}

// CompareAndWrite implements frontend.CompareAndWriter: the copyset's
// leader compares and writes (client OpCompareAndWrite), on the writer
// session, which it claims like a write.
func (b *backend) CompareAndWrite(buf []byte, off, length int64, done func(error)) {
	d := func(err error) {
		var me *client.MiscompareError
		if errors.As(err, &me) {
			err = &frontend.MiscompareError{Offset: me.Offset}
		}
		done(err)
	}
	if w := b.rw.Load(); w != nil {
		w.Submit(api.OpCompareAndWrite, buf, off, length, d)
		return
	}
	if !b.writable {
		b.ro.Submit(api.OpCompareAndWrite, buf, off, length, d) // refused: read-only
		return
	}
	b.beforeClaim(pendingIO{api.OpCompareAndWrite, buf, off, length, d})
}

// beforeClaim handles a mutation or flush that found no writer session: it
// waits for the claim, which it starts if none runs. A flush with no claim
// running has no write to wait for and completes on the read-only session.
func (b *backend) beforeClaim(io pendingIO) {
	b.mu.Lock()
	if w := b.rw.Load(); w != nil { // claimed meanwhile
		b.mu.Unlock()
		w.Submit(io.op, io.buf, io.off, io.length, io.done)
		return
	}
	if b.closed { // a closed backend must not fence the volume's writer
		b.mu.Unlock()
		io.done(client.ErrClosed)
		return
	}
	if io.op == api.OpFlush && !b.claiming {
		b.mu.Unlock()
		b.ro.Submit(io.op, nil, 0, 0, io.done)
		return
	}
	b.waiting = append(b.waiting, io)
	if !b.claiming {
		b.claiming = true
		go b.claim()
	}
	b.mu.Unlock()
}

// claim opens the writer session (a new epoch: any other writer of the volume
// is fenced) and hands it the IO that waited. If it fails, that IO fails and
// the next mutation tries again.
func (b *backend) claim() {
	ctx, cancel := context.WithTimeout(context.Background(), b.o.cfg.ClaimTimeout)
	v, err := b.openWriter(ctx)
	cancel()
	b.mu.Lock()
	if err == nil && b.closed {
		err = client.ErrClosed
		defer v.Close()
	}
	if err == nil {
		b.rw.Store(v)
	}
	waiting := b.waiting
	b.waiting, b.claiming = nil, false
	b.mu.Unlock()
	if err != nil {
		b.o.cfg.Logger.Warn("could not take the writer role of a volume for its first write; "+
			"the IO that waited fails, and the next write tries again", "volume", b.name, "ios", len(waiting), "err", err)
		for _, io := range waiting {
			io.done(err)
		}
		return
	}
	b.o.cfg.Logger.Info("took the writer role of a volume on its first write; any other writer of it is fenced",
		"volume", b.name, "epoch", v.Epoch())
	for _, io := range waiting {
		v.Submit(io.op, io.buf, io.off, io.length, io.done)
	}
}

// openWriter opens a writer session on the volume the read-only session has
// open. Sessions are opened by name, and a volume with only read-only sessions
// may be deleted and a new one created under its name: the checks before and
// after the open make sure an attachment of the old volume never takes the
// writer role of the new one (the one before also spares the new one's writer
// a needless fence).
func (b *backend) openWriter(ctx context.Context) (*client.Volume, error) {
	if err := b.ro.Err(); err != nil {
		return nil, err // stopped for good (lease lapsed, volume gone): no comeback as a writer
	}
	if err := b.ro.Refresh(ctx); err != nil {
		if isNotFound(err) {
			return nil, b.deleted()
		}
		return nil, err
	}
	v, err := b.o.openVolume(ctx, b.name, false)
	if err != nil {
		return nil, err
	}
	if v.ID() != b.ro.ID() {
		v.Close()
		return nil, b.deleted()
	}
	return v, nil
}

func (b *backend) deleted() error {
	return fmt.Errorf("%w: volume %q (id %d) was deleted since this export opened it; reconnect to open the volume now under that name",
		frontend.ErrNoSuchExport, b.name, b.ro.ID())
}

func (b *backend) session() *client.Volume {
	if w := b.rw.Load(); w != nil {
		return w
	}
	return b.ro
}

func (b *backend) Info() frontend.Info { return b.o.info(b.session().Size()) }

// Check reports a session that stopped for good (fenced, lease lapsed) or a
// volume that was deleted, and otherwise re-reads the volume's size, which a
// resize may have grown.
func (b *backend) Check(ctx context.Context) error {
	v := b.session()
	if err := v.Err(); err != nil {
		return b.o.Classify(err)
	}
	// Bounded: an MDS that is away (a failover) must not hold up attachments
	// to a volume that is already open.
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	if err := v.Refresh(ctx); isNotFound(err) {
		return b.deleted()
	} else if err != nil {
		b.o.cfg.Logger.Warn("could not re-read a volume's size; keeping the one known", "volume", b.name, "err", err)
	}
	return nil
}

func (b *backend) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	var errs []error
	if w := b.rw.Load(); w != nil {
		errs = append(errs, w.Close())
	}
	errs = append(errs, b.ro.Close())
	return errors.Join(errs...)
}

// isNotFound reports the MDS's NotFound, however wrapped.
func isNotFound(err error) bool { return status.Code(err) == codes.NotFound }

// mdsAway reports an MDS that did not answer in time (taking the writer role
// needs it).
func mdsAway(err error) bool {
	code := status.Code(err)
	return code == codes.Unavailable || code == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)
}
