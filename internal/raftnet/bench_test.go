package raftnet

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// benchSizes are the write sizes the peer benchmarks sweep.
var benchSizes = []int{4 << 10, 64 << 10, 256 << 10, 1 << 20}

// benchMsgApp is a leader's MsgApp to `to` carrying ents.
func benchMsgApp(to uint64, ents []*raftpb.Entry) raftstore.Message {
	typ := raftpb.MsgApp
	return raftstore.Message{Group: 1<<32 | 7, Msg: &raftpb.Message{Type: &typ, From: proto.Uint64(1), To: proto.Uint64(to),
		Term: proto.Uint64(3), LogTerm: proto.Uint64(3), Index: proto.Uint64(100), Commit: proto.Uint64(99), Entries: ents}}
}

// benchEntries is one entry of a write of n bytes (with room for the
// proposal id and the chunkserver's command header, as a real one).
func benchEntries(n int) []*raftpb.Entry {
	data := make([]byte, 40+n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return []*raftpb.Entry{{Term: proto.Uint64(3), Index: proto.Uint64(101), Data: data}}
}

// countSink counts received OpRaft frames and frees a send slot per frame.
type countSink struct {
	n     atomic.Int64
	slots chan struct{}
}

func (s *countSink) ServeFrame(rw transport.ReplyWriter, h api.Header, payload []byte) {
	s.n.Add(1)
	<-s.slots
}

// BenchmarkPeerSend measures what a leader's raftstore worker pays to send one
// MsgApp of a write to each of two followers (3 replicas) through
// Transport.Send over real transport connections, 8 frames in flight per
// follower. The receivers only count frames. Run with:
//
//	go test -run XXX -bench PeerSend -benchmem ./internal/raftnet
func BenchmarkPeerSend(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			const depth = 8
			slots := make(chan struct{}, depth)
			s2, s3 := &countSink{slots: slots}, &countSink{slots: slots}
			pt := New(Config{Self: 1, Logger: testLogger(b)})
			defer pt.Close()
			pt.SetPeers(map[uint64]string{2: serveSink(b, s2), 3: serveSink(b, s3)})
			ents := benchEntries(n)
			// Connect: the first frames go through the sender goroutine.
			for s2.n.Load() == 0 || s3.n.Load() == 0 {
				slots <- struct{}{}
				slots <- struct{}{}
				pt.Send([]raftstore.Message{benchMsgApp(2, ents), benchMsgApp(3, ents)})
				waitConnected(pt, 2, 3)
			}
			base := s2.n.Load() + s3.n.Load()
			b.SetBytes(int64(n))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				slots <- struct{}{}
				slots <- struct{}{}
				pt.Send([]raftstore.Message{benchMsgApp(2, ents), benchMsgApp(3, ents)})
			}
			for s2.n.Load()+s3.n.Load() < base+2*int64(b.N) {
				runtime.Gosched()
			}
		})
	}
}

func waitConnected(pt *Transport, ids ...uint64) {
	for _, id := range ids {
		p := pt.peerOf(id)
		for {
			p.mu.Lock()
			c := p.conn
			p.mu.Unlock()
			if c != nil {
				break
			}
			runtime.Gosched()
		}
	}
}

// BenchmarkRaftDecode measures decoding one OpRaft frame holding one MsgApp
// of a write, as a follower's Receiver does (aliasing the payload from 64 KiB).
func BenchmarkRaftDecode(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(sizeName(n), func(b *testing.B) {
			frame, err := appendRecord(nil, benchMsgApp(2, benchEntries(n)))
			if err != nil {
				b.Fatal(err)
			}
			alias := len(frame) >= aliasMinFrame
			b.SetBytes(int64(n))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := decodeBatch(frame, alias); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
