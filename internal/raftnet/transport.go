package raftnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Transport limits.
const (
	// maxPeerQueue bounds the bytes of raft frames waiting for one peer; more
	// are dropped (raft resends).
	maxPeerQueue = 64 << 20
	// maxFrame is the largest OpRaft payload sent; a bigger batch is split.
	maxFrame = 16 << 20
	// redialBackoff is the pause after a failed dial before the next one.
	redialBackoff = 200 * time.Millisecond
	// snapFrameSize is the data payload of one OpSnapshot data frame.
	snapFrameSize = 1 << 20
)

// Errors of the transport.
var (
	// ErrUnknownPeer: no address is known for the destination chunkserver.
	ErrUnknownPeer = errors.New("raftnet: no address for peer")
	// ErrSnapshotRejected: the receiver refused or failed a snapshot transfer.
	ErrSnapshotRejected = errors.New("raftnet: snapshot transfer rejected by peer")
	// ErrSnapshotStalled: the receiver answered no frame of a snapshot
	// transfer for snapStallTimeout.
	ErrSnapshotStalled = errors.New("raftnet: snapshot transfer made no progress")
)

// snapStallTimeout bounds how long one frame of a snapshot transfer may wait
// for its answer (its bytes taken and acknowledged by the receiver) before
// the transfer is given up. Without it a follower whose disk hangs while
// staging (it stops reading; its raft heartbeats still flow) blocked the
// sender for ever, and with it the leader's log compaction, which keeps the
// log after a streamed index: the leader's WAL grew until ENOSPC. It bounds
// progress, not the whole transfer: a big snapshot over a slow link still
// finishes, as long as each ≤ 1 MiB frame is answered within it (so a
// --snapshot-rate below ~17 KiB/s cannot stream at all). A var for tests.
var snapStallTimeout = 60 * time.Second

// Config configures a Transport.
type Config struct {
	// Self is this chunkserver's id: the sender id of its frames, and the
	// only destination its Receiver accepts.
	Self   uint64
	Logger *slog.Logger // default slog.Default()
	// SnapshotRate bounds the snapshot bytes this chunkserver sends plus
	// receives per second (0: DefaultSnapshotRate; < 0: no limit).
	SnapshotRate int64
	// AlignSkip: how far into a large entry's data the bytes start that a
	// follower writes to disk (the chunkserver's proposal and command
	// headers). Frames ask their receiver to place that point on a 512-byte
	// boundary in memory (see alignHint).
	AlignSkip int
	// Security is how peers are dialed (transport.Security; ModeNone by
	// default). In a secure mode a peer must prove to be the chunkserver
	// dialed: a connection to an address now held by another is dropped.
	Security transport.Security
}

// Transport is the raftstore.Transport of a chunkserver: it sends raft
// messages to peers over one transport.Conn each and streams snapshots.
// Receiver is its inbound half.
//
// Goroutines: Send runs on raftstore workers and the WAL's committer and only
// encodes and queues; one sender goroutine per peer owns that peer's
// connection (dials, writes frames, redials after an error). SendSnapshot runs
// on a raftstore snapshot goroutine with a connection of its own.
type Transport struct {
	self      uint64
	alignSkip int
	log       *slog.Logger
	ctx       context.Context
	stop      context.CancelFunc
	wg        sync.WaitGroup

	mu     sync.Mutex
	closed bool
	peers  map[uint64]*peer

	// frameLimit is maxFrame (lowered by tests).
	frameLimit int

	// snapLimit bounds the bytes of the snapshot streams this chunkserver
	// sends and receives (shared with its Receiver); nil = no limit.
	snapLimit *rate.Limiter

	sec transport.Security
}

// New returns a Transport that knows no peers yet (SetPeers).
func New(cfg Config) *Transport {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	sec := cfg.Security
	if sec.Mode != transport.ModeNone {
		sec.Allow = []identity.Role{identity.RoleChunkserver}
	}
	return &Transport{self: cfg.Self, alignSkip: cfg.AlignSkip, log: cfg.Logger, ctx: ctx, stop: cancel, peers: make(map[uint64]*peer),
		frameLimit: maxFrame, snapLimit: newSnapshotLimiter(cfg.SnapshotRate), sec: sec}
}

// ErrWrongPeer: the server at a peer's address proved to be another
// chunkserver (or not one).
var ErrWrongPeer = errors.New("raftnet: peer address answered by another identity")

// dial connects to chunkserver id at addr; in a secure mode the server must
// prove to be that chunkserver.
func (t *Transport) dial(ctx context.Context, id uint64, addr string) (*transport.Conn, error) {
	c, err := transport.Dial(ctx, addr, transport.ConnConfig{Logger: t.log, Security: t.sec})
	if err != nil {
		return nil, err
	}
	if who, ok := c.Peer(); ok {
		if got, isCS := who.ChunkserverID(); !isCS || got != id {
			_ = c.Close()
			return nil, fmt.Errorf("%w: %s is %s, not chunkserver %d", ErrWrongPeer, addr, who, id)
		}
	}
	return c, nil
}

// peer is one destination chunkserver.
type peer struct {
	id   uint64
	wake chan struct{} // cap 1: the sender has work

	mu      sync.Mutex // guards the fields below
	addr    string
	pending []frame // OpRaft payloads, in order
	// pendingBytes is the payload bytes held by pending, bounded by maxPeerQueue.
	pendingBytes int
	dropped      int // frames dropped since the last log line
	// conn, once the sender connected and drained pending, is where Send
	// queues frames itself (transport.Conn.SendAsync) — no hand-off to the
	// sender goroutine on the raft path. nil: Send queues to pending and
	// wakes the sender (dialing, a dead connection, an address change).
	// Lock order: peer.mu before the Conn's own lock.
	conn *transport.Conn
}

// frame is one OpRaft payload, in pieces (entry data is not copied).
type frame struct {
	pieces [][]byte
	size   int
	hint   uint64 // the header's Offset: alignHint
}

// alignHint is an OpRaft frame header's Offset: 0, or 1 + the payload offset
// the receiver should place on a dataAlign boundary in memory (AllocPayload).
// It points alignSkip bytes into the frame's first large entry data (the
// chunkserver's proposal header), so that the write's data lands where a
// follower can write it with O_DIRECT without copying it. Receivers that
// predate it ignore it.
func (t *Transport) alignHint(f *frameBuilder) uint64 {
	if f.alignAt == 0 {
		return 0
	}
	return uint64(f.alignAt + t.alignSkip)
}

// dataAlign is the memory alignment alignHint asks for (O_DIRECT's).
const dataAlign = 512

// SetPeers makes addrs (chunkserver id → data-plane address) current. Peers
// are never forgotten (a peer missing from one heartbeat response is likely
// still a member somewhere); an address change takes effect at the next dial.
func (t *Transport) SetPeers(addrs map[uint64]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	for id, addr := range addrs {
		if id == t.self || id == 0 || addr == "" {
			continue
		}
		p := t.peers[id]
		if p == nil {
			p = &peer{id: id, wake: make(chan struct{}, 1), addr: addr}
			t.peers[id] = p
			t.wg.Add(1)
			go t.runPeer(p)
			continue
		}
		p.mu.Lock()
		if p.addr != addr {
			p.conn = nil // the sender redials at its next wake-up
		}
		p.addr = addr
		p.mu.Unlock()
	}
}

func (t *Transport) peerOf(id uint64) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peers[id]
}

// Addr returns the data-plane address known for chunkserver id ("" if none).
func (t *Transport) Addr(id uint64) string {
	if p := t.peerOf(id); p != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.addr
	}
	return ""
}

// Send queues msgs for their peers and returns at once (raftstore.Transport).
// Messages to one peer given in one Send leave in one OpRaft frame (split at
// maxFrame). Entry data is not copied: each large entry's data is a piece
// of the frame's payload, written from the entry itself (raft never changes
// an entry). With a live connection the frame goes straight to its writer;
// otherwise it waits in pending for the sender goroutine.
func (t *Transport) Send(msgs []raftstore.Message) {
	type building struct {
		p *peer
		f frameBuilder
	}
	var arr [8]building
	frames := arr[:0]
	var last *peer
	for _, m := range msgs {
		to := m.Msg.GetTo()
		p := last
		if p == nil || p.id != to {
			p = t.peerOf(to)
		}
		if p == nil {
			t.log.Debug("raft message to unknown peer dropped", "peer", to, "copyset", m.Group)
			continue
		}
		last = p
		r := newRecord(m)
		fi := len(frames) - 1
		for fi >= 0 && frames[fi].p != p {
			fi--
		}
		if fi < 0 || (frames[fi].f.size > 0 && frames[fi].f.size+r.size > t.frameLimit) {
			frames = append(frames, building{p: p})
			fi = len(frames) - 1
		}
		if err := frames[fi].f.add(&r); err != nil {
			t.log.Error("cannot encode raft message", "copyset", m.Group, "err", err)
		}
	}
	h := api.Header{Op: api.OpRaft, Length: BatchVersion, Hint: t.self}
	for i := range frames {
		p := frames[i].p
		if p == nil {
			continue // sent with an earlier frame of its peer
		}
		p.mu.Lock()
		c := p.conn
		direct := c != nil && len(p.pending) == 0 && c.Err() == nil
		if !direct {
			p.conn = nil
		}
		// All of p's frames under one p.mu, so concurrent Sends keep their order.
		for j := i; j < len(frames); j++ {
			b := &frames[j]
			if b.p != p {
				continue
			}
			b.p = nil
			f := frame{pieces: b.f.pieces(), size: b.f.size, hint: t.alignHint(&b.f)}
			switch {
			case f.size == 0:
			case direct:
				h.Offset = f.hint
				c.SendAsync(h, f.pieces, nil)
			case p.pendingBytes >= maxPeerQueue:
				p.dropped++
			default:
				p.pending = append(p.pending, f)
				p.pendingBytes += f.size
			}
		}
		p.mu.Unlock()
		if !direct {
			select {
			case p.wake <- struct{}{}:
			default:
			}
		}
	}
}

// runPeer is the sender goroutine of p: it owns p's connection.
func (t *Transport) runPeer(p *peer) {
	defer t.wg.Done()
	var conn *transport.Conn
	var connAddr string
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	var nextDial time.Time
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		batch, addr, dropped := p.pending, p.addr, p.dropped
		p.pending, p.pendingBytes, p.dropped = nil, 0, 0
		p.mu.Unlock()
		if dropped > 0 {
			t.log.Debug("raft messages dropped: queue full", "peer", p.id, "frames", dropped)
		}
		if conn != nil && (conn.Err() != nil || connAddr != addr) {
			_ = conn.Close()
			conn = nil
		}
		if conn == nil && time.Now().Before(nextDial) {
			continue // unreachable: drop, raft retries
		}
		if conn == nil {
			ctx, cancel := context.WithTimeout(t.ctx, time.Second)
			c, err := t.dial(ctx, p.id, addr)
			cancel()
			if err != nil {
				nextDial = time.Now().Add(redialBackoff)
				t.log.Debug("peer unreachable", "peer", p.id, "addr", addr, "err", err)
				continue
			}
			conn, connAddr = c, addr
		}
		// Queued, not waited for: the writer sends the backlog in one writev; a
		// failed write kills conn, which Send and the next round notice.
		h := api.Header{Op: api.OpRaft, Length: BatchVersion, Hint: t.self}
		for _, f := range batch {
			h.Offset = f.hint
			conn.SendAsync(h, f.pieces, nil)
		}
		// Drained: later Sends write through the connection themselves, unless
		// more arrived meanwhile (then go round again) or the address changed.
		p.mu.Lock()
		switch {
		case len(p.pending) > 0:
			select {
			case p.wake <- struct{}{}:
			default:
			}
		case p.addr == connAddr:
			p.conn = conn
		}
		p.mu.Unlock()
	}
}

// Snapshot transfer frame kinds, carried in Header.Length of OpSnapshot frames.
const (
	snapBegin = 1
	snapData  = 2
	snapEnd   = 3
)

// SendSnapshot streams m (a MsgSnap) and the data write produces to m.Msg.To
// over a dedicated connection, and returns once the receiver staged it
// (raftstore.Transport).
func (t *Transport) SendSnapshot(m raftstore.Message, write func(io.Writer) error) error {
	to := m.Msg.GetTo()
	addr := t.Addr(to)
	if addr == "" {
		return fmt.Errorf("%w: %d", ErrUnknownPeer, to)
	}
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := t.dial(dctx, to, addr)
	dcancel()
	if err != nil {
		return err
	}
	defer conn.Close()
	sw := &snapWriter{ctx: ctx, conn: conn, id: rand.Uint64() | 1, from: t.self, limit: t.snapLimit}
	begin, err := appendRecord(nil, m)
	if err != nil {
		return err
	}
	if err := sw.frame(snapBegin, begin); err != nil {
		return err
	}
	if err := write(sw); err != nil {
		return err
	}
	if err := sw.flush(); err != nil {
		return err
	}
	return sw.frame(snapEnd, nil)
}

// snapWriter cuts a snapshot stream into OpSnapshot data frames.
type snapWriter struct {
	ctx  context.Context
	conn *transport.Conn
	id   uint64
	from uint64
	seq  uint64
	buf  []byte
	// limit is the chunkserver's snapshot bandwidth (nil: none): each data
	// frame waits for its bytes before it is sent.
	limit *rate.Limiter
}

func (w *snapWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), snapFrameSize-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == snapFrameSize {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *snapWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	if err := waitSnapshot(w.ctx, w.limit, len(w.buf)); err != nil {
		return err
	}
	err := w.frame(snapData, w.buf)
	w.buf = w.buf[:0]
	return err
}

// frame sends one frame and waits for its answer, snapStallTimeout at most.
func (w *snapWriter) frame(kind uint32, payload []byte) error {
	call := &transport.Call{
		Header:  api.Header{Op: api.OpSnapshot, Volume: w.id, Offset: w.seq, Length: kind, Hint: w.from},
		Payload: payload,
	}
	w.seq++
	ctx, cancel := context.WithTimeoutCause(w.ctx, snapStallTimeout, ErrSnapshotStalled)
	defer cancel()
	// Do returns once the Conn let go of the payload: a frame stuck in a
	// write to a peer that stopped reading ends the connection
	// (transport.Conn.Abort), and SendSnapshot closes it anyway.
	if err := w.conn.Do(ctx, call); err != nil {
		if context.Cause(ctx) == ErrSnapshotStalled {
			return fmt.Errorf("%w for %v (frame %d): %w", ErrSnapshotStalled, snapStallTimeout, w.seq-1, err)
		}
		return err
	}
	switch call.Reply.Status {
	case api.StatusOK:
		return nil
	case api.StatusBusy:
		return fmt.Errorf("%w: %w", ErrSnapshotRejected, raftstore.ErrPeerBusy)
	}
	return fmt.Errorf("%w: %v", ErrSnapshotRejected, call.Reply.Status)
}

// Close stops every sender goroutine and closes their connections.
func (t *Transport) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.stop()
	t.wg.Wait()
}
