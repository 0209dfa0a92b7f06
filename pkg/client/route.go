package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// minRefreshInterval rate-limits GetCopysets calls of one volume.
const minRefreshInterval = 200 * time.Millisecond

// redialInterval: after a failed dial, a chunkserver is not dialed again for this
// long; pieces asking meanwhile get the dial error at once and try another member.
const redialInterval = 50 * time.Millisecond

// newConnCache returns the volume's connections: one per chunkserver, dialled
// (within IOTimeout) at the address the MDS gave for its id.
func newConnCache(v *Volume) *transport.ConnCache[uint64] {
	return transport.NewConnCache(transport.ConnCacheConfig[uint64]{
		Addr: func(id uint64) (string, error) {
			if addr := v.routes.addr(id); addr != "" {
				return addr, nil
			}
			return "", errNoAddress
		},
		Conn:           transport.ConnConfig{Logger: v.log, Security: dataSecurity(v.cfg)},
		DialTimeout:    v.cfg.IOTimeout,
		RedialInterval: redialInterval,
		Check: func(id uint64, c *transport.Conn) error {
			if err := checkChunkserver(id, c); err != nil {
				return err
			}
			return v.attach(c)
		},
	})
}

// errAttach: a chunkserver refused the session's capability (DENIED), or
// cannot check it yet (BUSY: it has not heard the MDS's keys).
var errAttach = errors.New("client: chunkserver refused the session's capability")

// attach attaches the session's capability to a new connection (OpAttach),
// before any IO goes on it: a chunkserver of an authenticated cluster
// serves the volume's IO only under it.
func (v *Volume) attach(c *transport.Conn) error {
	tok := v.capToken.Load()
	if tok == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), v.cfg.IOTimeout)
	defer cancel()
	call := &transport.Call{Header: api.Header{Op: api.OpAttach, Volume: v.id}, Payload: *tok}
	if err := c.Do(ctx, call); err != nil {
		return err
	}
	if st := call.Reply.Status; st != api.StatusOK {
		return fmt.Errorf("%w: %w", errAttach, api.StatusError(st, 0))
	}
	return nil
}

// reattach attaches the renewed capability to every open connection, in the
// background; a connection that refuses it is closed (the next IO redials
// and attaches again).
func (v *Volume) reattach() {
	tok := v.capToken.Load()
	if tok == nil {
		return
	}
	v.conns.Each(func(id uint64, c *transport.Conn) {
		call := &transport.Call{Header: api.Header{Op: api.OpAttach, Volume: v.id}, Payload: *tok}
		c.Go(call, func(call *transport.Call) {
			if call.Err == nil && call.Reply.Status != api.StatusOK {
				v.log.Warn("client: chunkserver refused the renewed capability; reconnecting", "chunkserver", id,
					"status", call.Reply.Status.String())
				_ = c.Close()
			}
		})
	})
}

// dataSecurity is how the client connects to chunkservers (Config.DataTLS,
// Config.DataEncrypted).
func dataSecurity(cfg Config) transport.Security {
	switch {
	case cfg.DataTLS == nil:
		return transport.Security{}
	case cfg.DataEncrypted:
		return transport.Security{Mode: transport.ModeEncrypted, ClientTLS: cfg.DataTLS}
	}
	return transport.Security{Mode: transport.ModeAuthenticated, ClientTLS: cfg.DataTLS}
}

// errWrongChunkserver: the server at a chunkserver's address proved to be
// another one (an address reused, or a stale route).
var errWrongChunkserver = errors.New("client: address answered by another chunkserver")

// checkChunkserver refuses a connection whose server proved to be another
// chunkserver than id.
func checkChunkserver(id uint64, c *transport.Conn) error {
	who, ok := c.Peer()
	if !ok {
		return nil
	}
	if got, isCS := who.ChunkserverID(); !isCS || got != id {
		return fmt.Errorf("%w: %s, not chunkserver %d", errWrongChunkserver, who, id)
	}
	return nil
}

// copysetRoute is what the client knows of one copyset.
type copysetRoute struct {
	members []uint64      // chunkserver ids, as the MDS last said; never empty for a usable copyset
	leader  atomic.Uint64 // cached leader; 0 = unknown (try members in order)
}

// routeTable maps copyset ids to members and chunkserver ids to addresses. A
// refresh replaces the maps wholesale; readers keep the snapshot they took.
type routeTable struct {
	v    *Volume
	pool uint32

	mu        sync.RWMutex
	copysets  map[uint32]*copysetRoute
	addrs     map[uint64]string
	refreshed time.Time // last successful or attempted refresh

	refreshMu  sync.Mutex
	refreshing bool
	waiters    []func()
}

func (t *routeTable) init(v *Volume, pool uint32, css []*api.Copyset, servers []*api.ChunkServer) {
	t.v, t.pool = v, pool
	t.install(css, servers)
}

// install replaces the tables, keeping cached leaders that are still members when
// the MDS has no hint.
func (t *routeTable) install(css []*api.Copyset, servers []*api.ChunkServer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.copysets
	t.copysets = make(map[uint32]*copysetRoute, len(css))
	for _, cs := range css {
		if cs.GetPoolId() != t.pool && cs.GetPoolId() != 0 {
			continue
		}
		r := &copysetRoute{members: append([]uint64(nil), cs.GetMembers()...)}
		leader := cs.GetLeaderHint()
		if o := old[cs.GetId()]; leader == 0 && o != nil {
			leader = o.leader.Load()
		}
		if leader != 0 && r.isMember(leader) {
			r.leader.Store(leader)
		}
		t.copysets[cs.GetId()] = r
	}
	if t.addrs == nil {
		t.addrs = make(map[uint64]string, len(servers))
	}
	for _, s := range servers {
		t.addrs[s.GetId()] = s.GetAddr()
	}
}

func (r *copysetRoute) isMember(id uint64) bool {
	for _, m := range r.members {
		if m == id {
			return true
		}
	}
	return false
}

// first is the member to try first: the cached leader, else the first member.
func (r *copysetRoute) first() uint64 {
	if l := r.leader.Load(); l != 0 {
		return l
	}
	return r.members[0]
}

// next is the member after id (wrapping); the first member if id is not one.
func (r *copysetRoute) next(id uint64) uint64 {
	for i, m := range r.members {
		if m == id {
			return r.members[(i+1)%len(r.members)]
		}
	}
	return r.members[0]
}

func (t *routeTable) copyset(id uint32) *copysetRoute {
	t.mu.RLock()
	defer t.mu.RUnlock()
	r := t.copysets[id]
	if r == nil || len(r.members) == 0 {
		return nil
	}
	return r
}

func (t *routeTable) addr(id uint64) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.addrs[id]
}

// refresh asks the MDS for the pool's copysets (one call at a time, at most one
// per minRefreshInterval) and runs then once the tables were replaced or the call
// failed. then runs on the refreshing goroutine or a timer's.
func (t *routeTable) refresh(then func()) {
	t.refreshMu.Lock()
	t.waiters = append(t.waiters, then)
	if t.refreshing {
		t.refreshMu.Unlock()
		return
	}
	t.refreshing = true
	t.mu.RLock()
	wait := minRefreshInterval - time.Since(t.refreshed)
	t.mu.RUnlock()
	t.refreshMu.Unlock()
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), t.v.cfg.IOTimeout)
		resp, err := t.v.mds.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: t.pool})
		cancel()
		if err != nil {
			t.v.log.Warn("client: copyset refresh failed", "pool", t.pool, "err", err)
			t.mu.Lock()
			t.refreshed = time.Now()
			t.mu.Unlock()
		} else {
			t.install(resp.GetCopysets(), resp.GetChunkservers())
			t.mu.Lock()
			t.refreshed = time.Now()
			t.mu.Unlock()
			t.v.log.Debug("client: copysets refreshed", "pool", t.pool, "copysets", len(resp.GetCopysets()))
		}
		t.refreshMu.Lock()
		ws := t.waiters
		t.waiters = nil
		t.refreshing = false
		t.refreshMu.Unlock()
		for _, w := range ws {
			w()
		}
	}
	if wait > 0 {
		time.AfterFunc(wait, run)
	} else {
		go run()
	}
}

// errNoAddress: the MDS gave no address for a chunkserver id (a redirect to a
// server the client has not heard of yet).
var errNoAddress = errors.New("client: chunkserver address unknown")
