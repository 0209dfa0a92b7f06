package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Errors of the client library. Chunkserver refusals come as *api.Error
// (errors.Is(err, api.ErrFenced) and so on).
var (
	// ErrLeaseExpired: the session's lease lapsed (renewals failed for a whole
	// lease, or the MDS no longer knows the session). The volume issues no more IO;
	// open it again.
	ErrLeaseExpired = errors.New("client: session lease expired")
	// ErrClosed: the volume was closed.
	ErrClosed = errors.New("client: volume closed")
	// ErrTimeout: an IO did not complete within Config.OpTimeout; the error also
	// wraps the last failure seen.
	ErrTimeout = errors.New("client: IO deadline exceeded")
	// ErrNoRoute: the MDS gave no usable member list for a copyset.
	ErrNoRoute = errors.New("client: no route to copyset")
)

// Defaults of Config.
const (
	DefaultIOTimeout = 2 * time.Second
	DefaultOpTimeout = 60 * time.Second
)

// Config configures Open.
type Config struct {
	MDS []string // MDS addresses
	// MDSTLS is the TLS configuration for dialing MDS (the client's
	// certificate; see docs/security.md); nil only for an --insecure MDS.
	MDSTLS     *tls.Config
	Volume     string // volume name
	ReadOnly   bool
	ClientName string        // shown in MDS status and logs; default host name and pid
	IOTimeout  time.Duration // one attempt (plus time for the piece's size at 16 MiB/s); default 2 s
	OpTimeout  time.Duration // one IO, all retries included; default 60 s
	Logger     *slog.Logger

	// DataTLS is how connections to chunkservers prove this client's
	// identity and check theirs (docs/security.md): the identity's
	// ClientTLS(RoleChunkserver). Each chunkserver must prove to be the one
	// dialled. nil: no handshake (an --insecure cluster).
	DataTLS *tls.Config
	// DataEncrypted asks for TLS for the whole connection; by default the
	// handshake authenticates both ends and the frames then go in clear
	// (the "authenticated" mode).
	DataEncrypted bool

	// MDSClient, if set, is used instead of dialing MDS (tests, processes that
	// already hold one). The Volume does not close it.
	MDSClient api.MDSClient
	// Metrics, if set, records latency and counters (NewMetrics); one Metrics
	// may serve many volumes.
	Metrics *Metrics
	// Local, if set, is the local fast path (docs/design.md §7): a piece whose target is
	// the chunkserver Local.LocalID() is handed to Local.Go in process instead of
	// being sent over a connection. A chunkserver that embeds a front end sets it.
	Local Local
}

// Local is an in-process short cut to one chunkserver: the local fast path. The
// chunkserver implements it; the client uses it for every attempt whose target
// is LocalID, exactly as it would use a connection to that chunkserver (the same
// request header, the same reply statuses and retries).
//
// Go serves one request: req is its header (op, volume, epoch, offset, length,
// copyset, flags) as a frame would carry it; payload is a write's data, which
// stays untouched until done (the callee copies what it keeps); readBuf is a
// read's destination, filled in place — no socket and no copy through a reply
// frame. done is called exactly once, on any goroutine, with the reply header
// (Status, Hint, PayloadLen); it must not block. Go itself must not block on IO.
//
// No per-attempt timer guards a local call: the chunkserver answers every request
// it accepted (a raft proposal is failed with NOT_LEADER when leadership is lost,
// and every request fails when the chunkserver stops).
type Local interface {
	LocalID() uint64 // the chunkserver served in process; 0 = not known yet
	Go(req api.Header, payload, readBuf []byte, done func(reply api.Header))
}

// Volume is an open volume. All methods are safe for concurrent use.
//
// Goroutines: one lease renewer (writable and leased read-only sessions); one
// dialer per chunkserver while a connection is being made; the transport's
// goroutines per connection, on which IO completions and retries run. No
// goroutine exists per IO.
type Volume struct {
	cfg       Config
	log       *slog.Logger
	mds       api.MDSClient
	closeMDS  func() error
	id        uint64
	name      string
	size      atomic.Int64 // grows when Refresh finds the volume resized
	epoch     uint64
	session   uint64
	pool      uint32
	chunkSize int64
	csCount   uint32
	maxPiece  int64

	seqs   []seqCounter // per copyset; nil when read-only
	routes routeTable
	conns  *transport.ConnCache[uint64] // one connection per chunkserver id
	// capToken is the session's capability (the MDS's signed token; nil
	// from an MDS that signs none), attached to every connection (attach).
	capToken atomic.Pointer[[]byte]
	m        *volumeMetrics // nil: no metrics

	// base anchors monotonic times kept as nanoseconds in atomics.
	base       time.Time
	leaseUntil atomic.Int64 // nanoseconds since base; 0 = no lease
	dead       atomic.Pointer[error]

	opMu     sync.Mutex
	opIdle   *sync.Cond // signalled when inflight drops to 0 while closing
	inflight int        // IO submitted and not completed
	closing  bool       // Close began: no new IO
	flushes  flushTracker

	stopRenew chan struct{}
	renewDone chan struct{}
	closeOnce sync.Once
}

// Open opens the volume named cfg.Volume: a session at the MDS (epoch and lease),
// the routing tables of its pool, and a lease renewer.
func Open(ctx context.Context, cfg Config) (*Volume, error) {
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = DefaultIOTimeout
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.ClientName == "" {
		host, _ := os.Hostname()
		cfg.ClientName = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	mds := cfg.MDSClient
	closeMDS := func() error { return nil }
	if mds == nil {
		mc, err := mdsclient.Dial(cfg.MDS, cfg.MDSTLS)
		if err != nil {
			return nil, err
		}
		mds, closeMDS = mc, mc.Close
	}
	base := time.Now() // the lease runs from before the request, to be safe
	resp, err := mds.OpenVolume(ctx, &api.OpenVolumeRequest{Name: cfg.Volume, ReadOnly: cfg.ReadOnly, Client: cfg.ClientName})
	if err != nil {
		closeMDS()
		return nil, fmt.Errorf("client: open volume %q: %w", cfg.Volume, err)
	}
	vol, pool := resp.GetVolume(), resp.GetPool()
	if vol == nil || pool == nil || pool.GetChunkSize() == 0 || pool.GetCopysetCount() == 0 {
		closeMDS()
		return nil, fmt.Errorf("client: open volume %q: incomplete answer from the MDS", cfg.Volume)
	}
	v := &Volume{
		cfg:       cfg,
		log:       log.With("volume", vol.GetId(), "name", vol.GetName()),
		mds:       mds,
		closeMDS:  closeMDS,
		id:        vol.GetId(),
		name:      vol.GetName(),
		epoch:     resp.GetEpoch(),
		session:   resp.GetSessionId(),
		pool:      pool.GetId(),
		chunkSize: int64(pool.GetChunkSize()),
		csCount:   pool.GetCopysetCount(),
		base:      base,
		stopRenew: make(chan struct{}),
		renewDone: make(chan struct{}),
	}
	v.size.Store(int64(vol.GetSize()))
	v.opIdle = sync.NewCond(&v.opMu)
	v.m = cfg.Metrics.forVolume(vol.GetName())
	if cfg.ReadOnly {
		v.epoch = 0
	}
	v.maxPiece = min(v.chunkSize, maxPieceBytes)
	if !cfg.ReadOnly {
		v.seqs = make([]seqCounter, v.csCount)
	}
	v.routes.init(v, pool.GetId(), resp.GetCopysets(), resp.GetChunkservers())
	if tok := resp.GetCapability(); len(tok) > 0 {
		v.capToken.Store(&tok)
	}
	v.conns = newConnCache(v)
	lease := time.Duration(resp.GetLeaseMs()) * time.Millisecond
	if lease > 0 {
		v.leaseUntil.Store(int64(lease))
		go v.renewLoop(lease)
	} else {
		close(v.renewDone)
	}
	var fenced time.Duration
	if v.epoch > 1 {
		// A takeover: the writer before this one may still hold a valid lease
		// (cut off from the MDS, it learns of nothing for up to a lease). Fence
		// it out of every copyset now, not lazily on this writer's first IO
		// there (docs/reliability.md, "Writer takeover").
		t0 := time.Now()
		if err := v.fenceAll(ctx); err != nil {
			v.Close()
			return nil, fmt.Errorf("client: open volume %q: %w", cfg.Volume, err)
		}
		fenced = time.Since(t0)
	}
	v.log.Info("client: volume open", "epoch", v.epoch, "session", v.session, "size", v.Size(),
		"read_only", cfg.ReadOnly, "lease", lease, "fence", fenced)
	return v, nil
}

// ErrFenceFailed: a takeover Open could not fence every copyset of the
// volume's pool (the error wraps why, naming the copyset), so it cannot
// promise that the previous writer lands no more writes; the Open fails.
var ErrFenceFailed = errors.New("client: could not fence the previous writer out of every copyset")

// fenceAll sends OpFence with this session's epoch to every copyset of the
// pool, all at once, each retried like an IO (leader cache, NOT_LEADER hints,
// other members, route refreshes) until Config.OpTimeout or ctx's deadline. It
// returns once every copyset applied the fence, so the previous writer's IO is
// refused with FENCED everywhere; or the first failure (or ctx's error),
// wrapped in ErrFenceFailed. FENCED itself means a still newer writer took over meanwhile
// (the volume then stops, like on any FENCED reply).
func (v *Volume) fenceAll(ctx context.Context) error {
	ch := make(chan error, 1)
	o := &ioOp{v: v, op: api.OpFence, done: func(err error) { ch <- err }, deadline: v.now() + int64(v.cfg.OpTimeout)}
	if d, ok := ctx.Deadline(); ok {
		o.deadline = min(o.deadline, v.now()+int64(time.Until(d)))
	}
	if !v.opStart() {
		return ErrClosed
	}
	o.pieces = make([]piece, v.csCount)
	for i := range o.pieces {
		o.pieces[i] = piece{op: o, cs: uint32(i)}
	}
	o.remaining.Store(int32(len(o.pieces)))
	for i := range o.pieces {
		o.pieces[i].attempt()
	}
	var err error
	select {
	case err = <-ch:
	case <-ctx.Done(): // the caller's Close ends the attempts still running
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("%w (pool %d, epoch %d): %w", ErrFenceFailed, v.pool, v.epoch, err)
	}
	return nil
}

// Size is the volume's size in bytes, as of Open or the last Refresh.
func (v *Volume) Size() int64 { return v.size.Load() }

// Refresh reads the volume's size from the MDS again, so that IO reaches the part
// a resize added. Volumes only grow; a smaller answer is ignored.
func (v *Volume) Refresh(ctx context.Context) error {
	resp, err := v.mds.GetVolume(ctx, &api.GetVolumeRequest{Id: v.id})
	if err != nil {
		return fmt.Errorf("client: refresh volume %q: %w", v.name, err)
	}
	n := int64(resp.GetVolume().GetSize())
	for {
		old := v.size.Load()
		if n <= old {
			return nil
		}
		if v.size.CompareAndSwap(old, n) {
			v.log.Info("client: volume grew", "old_size", old, "size", n)
			return nil
		}
	}
}

// Err returns why the volume stopped issuing IO (api.ErrFenced, ErrLeaseExpired,
// ErrClosed), or nil while it serves IO.
func (v *Volume) Err() error { return v.usable() }

// Epoch is the writer epoch every IO of this session carries (0 when read-only).
func (v *Volume) Epoch() uint64 { return v.epoch }

// ID is the volume's id.
func (v *Volume) ID() uint64 { return v.id }

func (v *Volume) now() int64 { return int64(time.Since(v.base)) }

// stop makes every later IO fail with err (the first reason wins).
func (v *Volume) stop(err error) {
	if v.dead.CompareAndSwap(nil, &err) {
		if err != ErrClosed {
			v.log.Warn("client: volume stops issuing IO", "err", err)
		}
	}
}

// usable returns why the volume may not issue IO now, or nil.
func (v *Volume) usable() error {
	if p := v.dead.Load(); p != nil {
		return *p
	}
	if until := v.leaseUntil.Load(); until != 0 && v.now() > until {
		v.stop(ErrLeaseExpired)
		return ErrLeaseExpired
	}
	return nil
}

// renewRetry is the pause before retrying a failed lease renewal.
const renewRetry = 200 * time.Millisecond

// renewLoop renews the session every lease/3, and renewRetry after a renewal
// that failed. A renewal extends the lease from the
// moment it was sent. Renewals that keep failing let the lease lapse; the MDS saying
// the session was superseded stops the volume at once.
func (v *Volume) renewLoop(lease time.Duration) {
	defer close(v.renewDone)
	interval := lease / 3
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-v.stopRenew:
			return
		case <-t.C:
		}
		if v.usable() != nil {
			return
		}
		sent := v.now()
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		resp, err := v.mds.RenewSession(ctx, &api.RenewSessionRequest{SessionId: v.session})
		cancel()
		switch {
		case err == nil:
			if l := time.Duration(resp.GetLeaseMs()) * time.Millisecond; l > 0 {
				lease, interval = l, l/3
			}
			v.extendLease(sent + int64(lease))
			if tok := resp.GetCapability(); len(tok) > 0 {
				v.capToken.Store(&tok)
				v.reattach()
			}
		case status.Code(err) == codes.FailedPrecondition || errors.Is(err, api.ErrFenced):
			v.stop(fmt.Errorf("%w: session superseded: %v", api.ErrFenced, err))
			return
		case status.Code(err) == codes.NotFound:
			v.stop(fmt.Errorf("%w: the MDS no longer knows the session: %v", ErrLeaseExpired, err))
			return
		default:
			v.log.Warn("client: lease renewal failed", "err", err,
				"lease_left", time.Duration(v.leaseUntil.Load()-v.now()))
			// Try again soon, not a whole interval later: an MDS failover
			// takes seconds (the election TTL), and a renewal that failed
			// near its end would otherwise leave the next one after the
			// lease ran out, stopping IO although a standby had taken over.
			t.Reset(min(interval, renewRetry))
			continue
		}
		t.Reset(interval)
	}
}

func (v *Volume) extendLease(until int64) {
	for {
		old := v.leaseUntil.Load()
		if until <= old || v.leaseUntil.CompareAndSwap(old, until) {
			return
		}
	}
}

// ReadAt reads len(p) bytes at off. IO past the end fails with api.ErrOutOfRange.
func (v *Volume) ReadAt(p []byte, off int64) (int, error) {
	if err := v.wait(api.OpRead, p, off, int64(len(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt writes p at off; it returns once the write is durable on a majority.
func (v *Volume) WriteAt(p []byte, off int64) (int, error) {
	if err := v.wait(api.OpWrite, p, off, int64(len(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush returns once every write submitted before it completed (writes are durable
// when acknowledged, docs/design.md §11).
func (v *Volume) Flush() error { return v.wait(api.OpFlush, nil, 0, 0) }

// Trim discards [off, off+length): it reads as zeros afterwards.
func (v *Volume) Trim(off, length int64) error { return v.wait(api.OpTrim, nil, off, length) }

// WriteZeroes writes zeros over [off, off+length).
func (v *Volume) WriteZeroes(off, length int64) error {
	return v.wait(api.OpWriteZeroes, nil, off, length)
}

// CompareAndWrite writes data at off if the volume holds cmp there, atomically
// with respect to every other IO of the volume from any client (the copyset's
// leader compares and logs the write: internal/chunkserver's caw.go,
// docs/iscsi.md). When it holds other data, nothing is written and the error
// is a *MiscompareError.
// cmp and data have the same length, at most api.MaxCompareAndWrite, and
// the range lies within one chunk (else api.ErrBadRequest).
func (v *Volume) CompareAndWrite(cmp, data []byte, off int64) error {
	if len(cmp) != len(data) {
		return fmt.Errorf("%w: compare-and-write of %d bytes with %d to compare", api.ErrBadRequest, len(data), len(cmp))
	}
	buf := make([]byte, 0, 2*len(cmp))
	buf = append(append(buf, cmp...), data...)
	return v.wait(api.OpCompareAndWrite, buf, off, int64(len(cmp)))
}

// MiscompareError is a compare-and-write's answer when the volume held other
// data than the bytes to compare: nothing was written. Offset is the byte
// offset, within the compared range, of the first byte that differs.
// errors.Is(err, api.ErrMiscompare) holds for it.
type MiscompareError struct{ Offset int64 }

func (e *MiscompareError) Error() string {
	return fmt.Sprintf("basalt: MISCOMPARE at byte %d", e.Offset)
}

// Is matches api.ErrMiscompare.
func (e *MiscompareError) Is(target error) bool { return target == api.ErrMiscompare }

func (v *Volume) wait(op api.Op, buf []byte, off, length int64) error {
	ch := make(chan error, 1)
	v.Submit(op, buf, off, length, func(err error) { ch <- err })
	return <-ch
}

// Close stops IO (later IO fails with ErrClosed), waits for IO in flight to end,
// closes the session at the MDS and the connections.
func (v *Volume) Close() error {
	var err error
	v.closeOnce.Do(func() {
		v.stop(ErrClosed)
		close(v.stopRenew)
		<-v.renewDone
		v.opMu.Lock()
		v.closing = true
		v.opMu.Unlock()
		v.conns.Close() // in-flight calls fail; their retries see ErrClosed
		v.opMu.Lock()
		for v.inflight > 0 {
			v.opIdle.Wait()
		}
		v.opMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), v.cfg.IOTimeout)
		_, cerr := v.mds.CloseSession(ctx, &api.CloseSessionRequest{SessionId: v.session})
		cancel()
		if cerr != nil && status.Code(cerr) != codes.NotFound && status.Code(cerr) != codes.FailedPrecondition {
			err = fmt.Errorf("client: close session: %w", cerr)
		}
		if mErr := v.closeMDS(); err == nil && mErr != nil && !errors.Is(mErr, io.EOF) {
			err = mErr
		}
	})
	return err
}

// opStart counts a new IO unless the volume is closing.
func (v *Volume) opStart() bool {
	v.opMu.Lock()
	defer v.opMu.Unlock()
	if v.closing {
		return false
	}
	v.inflight++
	return true
}

func (v *Volume) opEnd() {
	v.opMu.Lock()
	v.inflight--
	if v.inflight == 0 && v.closing {
		v.opIdle.Broadcast()
	}
	v.opMu.Unlock()
}
