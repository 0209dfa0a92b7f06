package raftnet

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore"
)

// A snapshot stream whose receiver stops taking it (its disk hangs while it
// stages: Host.ReceiveSnapshot stops reading, so the receiver's connection
// reader blocks and no frame is answered) is given up once no frame was
// answered for snapStallTimeout: SendSnapshot fails, and raftstore reports
// the snapshot failed to raft, which ends the stream's hold on the leader's
// log. Before, SendSnapshot waited for ever and the leader's WAL grew until
// ENOSPC.
func TestSnapshotStalledReceiverGivesUp(t *testing.T) {
	oldStall, oldIdle := snapStallTimeout, snapIdleTimeout
	snapStallTimeout = time.Second
	snapIdleTimeout = time.Hour // the receiver must not end the transfer itself
	t.Cleanup(func() { snapStallTimeout, snapIdleTimeout = oldStall, oldIdle })

	hung := make(chan struct{})
	release := make(chan struct{})
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		var b [1]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return err
		}
		close(hung)
		<-release // the disk hangs
		_, err := io.Copy(io.Discard, r)
		return err
	})
	t.Cleanup(recv.Close)
	t.Cleanup(func() { close(release) }) // runs before recv.Close
	addr := serveSink(t, recv)
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	t.Cleanup(pt.Close)
	pt.SetPeers(map[uint64]string{2: addr})

	snapType := raftpb.MsgSnap
	msg := &raftpb.Message{Type: &snapType, From: proto.Uint64(1), To: proto.Uint64(2),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(99), Term: proto.Uint64(2)}}}
	data := bytes.Repeat([]byte{0xab}, 32*snapFrameSize) // 32 frames, each answered before the next
	done := make(chan error, 1)
	go func() {
		done <- pt.SendSnapshot(raftstore.Message{Group: 77, Msg: msg}, func(w io.Writer) error {
			_, err := w.Write(data)
			return err
		})
	}()
	var err error
	select {
	case <-hung:
		select {
		case err = <-done:
		case <-time.After(60 * time.Second): // generous: a loaded machine
			t.Fatal("SendSnapshot still blocked 60 s after the receiver stopped reading")
		}
	case err = <-done:
		// Its begin frame took longer than the bound (a loaded machine): it
		// gave up as well.
		t.Log("SendSnapshot ended before the receiver hung")
	}
	if !errors.Is(err, ErrSnapshotStalled) {
		t.Fatalf("SendSnapshot to a receiver that stopped reading: %v, want %v", err, ErrSnapshotStalled)
	}
	t.Logf("gave up: %v", err)
}
