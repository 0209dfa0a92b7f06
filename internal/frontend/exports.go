package frontend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ExportsConfig configures NewExports. Only Opener is required.
type ExportsConfig struct {
	Opener Opener
	Logger *slog.Logger // default slog.Default()
	// OpenTimeout bounds one Opener.Open, which every attacher of that name
	// waits for. Default 30 s.
	OpenTimeout time.Duration
	// SizeCheck is how often a watched export's size is re-read (WatchSize),
	// so that a resize reaches the hosts as a unit attention or a namespace
	// notice (online expansion). Default 5 s; negative: never.
	SizeCheck time.Duration
}

// Exports is the export lifecycle that every protocol server of a process
// shares: a backend is opened when the first attachment to its name arrives,
// shared by every later one (so all connections to an export see the same
// device, which makes NBD's CAN_MULTI_CONN true), and closed when the last one
// detaches. See doc.go for the rules.
type Exports struct {
	opener      Opener
	log         *slog.Logger
	openTimeout time.Duration
	sizeCheck   time.Duration   // 0: no size watches
	ctx         context.Context // ends at Close: bounds the watches' re-reads
	cancel      context.CancelFunc

	// mu guards the fields below and every export's refs, done and closed. It is
	// never held across a call to the Opener or a Backend.
	mu      sync.Mutex
	current map[string]*export // the export new attachments to a name join
	live    map[*export]bool   // exports whose backend is open or opening
	// releasing counts, per name, backends release is closing right now.
	releasing map[string]int
	watches   map[string]*sizeWatch // one per watched name (sizewatch.go)
	closing   bool                  // Close was called
}

// export is one opening of a backend, shared by its attachments.
type export struct {
	name  string
	ready chan struct{} // closed when the open finished; b and err are set before

	b   Backend
	err error

	refs   int  // attachments and attachers waiting for ready; guarded by Exports.mu
	done   bool // the open finished; guarded by Exports.mu
	closed bool // b.Close was called (or is due); guarded by Exports.mu
}

// NewExports returns the lifecycle over cfg.Opener.
func NewExports(cfg ExportsConfig) *Exports {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = 30 * time.Second
	}
	switch {
	case cfg.SizeCheck == 0:
		cfg.SizeCheck = 5 * time.Second
	case cfg.SizeCheck < 0:
		cfg.SizeCheck = 0
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Exports{
		opener:      cfg.Opener,
		log:         cfg.Logger,
		openTimeout: cfg.OpenTimeout,
		sizeCheck:   cfg.SizeCheck,
		ctx:         ctx,
		cancel:      cancel,
		current:     map[string]*export{},
		live:        map[*export]bool{},
		watches:     map[string]*sizeWatch{},
	}
}

// Attachment is one user's hold on an export: an NBD connection in
// transmission (later an iSCSI session or an NVMe controller). Detach it when
// the user is gone and none of its IO is in flight.
type Attachment struct {
	e    *Exports
	x    *export
	info Info
	once sync.Once
}

// Backend is the shared device to submit IO to.
func (a *Attachment) Backend() Backend { return a.x.b }

// Info describes the export as of the attach: block sizes filled in and
// checked, the size current at that moment.
func (a *Attachment) Info() Info { return a.info }

// Classify wraps a failed IO's error in its class (see Opener.Classify).
func (a *Attachment) Classify(err error) error { return a.e.opener.Classify(err) }

// Detach releases the attachment; the last one closes the backend. It may be
// called more than once.
func (a *Attachment) Detach() { a.once.Do(func() { a.e.release(a.x) }) }

// Attach joins the named export, opening its backend if no attachment holds
// it. Attachers of one name wait for one shared open (bounded by
// ExportsConfig.OpenTimeout, or ctx for this caller); attachers of other names
// never wait for it. An open backend that can serve no more IO (Backend.Check:
// fenced) is left to the attachments that still hold it, and the newcomer gets
// a fresh one.
func (e *Exports) Attach(ctx context.Context, name string) (*Attachment, error) {
	for attempt := 0; ; attempt++ {
		x, fresh, err := e.join(name)
		if err != nil {
			return nil, err
		}
		select {
		case <-x.ready:
		case <-ctx.Done():
			e.release(x)
			return nil, fmt.Errorf("frontend: attach %q: %w", name, ctx.Err())
		}
		if x.err != nil {
			e.release(x)
			return nil, x.err
		}
		if !fresh {
			if err := x.b.Check(ctx); err != nil {
				e.retire(x, err)
				e.release(x)
				if attempt == 0 && ctx.Err() == nil {
					continue
				}
				return nil, fmt.Errorf("frontend: attach %q: %w", name, err)
			}
		}
		info, err := x.b.Info().checked()
		if err != nil {
			e.release(x)
			return nil, fmt.Errorf("frontend: attach %q: %w", name, err)
		}
		return &Attachment{e: e, x: x, info: info}, nil
	}
}

// join takes a reference on the export new attachments to name join, starting
// its open if there is none. fresh reports an export whose open had not
// finished when joined (no Check needed).
func (e *Exports) join(name string) (x *export, fresh bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return nil, false, ErrClosed
	}
	x = e.current[name]
	if x == nil {
		x = &export{name: name, ready: make(chan struct{})}
		e.current[name] = x
		e.live[x] = true
		go e.open(x)
	}
	x.refs++
	return x, !x.done, nil
}

// open runs the shared open of x on its own goroutine, so an attacher that
// gives up does not cancel it for the others.
func (e *Exports) open(x *export) {
	ctx, cancel := context.WithTimeout(context.Background(), e.openTimeout)
	b, err := e.opener.Open(ctx, x.name)
	cancel()
	if err == nil {
		info := b.Info()
		e.log.Info("export opened", "export", x.name, "size", info.Size, "read_only", info.ReadOnly)
	} else if !errors.Is(err, ErrNoSuchExport) {
		e.log.Warn("export could not be opened", "export", x.name, "err", err)
	}

	e.mu.Lock()
	x.b, x.err, x.done = b, err, true
	unused := err == nil && (x.refs == 0 || e.closing)
	if unused {
		x.closed = true
		if e.closing {
			x.err = ErrClosed
		}
	}
	if x.err != nil || unused {
		e.forget(x)
	}
	close(x.ready)
	e.mu.Unlock()
	if unused {
		e.closeBackend(x, "every attacher gave up or the exports closed while it opened")
	}
}

// retire makes the next attachment to x's name open a fresh backend.
func (e *Exports) retire(x *export, why error) {
	e.mu.Lock()
	if e.current[x.name] != x {
		e.mu.Unlock()
		return // another attacher retired it already
	}
	delete(e.current, x.name)
	others := x.refs - 1
	e.mu.Unlock()
	e.log.Warn("export's backend can serve no more IO; opening the export again for a new attachment "+
		"(the attachments still on the old one keep failing until their clients reconnect)",
		"export", x.name, "err", why, "attachments_on_old", others)
}

// release drops one reference on x; the last one closes its backend.
func (e *Exports) release(x *export) {
	e.mu.Lock()
	x.refs--
	last := x.refs == 0 && x.done && x.err == nil && !x.closed
	if last {
		x.closed = true
		e.forget(x)
		if e.releasing == nil {
			e.releasing = map[string]int{}
		}
		e.releasing[x.name]++
	}
	e.mu.Unlock()
	if last {
		e.closeBackend(x, "last attachment detached")
		e.mu.Lock()
		if e.releasing[x.name]--; e.releasing[x.name] == 0 {
			delete(e.releasing, x.name)
		}
		e.mu.Unlock()
	}
}

// Idle reports that no backend of the named export is open, opening or
// being closed: its session at the MDS is gone (a host that detached its
// last attachment waits for this before the volume may be deleted).
func (e *Exports) Idle(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.current[name] != nil || e.releasing[name] > 0 {
		return false
	}
	for x := range e.live {
		if x.name == name {
			return false
		}
	}
	return true
}

// forget drops x from the maps. Called with e.mu held.
func (e *Exports) forget(x *export) {
	if e.current[x.name] == x {
		delete(e.current, x.name)
	}
	delete(e.live, x)
}

func (e *Exports) closeBackend(x *export, why string) {
	if err := x.b.Close(); err != nil {
		e.log.Warn("export closed with an error", "export", x.name, "why", why, "err", err)
		return
	}
	e.log.Info("export closed", "export", x.name, "why", why)
}

// Describe returns what a protocol advertises about the named export without
// opening it (Opener.Stat): it never takes a writer role.
func (e *Exports) Describe(ctx context.Context, name string) (Info, error) {
	info, err := e.opener.Stat(ctx, name)
	if err != nil {
		return Info{}, err
	}
	return info.checked()
}

// List returns the names of the exports that can be attached.
func (e *Exports) List(ctx context.Context) ([]string, error) { return e.opener.List(ctx) }

// Close refuses new attachments, ends the size watches and closes every open
// backend, also those that attachments still hold (their IO then fails): call
// it after the protocol servers closed. A backend still opening is closed when
// its open finishes.
func (e *Exports) Close() error {
	e.cancel()
	e.mu.Lock()
	e.closing = true
	for name, w := range e.watches {
		delete(e.watches, name)
		close(w.stop)
	}
	var open []*export
	for x := range e.live {
		if x.done && !x.closed {
			x.closed = true
			open = append(open, x)
			e.forget(x)
		}
	}
	e.mu.Unlock()
	var errs []error
	for _, x := range open {
		if err := x.b.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close export %q: %w", x.name, err))
		}
	}
	return errors.Join(errs...)
}
