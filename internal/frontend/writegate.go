package frontend

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// MayWriteFunc says whether the host host (an NVMe host NQN, an iSCSI
// initiator name) may write volume: take its writer role. Package access
// answers from the volume's attachments in the MDS.
type MayWriteFunc func(ctx context.Context, volume, host string) (bool, error)

// WriteGate keeps one host's answer of a MayWriteFunc for one volume (an
// NVMe/TCP controller's namespace, an iSCSI session's LU). The first write
// waits for an answer (Allow blocks, so the caller's next commands wait
// too); after that Allow answers at once with the last answer, and once it
// is TTL old asks again in the background, so a slow or failing-over MDS
// never holds IO. A host that reconnects gets a new gate, which asks
// afresh. A failed ask keeps the last answer (and asks again a TTL later);
// with none yet, Allow returns the error and the caller answers "not ready,
// retry".
type WriteGate struct {
	ask     MayWriteFunc
	volume  string
	host    string
	ttl     time.Duration
	timeout time.Duration // bounds one ask
	log     *slog.Logger  // with the protocol's fields

	mu     sync.Mutex // serializes the first ask
	ok     bool
	asked  time.Time // zero: no answer yet
	asking bool      // a fresh answer is being asked for in the background
}

// NewWriteGate returns the gate of host writing volume through ask; each ask
// is bounded by timeout. nil ask: every write is allowed.
func NewWriteGate(ask MayWriteFunc, volume, host string, ttl, timeout time.Duration, log *slog.Logger) *WriteGate {
	return &WriteGate{ask: ask, volume: volume, host: host, ttl: ttl, timeout: timeout, log: log}
}

// Allow reports whether a write may go on; err is set only when there is no
// answer yet and asking failed.
func (g *WriteGate) Allow() (bool, error) {
	if g == nil || g.ask == nil {
		return true, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.asked.IsZero(): // no answer yet: this write waits for one (holding mu, so others wait too)
		ok, err := g.askNow()
		if err != nil {
			g.log.Warn("cannot tell whether the host may write", "volume", g.volume, "host", g.host, "err", err)
			return false, err
		}
		g.record(ok)
	case time.Since(g.asked) >= g.ttl && !g.asking:
		g.asking = true
		go func() {
			ok, err := g.askNow()
			g.mu.Lock()
			defer g.mu.Unlock()
			g.asking = false
			if err != nil {
				g.asked = time.Now() // ask again in a TTL
				g.log.Warn("cannot tell whether the host may write; keeping the last answer", "volume", g.volume,
					"host", g.host, "may_write", g.ok, "err", err)
				return
			}
			g.record(ok)
		}()
	}
	return g.ok, nil
}

func (g *WriteGate) askNow() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	return g.ask(ctx, g.volume, g.host)
}

// record keeps an answer. Caller holds mu.
func (g *WriteGate) record(ok bool) {
	if !ok && (g.ok || g.asked.IsZero()) {
		g.log.Warn("the host may not write the volume: its attachment names another host", "volume", g.volume, "host", g.host)
	}
	g.ok, g.asked = ok, time.Now()
}
