package transport

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrCacheClosed is returned by a ConnCache after Close.
var ErrCacheClosed = errors.New("transport: connection cache closed")

// DefaultDialTimeout bounds one dial of a ConnCache unless its config says
// otherwise.
const DefaultDialTimeout = 5 * time.Second

// ConnCacheConfig configures a ConnCache.
type ConnCacheConfig[K comparable] struct {
	// Addr resolves a key to the address to dial (required). It is called
	// only to dial; an error fails that dial.
	Addr func(K) (string, error)
	Conn ConnConfig
	// DialTimeout bounds one dial; default DefaultDialTimeout.
	DialTimeout time.Duration
	// RedialInterval: after a failed dial, Gets for the key fail at once with
	// that dial's error for this long, so that callers move on (to another
	// replica) instead of queueing behind dials of a dead server. 0: every Get
	// without a live connection dials.
	RedialInterval time.Duration
	// Check, if set, vets a new connection before it is used (the server's
	// identity, Conn.Peer); an error closes it and fails that dial.
	Check func(key K, c *Conn) error
}

// ConnCache keeps one Conn per key (a chunkserver id, an address), dialled on
// first use by a short-lived goroutine and dialled again once it died: a dead
// Conn is never handed out. Concurrent Gets for a key wait for the same dial.
// The client library keys it by chunkserver id, the scrubber by address.
//
// Lock order: a cachedConn's mu before ConnCache.mu (dial); Get and Close
// never hold both. Neither is held while calling back or dialling.
type ConnCache[K comparable] struct {
	cfg ConnCacheConfig[K]

	mu      sync.Mutex
	closed  bool
	entries map[K]*cachedConn
}

// cachedConn is the connection of one key and the state of its dial.
type cachedConn struct {
	mu       sync.Mutex
	conn     *Conn // nil while none is usable
	dialing  bool
	waiters  []func(*Conn, error) // Gets waiting for the dial in progress
	failedAt time.Time            // the last failed dial
	failErr  error
}

// NewConnCache returns an empty cache; Close it to close its connections.
func NewConnCache[K comparable](cfg ConnCacheConfig[K]) *ConnCache[K] {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	return &ConnCache[K]{cfg: cfg, entries: make(map[K]*cachedConn)}
}

// Get calls cb exactly once with a live connection for key: at once (on the
// caller's goroutine) if there is one, otherwise when a dial finished (on the
// dialling goroutine). cb gets an error instead when the dial failed (or
// failed less than RedialInterval ago), Addr failed, or the cache is closed
// (ErrCacheClosed). cb must not block.
func (c *ConnCache[K]) Get(key K, cb func(*Conn, error)) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cb(nil, ErrCacheClosed)
		return
	}
	e := c.entries[key]
	if e == nil {
		e = &cachedConn{}
		c.entries[key] = e
	}
	c.mu.Unlock()

	e.mu.Lock()
	if e.conn != nil && e.conn.Err() == nil {
		conn := e.conn
		e.mu.Unlock()
		cb(conn, nil)
		return
	}
	e.conn = nil
	if e.dialing {
		e.waiters = append(e.waiters, cb)
		e.mu.Unlock()
		return
	}
	if e.failErr != nil && time.Since(e.failedAt) < c.cfg.RedialInterval {
		err := e.failErr
		e.mu.Unlock()
		cb(nil, err)
		return
	}
	addr, err := c.cfg.Addr(key)
	if err != nil {
		e.mu.Unlock()
		cb(nil, err)
		return
	}
	e.dialing = true
	e.waiters = append(e.waiters, cb)
	e.mu.Unlock()
	go c.dial(key, e, addr)
}

// Each calls f for every live connection of the cache (not while holding
// its locks).
func (c *ConnCache[K]) Each(f func(key K, conn *Conn)) {
	type kc struct {
		k K
		c *Conn
	}
	type ke struct {
		k K
		e *cachedConn
	}
	var all []ke
	c.mu.Lock()
	for k, e := range c.entries {
		all = append(all, ke{k, e})
	}
	c.mu.Unlock()
	// Then each entry's lock alone (the lock order puts it before c.mu).
	var live []kc
	for _, x := range all {
		x.e.mu.Lock()
		if x.e.conn != nil && x.e.conn.Err() == nil {
			live = append(live, kc{x.k, x.e.conn})
		}
		x.e.mu.Unlock()
	}
	for _, x := range live {
		f(x.k, x.c)
	}
}

// Conn is Get for callers that may block: it returns the connection for key,
// or the error, or ctx's error if ctx ends first (the dial goes on, and a
// later call finds its connection).
func (c *ConnCache[K]) Conn(ctx context.Context, key K) (*Conn, error) {
	type result struct {
		conn *Conn
		err  error
	}
	ch := make(chan result, 1)
	c.Get(key, func(conn *Conn, err error) { ch <- result{conn, err} })
	select {
	case r := <-ch:
		return r.conn, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// dial is the short-lived goroutine that dials addr for e and hands the
// outcome to e's waiters.
func (c *ConnCache[K]) dial(key K, e *cachedConn, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.DialTimeout)
	conn, err := Dial(ctx, addr, c.cfg.Conn)
	cancel()
	if err == nil && c.cfg.Check != nil {
		if err = c.cfg.Check(key, conn); err != nil {
			conn.Close()
			conn = nil
		}
	}
	e.mu.Lock()
	// Under e.mu: a Close that has not reached e yet will find the connection.
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed && conn != nil {
		conn.Close()
		conn, err = nil, ErrCacheClosed
	}
	e.dialing = false
	if err != nil {
		e.failedAt, e.failErr = time.Now(), err
	} else {
		e.conn, e.failErr = conn, nil
	}
	ws := e.waiters
	e.waiters = nil
	e.mu.Unlock()
	for _, w := range ws {
		w(conn, err)
	}
}

// Close closes every connection; calls in flight on them fail, and every
// later Get fails with ErrCacheClosed. A dial in progress closes its
// connection when it finishes.
func (c *ConnCache[K]) Close() {
	c.mu.Lock()
	c.closed = true
	entries := c.entries
	c.entries = map[K]*cachedConn{}
	c.mu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		conn := e.conn
		e.conn = nil
		e.mu.Unlock()
		if conn != nil {
			conn.Close()
		}
	}
}
