package frontend

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// ErrServerClosed is returned by Conns.Serve and Conns.ServeConn after
// Shutdown or Close; the protocol packages re-export it.
var ErrServerClosed = errors.New("frontend: server closed")

// Conn is one accepted connection of a protocol server, run by Conns.
type Conn interface {
	// Serve runs the connection to its end on the calling goroutine and closes
	// its socket before it returns.
	Serve()
	// BeginShutdown asks the connection to end gracefully: finish and answer
	// what it already read, refuse the rest, then return from Serve. It is
	// called with Conns' lock held (once per Shutdown call), so it must not
	// block nor call back into Conns (lock order: Conns before the
	// connection's own lock).
	BeginShutdown()
	// Close ends the connection at once (closes its socket); Serve then
	// returns soon. It may be called with Conns' lock held, and more than once.
	Close()
}

// ConnsConfig configures NewConns. New is required.
type ConnsConfig struct {
	// Protocol names the server in log lines ("nbd", "nvmf").
	Protocol string
	Logger   *slog.Logger // default slog.Default()
	// New wraps an accepted socket in the protocol's connection; it must not
	// block (the accept loop calls it).
	New func(nc net.Conn) Conn
}

// Conns is the part every protocol server shares: accept loops on any number
// of listeners, the set of live connections, and the two ways to stop
// (Shutdown, graceful; Close, hard). The protocol supplies only its Conn.
//
// Goroutines: one per Serve call (the accept loop, the caller's), one per
// accepted connection (running Conn.Serve), and whatever each Conn starts,
// which its Serve must wait for.
type Conns struct {
	proto string
	log   *slog.Logger
	newFn func(net.Conn) Conn

	// ctx ends when Shutdown or Close begins: protocols bound their waits
	// during a connection's setup (an export opening) with it.
	ctx    context.Context
	cancel context.CancelFunc

	wg sync.WaitGroup // one per connection, until its Serve returned

	// mu guards the fields below. Lock order: Conns.mu before any Conn's lock.
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	active    map[Conn]struct{}
	closing   bool // Shutdown or Close was called
}

// NewConns returns an empty Conns; it accepts nothing until Serve.
func NewConns(cfg ConnsConfig) *Conns {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Protocol == "" {
		cfg.Protocol = "frontend"
	}
	c := &Conns{
		proto:     cfg.Protocol,
		log:       cfg.Logger,
		newFn:     cfg.New,
		listeners: map[net.Listener]struct{}{},
		active:    map[Conn]struct{}{},
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Context ends when Shutdown or Close begins.
func (s *Conns) Context() context.Context { return s.ctx }

// Serve accepts connections on ln until Shutdown or Close, and then returns
// ErrServerClosed; any other permanent accept failure is returned as is, and
// transient ones (EMFILE, ECONNABORTED) are retried with a backoff. It may be
// called concurrently for several listeners. Serve closes ln when it returns.
func (s *Conns) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn(s.proto+": accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		c := s.newFn(nc)
		if !s.track(c) {
			nc.Close()
			return ErrServerClosed
		}
		go func() {
			defer s.untrack(c)
			c.Serve()
		}()
	}
}

// ServeConn serves one already accepted connection (a socket handed over by a
// previous process, a test's pipe) and returns when it ended.
func (s *Conns) ServeConn(nc net.Conn) error {
	c := s.newFn(nc)
	if !s.track(c) {
		nc.Close()
		return ErrServerClosed
	}
	defer s.untrack(c)
	c.Serve()
	return nil
}

// track registers c; false if the server is closing.
func (s *Conns) track(c Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.active[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Conns) untrack(c Conn) {
	s.mu.Lock()
	delete(s.active, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Shutdown stops accepting, asks every connection to end gracefully
// (Conn.BeginShutdown) and waits for them. If ctx ends first, the remaining
// connections are closed hard (as by Close) and ctx.Err() is returned.
func (s *Conns) Shutdown(ctx context.Context) error {
	s.stop(func(c Conn) { c.BeginShutdown() })
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.closeAll()
		<-done
		return ctx.Err()
	}
}

// Close stops accepting and closes every connection at once. It returns when
// every connection's Serve returned.
func (s *Conns) Close() error {
	s.stop(nil)
	s.closeAll()
	s.wg.Wait()
	return nil
}

// stop marks the server closing, closes the listeners and applies each to
// every live connection, once per Shutdown or Close call.
func (s *Conns) stop(each func(Conn)) {
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	if each != nil {
		for c := range s.active {
			each(c)
		}
	}
}

func (s *Conns) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.active {
		c.Close()
	}
}

// Len returns the number of live connections.
func (s *Conns) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}

// Closing reports whether Shutdown or Close was called. Once it is true,
// every connection live at that moment was asked to end (BeginShutdown or
// closed): it is set under the same lock.
func (s *Conns) Closing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}
