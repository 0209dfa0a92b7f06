package chunkserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/time/rate"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// snapIdleTimeout ends a snapshot transfer whose sender went silent.
const snapIdleTimeout = 30 * time.Second

// errReceiverDone is what a data frame's write sees when the receiver
// returned before the end frame (it read less than was sent).
var errReceiverDone = errors.New("chunkserver: snapshot receiver already returned")

// errSnapshotAbandoned ends a receive whose sender went silent or disconnected.
var errSnapshotAbandoned = errors.New("chunkserver: snapshot transfer abandoned by sender")

// snapReceiver serves OpSnapshot frames: it feeds each transfer's data frames
// through a pipe to Host.ReceiveSnapshot, which runs on a goroutine of its own.
//
// Goroutines: frames arrive on connection reader goroutines (a transfer uses one
// connection, so its frames arrive in order on one goroutine); each transfer has
// one receive goroutine; an idle timer may abandon it.
type snapReceiver struct {
	self    uint64
	log     *slog.Logger
	receive func(m raftMessage, r io.Reader) error
	// limit bounds the snapshot bytes received (shared with the sender: in
	// plus out); nil = no limit. Set before use. A data frame waits for its
	// bytes before it is handed on, holding the connection's reader: the
	// sender, which waits for each frame's answer, slows down with it.
	limit *rate.Limiter

	mu       sync.Mutex
	sessions map[uint64]*snapSession // by transfer id
	wg       sync.WaitGroup
}

type snapSession struct {
	id    uint64
	owner transport.ReplyWriter // the connection that began it
	group uint64
	next  uint64 // sequence number of the next frame
	pw    *io.PipeWriter
	res   chan error // receive result, buffered
	timer *time.Timer
}

func newSnapReceiver(self uint64, log *slog.Logger, receive func(raftMessage, io.Reader) error) *snapReceiver {
	return &snapReceiver{self: self, log: log, receive: receive, sessions: make(map[uint64]*snapSession)}
}

func (s *snapReceiver) serve(rw transport.ReplyWriter, h transport.Header, payload []byte) {
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
		msgs, err := decodeRaftBatch(payload)
		if err != nil || len(msgs) != 1 || msgs[0].Msg.GetType() != raftpb.MsgSnap ||
			msgs[0].Msg.GetTo() != s.self || msgs[0].Msg.GetSnapshot() == nil {
			reply(api.StatusBadRequest)
			return
		}
		pr, pw := io.Pipe()
		ss = &snapSession{id: h.Volume, owner: rw, group: msgs[0].Group, next: 1, pw: pw, res: make(chan error, 1)}
		ss.timer = time.AfterFunc(snapIdleTimeout, func() { s.abandon(ss) })
		s.mu.Lock()
		s.sessions[ss.id] = ss
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := s.receive(msgs[0], pr)
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
			s.log.Warn("snapshot receive failed", "copyset", ss.group, "err", err)
			reply(api.StatusIOError)
			return
		}
		reply(api.StatusOK)
	default:
		reply(api.StatusBadRequest)
	}
}

func (s *snapReceiver) drop(ss *snapSession) {
	ss.timer.Stop()
	s.mu.Lock()
	if s.sessions[ss.id] == ss {
		delete(s.sessions, ss.id)
	}
	s.mu.Unlock()
}

// abandon ends a transfer early: the receive goroutine sees a read error.
func (s *snapReceiver) abandon(ss *snapSession) {
	s.drop(ss)
	ss.pw.CloseWithError(errSnapshotAbandoned)
}

// close abandons every transfer and waits for the receive goroutines.
func (s *snapReceiver) close() {
	s.mu.Lock()
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
