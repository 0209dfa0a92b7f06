package reservation

import (
	"context"
	"sync"
	"time"
)

// Store keeps the reservation state of every volume. The MDS's (through
// pkg/mdsclient) is the one that holds across access nodes and MDS
// failover; MemStore is one process's.
type Store interface {
	// Read returns volume's state (never nil).
	Read(ctx context.Context, volume string) (*State, error)
	// Apply runs a on volume's state atomically (Apply, serialized with
	// every other Apply on the volume) and returns the state after it, or
	// the *Error that refused it.
	Apply(ctx context.Context, volume string, from Nexus, a Action) (*State, error)
}

// MemStore is a Store in memory, for one process (tests, a single access
// node's conformance runs).
type MemStore struct {
	mu   sync.Mutex
	vols map[string]*State
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{vols: map[string]*State{}} }

func (m *MemStore) Read(_ context.Context, volume string) (*State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.vols[volume]; s != nil {
		return s, nil
	}
	return &State{}, nil
}

func (m *MemStore) Apply(_ context.Context, volume string, from Nexus, a Action) (*State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := Apply(m.vols[volume], from, a)
	if err != nil {
		return nil, err
	}
	m.vols[volume] = n
	return n, nil
}

// Cached is a Store in front of a remote one (the MDS's) for the IO path:
// State answers from a copy at most TTL old (read again when older), and
// Apply returns only once TTL has passed since it committed, so every other
// access node's copy predates it by at most TTL and has expired: a
// reservation made through one access node is enforced on all of them
// before the PERSISTENT RESERVE OUT that made it completes (for commands
// that start after that; commands already checked finish).
type Cached struct {
	Store Store
	TTL   time.Duration

	mu   sync.Mutex
	vols map[string]*cachedVol
}

type cachedVol struct {
	mu    sync.Mutex // held while reading the state again: one read at a time
	state *State
	// asked is when the read that returned state was sent: the copy is
	// used until asked+TTL (the MDS may have answered late).
	asked time.Time
}

// NewCached returns a Cached over store.
func NewCached(store Store, ttl time.Duration) *Cached {
	return &Cached{Store: store, TTL: ttl, vols: map[string]*cachedVol{}}
}

func (c *Cached) vol(volume string) *cachedVol {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.vols[volume]
	if v == nil {
		v = &cachedVol{}
		c.vols[volume] = v
	}
	return v
}

// FreshReader is a Store that can answer from a copy without a round trip
// (and without the caller making a context for one): Cached.
type FreshReader interface {
	// Fresh returns volume's state if a copy young enough is at hand, and
	// when that copy expires: until then a change made through another
	// access node has not completed (its PERSISTENT RESERVE OUT waits that
	// long), after it one may have.
	Fresh(volume string) (st *State, expires time.Time, ok bool)
}

// Fresh returns volume's state if this process's copy is at most TTL old.
func (c *Cached) Fresh(volume string) (*State, time.Time, bool) {
	v := c.vol(volume)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state != nil && time.Since(v.asked) < c.TTL {
		return v.state, v.asked.Add(c.TTL), true
	}
	return nil, time.Time{}, false
}

// Read returns volume's state from a copy at most TTL old.
func (c *Cached) Read(ctx context.Context, volume string) (*State, error) {
	v := c.vol(volume)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state != nil && time.Since(v.asked) < c.TTL {
		return v.state, nil
	}
	asked := time.Now()
	s, err := c.Store.Read(ctx, volume)
	if err != nil {
		return nil, err
	}
	v.state, v.asked = s, asked
	return s, nil
}

// Apply applies a through the store, keeps the result as this process's
// copy, and waits out TTL from the commit (see Cached).
func (c *Cached) Apply(ctx context.Context, volume string, from Nexus, a Action) (*State, error) {
	sent := time.Now()
	s, err := c.Store.Apply(ctx, volume, from, a)
	if err != nil {
		return nil, err
	}
	v := c.vol(volume)
	v.mu.Lock()
	if v.state == nil || v.state.Seq <= s.Seq {
		v.state, v.asked = s, sent
	}
	v.mu.Unlock()
	// The commit happened after sent; other copies were asked for before
	// it. Waiting TTL from now (after the commit) outlasts them all; even
	// when ctx ends first, as the change is made: its caller would report
	// it complete while another node still enforces the old state.
	time.Sleep(c.TTL)
	return s, nil
}
