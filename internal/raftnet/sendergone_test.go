package raftnet

import (
	"context"
	"io"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// A snapshot transfer whose sender's connection closed mid-stream (the
// sender crashed: TestFaultPoints/snapshot-send) is over at once: the
// copyset's next leader may stream its snapshot without waiting out the
// idle timeout. Before, the receiver answered BUSY for its copyset until
// snapIdleTimeout (30 s), and the replica stayed behind that long.
func TestSnapshotSenderGoneFreesGroup(t *testing.T) {
	old := snapIdleTimeout
	snapIdleTimeout = time.Hour // only the closed connection may end the transfer
	t.Cleanup(func() { snapIdleTimeout = old })
	receiving := make(chan struct{}, 2)
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		receiving <- struct{}{}
		_, err := io.Copy(io.Discard, r)
		return err
	})
	t.Cleanup(recv.Close)
	addr := serveSink(t, recv)
	snapType := raftpb.MsgSnap
	begin, _ := appendRecord(nil, raftstore.Message{Group: 5,
		Msg: &raftpb.Message{Type: &snapType, To: proto.Uint64(2), Snapshot: &raftpb.Snapshot{}}})
	do := func(c *transport.Conn, h api.Header, p []byte) api.Status {
		t.Helper()
		h.Op = api.OpSnapshot
		call := &transport.Call{Header: h, Payload: p}
		if err := c.Do(context.Background(), call); err != nil {
			t.Fatal(err)
		}
		return call.Reply.Status
	}
	dial := func() *transport.Conn {
		t.Helper()
		c, err := transport.Dial(context.Background(), addr, transport.ConnConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	first := dial()
	if st := do(first, api.Header{Volume: 1, Length: snapBegin}, begin); st != api.StatusOK {
		t.Fatalf("first begin: %v", st)
	}
	if st := do(first, api.Header{Volume: 1, Offset: 1, Length: snapData}, []byte("half a snapshot")); st != api.StatusOK {
		t.Fatalf("data: %v", st)
	}
	<-receiving
	second := dial()
	if st := do(second, api.Header{Volume: 3, Length: snapBegin}, begin); st != api.StatusBusy {
		t.Fatalf("a second transfer for the copyset while the first is under way: %v, want BUSY", st)
	}
	first.Close() // the sender is gone
	deadline := time.Now().Add(60 * time.Second)
	for id := uint64(5); ; id += 2 {
		st := do(second, api.Header{Volume: id, Length: snapBegin}, begin)
		if st == api.StatusOK {
			break
		}
		if st != api.StatusBusy || time.Now().After(deadline) {
			t.Fatalf("a transfer for the copyset after its sender's connection closed: %v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-receiving
}
