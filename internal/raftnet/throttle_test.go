package raftnet

import (
	"bytes"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore"
)

// TestSnapshotRateLimit: a snapshot stream never runs faster than the
// chunkserver's snapshot rate, whether the sender's or the receiver's bucket
// holds it back (2 MiB/s, burst one 1 MiB frame: 4 MiB take at least 1.5 s).
func TestSnapshotRateLimit(t *testing.T) {
	const rate = 2 << 20
	data := bytes.Repeat([]byte("x"), 4<<20)
	for _, side := range []string{"sender", "receiver"} {
		t.Run(side, func(t *testing.T) {
			var got atomic.Int64 // set on the receive goroutine
			senderRate, receiverRate := int64(-1), int64(-1)
			if side == "sender" {
				senderRate = rate
			} else {
				receiverRate = rate
			}
			recv := New(Config{Self: 2, Logger: testLogger(t), SnapshotRate: receiverRate}).Receiver(&funcHost{
				receive: func(m raftstore.Message, r io.Reader) error {
					n, err := io.Copy(io.Discard, r)
					got.Store(n)
					return err
				}})
			defer recv.Close()
			pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: senderRate})
			defer pt.Close()
			pt.SetPeers(map[uint64]string{2: serveSink(t, recv)})
			snapType := raftpb.MsgSnap
			msg := &raftpb.Message{Type: &snapType, From: proto.Uint64(1), To: proto.Uint64(2),
				Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(9), Term: proto.Uint64(1)}}}
			start := time.Now()
			err := pt.SendSnapshot(raftstore.Message{Group: 7, Msg: msg}, func(w io.Writer) error {
				_, err := w.Write(data)
				return err
			})
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if got.Load() != int64(len(data)) {
				t.Fatalf("received %d bytes, want %d", got.Load(), len(data))
			}
			if want := 1500 * time.Millisecond; took < want {
				t.Fatalf("4 MiB at %d B/s took %v, less than %v", rate, took, want)
			}
			t.Logf("4 MiB at 2 MiB/s (%s limited) took %v", side, took.Round(time.Millisecond))
		})
	}
	if newSnapshotLimiter(-1) != nil {
		t.Fatal("a negative rate is no limit")
	}
	if l := newSnapshotLimiter(0); l == nil || int(l.Limit()) != DefaultSnapshotRate {
		t.Fatal("rate 0 is the default")
	}
}
