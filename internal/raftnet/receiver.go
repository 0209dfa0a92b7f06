package raftnet

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/time/rate"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// snapIdleTimeout ends a snapshot transfer whose sender went silent.
var snapIdleTimeout = 30 * time.Second // a variable for tests

// aliasMinFrame: an OpRaft payload this large is read into a buffer of its
// own that its entries keep (their data is not copied out); smaller ones use
// the transport's pooled buffers and their data is copied.
const aliasMinFrame = 64 << 10

// errReceiverDone is what a data frame's write sees when the receiver
// returned before the end frame (it read less than was sent).
var errReceiverDone = errors.New("raftnet: snapshot receiver already returned")

// errSnapshotAbandoned ends a receive whose sender went silent or disconnected.
var errSnapshotAbandoned = errors.New("raftnet: snapshot transfer abandoned by sender")

// Host is where a Receiver delivers what peers send (*raftstore.Host).
type Host interface {
	Step(msgs []raftstore.Message)
	ReceiveSnapshot(m raftstore.Message, r io.Reader) error
}

// Receiver serves a chunkserver's inbound peer traffic, the OpRaft and
// OpSnapshot frames its transport.Server reads: it steps raft messages into
// the Host and feeds each snapshot transfer's data frames through a pipe to
// Host.ReceiveSnapshot, which runs on a goroutine of its own.
//
// Goroutines: frames arrive on connection reader goroutines (a transfer uses
// one connection, so its frames arrive in order on one goroutine); each
// transfer has one receive goroutine; an idle timer may abandon it.
type Receiver struct {
	self uint64
	log  *slog.Logger
	host Host
	// limit bounds the snapshot bytes received (shared with the Transport: in
	// plus out); nil = no limit. A data frame waits for its bytes before it
	// is handed on, holding the connection's reader: the sender, which waits
	// for each frame's answer, slows down with it.
	limit *rate.Limiter

	mu       sync.Mutex
	sessions map[uint64]*snapSession // by transfer id
	// receiving counts the receive goroutines still running per group: a
	// transfer abandoned leaves the map at once, its goroutine a moment later.
	receiving map[uint64]int
	closed    bool           // Close was called: no new transfers
	lastBad   time.Time      // last "bad frame" log line
	wg        sync.WaitGroup // receive goroutines; Add under mu, while !closed
}

// Snapshot transfers under way at once, at most: in all, and from one
// sender (one per group besides). More are answered BUSY; raft retries.
const (
	maxSnapSessions          = 64
	maxSnapSessionsPerSender = 16
)

type snapSession struct {
	id    uint64
	from  uint64                // the sender's id (0 on an unauthenticated data plane)
	owner transport.ReplyWriter // the connection that began it
	group uint64
	index uint64 // the snapshot's index
	term  uint64 // the term of the leader that sends it
	next  uint64 // sequence number of the next frame
	pw    *io.PipeWriter
	res   chan error    // receive result, buffered
	gone  chan struct{} // closed when the transfer is dropped
	timer *time.Timer
}

// Receiver returns the inbound half of t, delivering to host. It shares t's
// snapshot bandwidth limit.
func (t *Transport) Receiver(host Host) *Receiver {
	return &Receiver{self: t.self, log: t.log, host: host, limit: t.snapLimit,
		sessions: make(map[uint64]*snapSession), receiving: make(map[uint64]int)}
}

// AllocPayload gives large OpRaft payloads a buffer of their own, which the
// decoded entries keep (transport.PayloadAllocator). The payload starts so
// far into it that the offset the frame's header hints at (alignHint) is
// dataAlign-aligned in memory: a buffer this large is a page-aligned
// allocation of its own.
func (s *Receiver) AllocPayload(h api.Header, n int) (*[]byte, int) {
	if h.Op != api.OpRaft || n < aliasMinFrame {
		return nil, 0
	}
	pad := 0
	if h.Offset > 0 && h.Offset <= uint64(n) {
		pad = int(-(h.Offset - 1) & (dataAlign - 1))
	}
	b := make([]byte, pad+n)
	return &b, pad
}

// ServeFrame handles an OpRaft or OpSnapshot frame (transport.Handler).
func (s *Receiver) ServeFrame(rw transport.ReplyWriter, h api.Header, payload []byte) {
	switch h.Op {
	case api.OpRaft:
		s.serveRaft(rw, h, payload)
	case api.OpSnapshot:
		s.serveSnapshot(rw, h, payload)
	default:
		h.Status = api.StatusBadRequest
		rw.Reply(h, nil, nil)
	}
}

// serveRaft steps an OpRaft frame's messages into the host. Messages not
// addressed to this chunkserver, and MsgSnap (valid only with its data,
// through a snapshot transfer), are dropped.
func (s *Receiver) serveRaft(rw transport.ReplyWriter, h api.Header, payload []byte) {
	if h.Length != BatchVersion {
		s.logBad("raft frame of another batch format dropped; upgrade the chunkservers to one version",
			"from", h.Hint, "format", h.Length, "want", BatchVersion)
		return
	}
	alias := len(payload) >= aliasMinFrame
	if alias {
		rw.Retain() // the entries' data stay in payload
	}
	from, ok := s.sender(rw, h)
	if !ok {
		return
	}
	msgs, err := decodeBatch(payload, alias)
	if err != nil {
		s.logBad("bad raft frame dropped", "from", h.Hint, "err", err)
		return
	}
	keep := msgs[:0]
	for _, m := range msgs {
		if m.Msg.GetTo() == s.self && m.Msg.GetType() != raftpb.MsgSnap && (from == 0 || m.Msg.GetFrom() == from) {
			keep = append(keep, m)
		} else if from != 0 && m.Msg.GetFrom() != from {
			s.logBad("raft message speaking for another chunkserver dropped", "peer", from, "from", m.Msg.GetFrom(), "copyset", m.Group)
		}
	}
	s.host.Step(keep)
}

// sender returns the chunkserver id rw's connection authenticated as (0 on
// an unauthenticated server: ModeNone), and false — logged — when the peer
// is no chunkserver or its frame's Hint claims another id. A chunkserver
// speaks only for itself: every message it sends has From equal to its id.
func (s *Receiver) sender(rw transport.ReplyWriter, h api.Header) (uint64, bool) {
	who, ok := transport.PeerOf(rw)
	if !ok {
		return 0, true
	}
	id, isCS := who.ChunkserverID()
	if !isCS || id != h.Hint || id == 0 {
		s.logBad("peer frame refused: the connection's identity is not the chunkserver it claims",
			"peer", who.String(), "claims", h.Hint, "op", h.Op.String())
		return 0, false
	}
	return id, true
}

// logBad logs a dropped frame, at most once every 10 s.
func (s *Receiver) logBad(msg string, args ...any) {
	s.mu.Lock()
	now := time.Now()
	quiet := now.Sub(s.lastBad) < 10*time.Second
	if !quiet {
		s.lastBad = now
	}
	s.mu.Unlock()
	if !quiet {
		s.log.Warn(msg, args...)
	}
}

func (s *Receiver) serveSnapshot(rw transport.ReplyWriter, h api.Header, payload []byte) {
	reply := func(st api.Status) {
		h.Status = st
		rw.Reply(h, nil, nil)
	}
	s.mu.Lock()
	ss := s.sessions[h.Volume]
	s.mu.Unlock()
	if ss != nil && ss.owner != rw {
		// Frames of a transfer come on the connection that began it only.
		reply(api.StatusBadRequest)
		return
	}
	switch h.Length {
	case snapBegin:
		if ss != nil || h.Offset != 0 {
			reply(api.StatusBadRequest)
			return
		}
		from, ok := s.sender(rw, h)
		if !ok {
			reply(api.StatusDenied)
			return
		}
		msgs, err := decodeBatch(payload, false)
		if err != nil || len(msgs) != 1 || msgs[0].Msg.GetType() != raftpb.MsgSnap ||
			msgs[0].Msg.GetTo() != s.self || msgs[0].Msg.GetSnapshot() == nil ||
			(from != 0 && msgs[0].Msg.GetFrom() != from) {
			reply(api.StatusBadRequest)
			return
		}
		pr, pw := io.Pipe()
		ss = &snapSession{id: h.Volume, from: from, owner: rw, group: msgs[0].Group, next: 1, pw: pw, res: make(chan error, 1), gone: make(chan struct{}),
			index: msgs[0].Msg.GetSnapshot().GetMetadata().GetIndex(), term: msgs[0].Msg.GetTerm()}
		ss.timer = time.AfterFunc(snapIdleTimeout, func() { s.abandon(ss) })
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			ss.timer.Stop()
			reply(api.StatusIOError)
			return
		}
		if other := s.groupSession(ss.group); other != nil || s.receiving[ss.group] > 0 {
			// One stream per group: two would stage two snapshots of one copyset
			// at once. The sender reports the failure to raft, which retries
			// once the stream under way ended (installed or failed). A stream
			// from a former leader is ended now: raft here would drop its
			// snapshot for its older term once it were in, and the new
			// leader's stream would wait for it (a throttled one: a minute).
			superseded := other != nil && ss.term > other.term
			s.mu.Unlock()
			ss.timer.Stop()
			if superseded {
				s.log.Info("snapshot stream from a former leader ended: the copyset's new leader sends its own",
					"copyset", ss.group, "from", other.from, "term", other.term, "new_leader", h.Hint, "new_term", ss.term)
				s.abandon(other)
			} else {
				s.log.Info("snapshot stream refused: another one for the copyset is under way",
					"copyset", ss.group, "from", h.Hint, "index", ss.index)
			}
			reply(api.StatusBusy)
			return
		}
		if n, mine := s.counts(from); n >= maxSnapSessions || mine >= maxSnapSessionsPerSender {
			s.mu.Unlock()
			ss.timer.Stop()
			s.logBad("snapshot stream refused: too many under way", "from", from, "copyset", ss.group,
				"in_all", n, "from_sender", mine)
			reply(api.StatusBusy)
			return
		}
		s.sessions[ss.id] = ss
		s.wg.Add(1)
		if cd, ok := rw.(transport.ConnDone); ok {
			// A sender whose connection went (it crashed mid-stream) sends
			// nothing more: end the transfer now, not after snapIdleTimeout,
			// so that the copyset's next leader can stream its snapshot.
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				select {
				case <-cd.Done():
					s.abandon(ss)
				case <-ss.gone:
				}
			}()
		}
		s.receiving[ss.group]++
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				if s.receiving[ss.group]--; s.receiving[ss.group] == 0 {
					delete(s.receiving, ss.group)
				}
				s.mu.Unlock()
			}()
			err := s.host.ReceiveSnapshot(msgs[0], pr)
			if err != nil && !errors.Is(err, errSnapshotAbandoned) {
				// Logged here: the sender may learn of it from a data
				// frame's answer and never send the end frame.
				s.log.Warn("snapshot receive failed", "copyset", ss.group, "from", from, "err", err)
			}
			// Unblock a data frame still writing: the receiver is done with
			// the stream, for better or worse.
			if err != nil {
				pr.CloseWithError(err)
			} else {
				pr.CloseWithError(errReceiverDone)
			}
			ss.res <- err
		}()
		reply(api.StatusOK)
	case snapData, snapEnd:
		if ss == nil || h.Offset != ss.next {
			if ss != nil {
				s.abandon(ss)
			}
			reply(api.StatusBadRequest)
			return
		}
		ss.next++
		ss.timer.Reset(snapIdleTimeout)
		if h.Length == snapData {
			_ = waitSnapshot(context.Background(), s.limit, len(payload))
			if _, err := ss.pw.Write(payload); err != nil {
				s.abandon(ss)
				reply(api.StatusIOError)
			} else {
				reply(api.StatusOK)
			}
			return
		}
		_ = ss.pw.Close()
		err := <-ss.res
		s.drop(ss)
		if err != nil {
			reply(api.StatusIOError)
			return
		}
		reply(api.StatusOK)
	default:
		reply(api.StatusBadRequest)
	}
}

// counts returns the transfers under way, in all and from sender. Caller
// holds s.mu.
func (s *Receiver) counts(sender uint64) (all, from int) {
	for _, ss := range s.sessions {
		if ss.from == sender {
			from++
		}
	}
	return len(s.sessions), from
}

// groupSession returns the transfer under way for group, or nil. Caller holds s.mu.
func (s *Receiver) groupSession(group uint64) *snapSession {
	for _, ss := range s.sessions {
		if ss.group == group {
			return ss
		}
	}
	return nil
}

func (s *Receiver) drop(ss *snapSession) {
	ss.timer.Stop()
	s.mu.Lock()
	if s.sessions[ss.id] == ss {
		delete(s.sessions, ss.id)
		close(ss.gone)
	}
	s.mu.Unlock()
}

// abandon ends a transfer early: the receive goroutine sees a read error.
func (s *Receiver) abandon(ss *snapSession) {
	s.drop(ss)
	ss.pw.CloseWithError(errSnapshotAbandoned)
}

// Close abandons every snapshot transfer and waits for the receive
// goroutines; a transfer that begins later is refused (IO_ERROR).
func (s *Receiver) Close() {
	s.mu.Lock()
	s.closed = true
	all := make([]*snapSession, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	for _, ss := range all {
		s.abandon(ss)
	}
	s.wg.Wait()
}
