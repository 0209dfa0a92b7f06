package chunkserver

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

func testMsg(typ raftpb.MessageType, from, to, index uint64, data string) *raftpb.Message {
	m := &raftpb.Message{Type: &typ, From: &from, To: &to, Index: &index, Term: proto.Uint64(3)}
	if data != "" {
		m.Entries = []*raftpb.Entry{{Index: proto.Uint64(index + 1), Term: proto.Uint64(3), Data: []byte(data)}}
	}
	return m
}

// TestRaftBatchGolden freezes the OpRaft payload format.
func TestRaftBatchGolden(t *testing.T) {
	var b []byte
	var err error
	b, err = appendRaftRecord(b, 0x100000002, testMsg(raftpb.MsgApp, 1, 2, 7, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	b, err = appendRaftRecord(b, 0x100000003, testMsg(raftpb.MsgHeartbeat, 1, 2, 0, ""))
	if err != nil {
		t.Fatal(err)
	}
	got := hex.EncodeToString(b) + "\n"
	path := filepath.Join("testdata", "raftbatch.golden")
	if *update {
		os.WriteFile(path, []byte(got), 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("OpRaft batch encoding changed:\n got %s\nwant %s", got, want)
	}
	msgs, err := decodeRaftBatch(b)
	if err != nil || len(msgs) != 2 || msgs[0].Group != 0x100000002 || msgs[1].Group != 0x100000003 ||
		string(msgs[0].Msg.GetEntries()[0].GetData()) != "cmd" || msgs[1].Msg.GetType() != raftpb.MsgHeartbeat {
		t.Fatalf("round trip: %v %v", msgs, err)
	}
	// Decoded messages do not alias the frame (its buffer is reused).
	for i := range b {
		b[i] = 0xff
	}
	if string(msgs[0].Msg.GetEntries()[0].GetData()) != "cmd" {
		t.Fatal("decoded message aliases the payload")
	}
}

func TestRaftBatchGarbage(t *testing.T) {
	good, _ := appendRaftRecord(nil, 1, testMsg(raftpb.MsgApp, 1, 2, 7, "cmd"))
	huge := bytes.Clone(good)
	huge[8], huge[9], huge[10], huge[11] = 0xff, 0xff, 0xff, 0xff
	for name, b := range map[string][]byte{
		"short header":    good[:5],
		"truncated body":  good[:len(good)-1],
		"huge length":     huge,
		"not a protobuf":  append([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3}, 0xff, 0xff, 0xff),
		"trailing record": append(bytes.Clone(good), 1, 2, 3),
	} {
		if _, err := decodeRaftBatch(b); !errors.Is(err, ErrBadRaftBatch) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if msgs, err := decodeRaftBatch(nil); err != nil || len(msgs) != 0 {
		t.Fatalf("empty batch: %v %v", msgs, err)
	}
}

func FuzzDecodeRaftBatch(f *testing.F) {
	good, _ := appendRaftRecord(nil, 1, testMsg(raftpb.MsgApp, 1, 2, 7, "cmd"))
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := decodeRaftBatch(b)
		if err == nil {
			for _, m := range msgs {
				if m.Msg == nil {
					t.Fatal("nil message without error")
				}
			}
		}
	})
}

func FuzzDecodeCommand(f *testing.F) {
	f.Add(encodeCommand(command{Op: cmdWrite, Volume: 1, Epoch: 2, Offset: 3, Length: 2, Data: []byte("ab")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommand(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeCommand(c), b) {
			t.Fatalf("decode/encode of %x is not the identity", b)
		}
	})
}

// frameSink is a transport.Handler that records the frames it gets.
type frameSink struct {
	mu     sync.Mutex
	frames []transport.Header
	msgs   [][]raftMessage
	got    chan struct{}
}

func (s *frameSink) ServeFrame(rw transport.ReplyWriter, h transport.Header, payload []byte) {
	msgs, _ := decodeRaftBatch(payload)
	s.mu.Lock()
	s.frames = append(s.frames, h)
	s.msgs = append(s.msgs, msgs)
	s.mu.Unlock()
	s.got <- struct{}{}
}

// serveSink serves h on a loopback address and its same-host socket.
func serveSink(t testing.TB, h transport.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.NewServer(transport.ServerConfig{Logger: testLogger(t)}, h)
	go srv.Serve(ln)
	// Like a chunkserver, serve the same-host socket too: peers on this host use it.
	lnLocal, err := transport.ListenLocal(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lnLocal)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// Messages to one peer given in one Send leave in one OpRaft frame; messages
// to an unknown or unreachable peer are dropped without blocking.
func TestPeerTransportBatches(t *testing.T) {
	sink := &frameSink{got: make(chan struct{}, 16)}
	addr := serveSink(t, sink)
	pt := newPeerTransport(1, testLogger(t))
	defer pt.close()
	pt.setPeers(map[uint64]string{2: addr, 3: "127.0.0.1:1", 1: "self-ignored"})
	msgs := []raftMessage{
		{Group: 10, Msg: testMsg(raftpb.MsgApp, 1, 2, 1, "a")},
		{Group: 11, Msg: testMsg(raftpb.MsgHeartbeat, 1, 2, 0, "")},
		{Group: 10, Msg: testMsg(raftpb.MsgApp, 1, 3, 1, "a")}, // unreachable peer
		{Group: 12, Msg: testMsg(raftpb.MsgApp, 1, 9, 1, "a")}, // unknown peer
		{Group: 10, Msg: testMsg(raftpb.MsgApp, 1, 2, 2, "b")},
	}
	start := time.Now()
	pt.Send(msgs)
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("Send blocked for %v", d)
	}
	select {
	case <-sink.got:
	case <-time.After(5 * time.Second):
		t.Fatal("no frame arrived")
	}
	time.Sleep(50 * time.Millisecond)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.frames) != 1 {
		t.Fatalf("%d frames, want 1", len(sink.frames))
	}
	if h := sink.frames[0]; h.Op != transport.OpRaft || h.Hint != 1 {
		t.Fatalf("frame header %+v", h)
	}
	got := sink.msgs[0]
	if len(got) != 3 || got[0].Group != 10 || got[1].Group != 11 || got[2].Msg.GetIndex() != 2 {
		t.Fatalf("batch %v", got)
	}
}

// A peer's records in one Send are cut into frames of at most frameLimit
// bytes (a bigger record goes alone), in order, without mixing peers.
func TestPeerSendSplitsFrames(t *testing.T) {
	sink := &frameSink{got: make(chan struct{}, 16)}
	addr := serveSink(t, sink)
	pt := newPeerTransport(1, testLogger(t))
	defer pt.close()
	one, _ := appendRaftRecord(nil, 0, testMsg(raftpb.MsgApp, 1, 2, 0, "0123456789"))
	pt.frameLimit = 2*len(one) + 1
	pt.setPeers(map[uint64]string{2: addr, 3: "127.0.0.1:1"})
	var msgs []raftMessage
	for i := 0; i < 5; i++ {
		msgs = append(msgs, raftMessage{Group: uint64(i), Msg: testMsg(raftpb.MsgApp, 1, 2, uint64(i), "0123456789")},
			raftMessage{Group: 99, Msg: testMsg(raftpb.MsgApp, 1, 3, uint64(i), "x")})
	}
	msgs = append(msgs, raftMessage{Group: 5, Msg: testMsg(raftpb.MsgApp, 1, 2, 5, string(make([]byte, 3*len(one))))})
	pt.Send(msgs)
	var got [][]raftMessage
	for len(got) < 4 {
		select {
		case <-sink.got:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d frames arrived, want 4", len(got))
		}
		sink.mu.Lock()
		got = append(got[:0], sink.msgs...)
		sink.mu.Unlock()
	}
	next := uint64(0)
	for i, f := range got {
		if want := []int{2, 2, 1, 1}[i]; len(f) != want {
			t.Fatalf("frame %d holds %d records, want %d", i, len(f), want)
		}
		for _, m := range f {
			if m.Group != next || m.Msg.GetTo() != 2 {
				t.Fatalf("frame %d: group %d to %d, want group %d to 2", i, m.Group, m.Msg.GetTo(), next)
			}
			next++
		}
	}
}

// checkSink verifies that each OpRaft frame holds the message Send gave.
type checkSink struct {
	mu   sync.Mutex
	next uint64 // index of the next expected message
	bad  error
	n    atomic.Int64
}

func (s *checkSink) ServeFrame(rw transport.ReplyWriter, h transport.Header, payload []byte) {
	msgs, err := decodeRaftBatch(payload)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		i := m.Msg.GetIndex()
		switch {
		case err != nil:
		case i != s.next:
			err = fmt.Errorf("message %d arrived, want %d", i, s.next)
		case !bytes.Equal(m.Msg.GetEntries()[0].GetData(), reuseData(i)):
			err = fmt.Errorf("message %d arrived corrupted", i)
		}
		s.next++
	}
	if err != nil && s.bad == nil {
		s.bad = err
	}
	if s.n.Add(int64(len(msgs)))%200 == 0 {
		time.Sleep(20 * time.Millisecond) // TCP fills up: the sender's writer waits mid-frame
	}
}

// reuseData is the entry data of message i: a size and contents of its own.
func reuseData(i uint64) []byte {
	return bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 2<<10+int(i%7)*1000)
}

// Frame buffers are pooled and reused once the transport is done with them:
// frames sent back to back, through the connection directly and through the
// sender goroutine, while the receiver stalls now and then (the writer waits
// mid-frame as Send builds the next ones), all arrive intact and in order.
func TestPeerSendBufferReuse(t *testing.T) {
	sink := &checkSink{}
	addr := serveSink(t, sink)
	pt := newPeerTransport(1, testLogger(t))
	defer pt.close()
	pt.setPeers(map[uint64]string{2: addr})
	p := pt.peerOf(2)
	const total = 2000
	for i := uint64(0); i < total; i++ {
		if i%50 == 0 {
			// The next frames go through the sender goroutine's path again.
			p.mu.Lock()
			p.conn = nil
			p.mu.Unlock()
		}
		pt.Send([]raftMessage{{Group: 7, Msg: testMsg(raftpb.MsgApp, 1, 2, i, string(reuseData(i)))}})
	}
	deadline := time.Now().Add(20 * time.Second)
	for sink.n.Load() < total && time.Now().Before(deadline) {
		sink.mu.Lock()
		bad := sink.bad
		sink.mu.Unlock()
		if bad != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.bad != nil {
		t.Fatal(sink.bad)
	}
	if n := sink.n.Load(); n != total {
		t.Fatalf("%d of %d messages arrived", n, total)
	}
}

// snapHandler serves only OpSnapshot frames through a snapReceiver.
type snapHandler struct{ r *snapReceiver }

func (s snapHandler) ServeFrame(rw transport.ReplyWriter, h transport.Header, payload []byte) {
	s.r.serve(rw, h, payload)
}

func TestSnapshotTransfer(t *testing.T) {
	var mu sync.Mutex
	var got []byte
	var gotMsg raftMessage
	recv := newSnapReceiver(2, testLogger(t), func(m raftMessage, r io.Reader) error {
		b, err := io.ReadAll(r)
		mu.Lock()
		got, gotMsg = b, m
		mu.Unlock()
		if bytes.HasPrefix(b, []byte("fail")) {
			return errors.New("test: cannot stage")
		}
		return err
	})
	defer recv.close()
	addr := serveSink(t, snapHandler{recv})
	pt := newPeerTransport(1, testLogger(t))
	defer pt.close()
	pt.setPeers(map[uint64]string{2: addr})

	snapType := raftpb.MsgSnap
	msg := &raftpb.Message{Type: &snapType, From: proto.Uint64(1), To: proto.Uint64(2),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(99), Term: proto.Uint64(2)}}}
	data := bytes.Repeat([]byte("0123456789abcdef"), (3*snapFrameSize)/16+123)
	err := pt.SendSnapshot(raftMessage{Group: 77, Msg: msg}, func(w io.Writer) error {
		for p := data; len(p) > 0; {
			n := min(len(p), 100000)
			if _, err := w.Write(p[:n]); err != nil {
				return err
			}
			p = p[n:]
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if !bytes.Equal(got, data) || gotMsg.Group != 77 || gotMsg.Msg.GetSnapshot().GetMetadata().GetIndex() != 99 {
		t.Fatalf("received %d bytes (want %d), group %d", len(got), len(data), gotMsg.Group)
	}
	mu.Unlock()

	// A receiver that fails makes SendSnapshot fail.
	err = pt.SendSnapshot(raftMessage{Group: 77, Msg: msg}, func(w io.Writer) error {
		_, err := w.Write([]byte("fail please"))
		return err
	})
	if !errors.Is(err, ErrSnapshotRejected) {
		t.Fatalf("failed receive: %v", err)
	}
	// Unknown peer.
	msg.To = proto.Uint64(5)
	if err := pt.SendSnapshot(raftMessage{Group: 77, Msg: msg}, func(io.Writer) error { return nil }); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
}

func TestSnapshotReceiverBadFrames(t *testing.T) {
	calls := 0
	var mu sync.Mutex
	recv := newSnapReceiver(2, testLogger(t), func(m raftMessage, r io.Reader) error {
		mu.Lock()
		calls++
		mu.Unlock()
		_, err := io.Copy(io.Discard, r)
		return err
	})
	addr := serveSink(t, snapHandler{recv})
	c, err := transport.Dial(context.Background(), addr, transport.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c2, err := transport.Dial(context.Background(), addr, transport.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	doOn := func(c *transport.Conn, h transport.Header, p []byte) api.Status {
		h.Op = transport.OpSnapshot
		call := &transport.Call{Header: h, Payload: p}
		if err := c.Do(context.Background(), call); err != nil {
			t.Fatal(err)
		}
		return call.Reply.Status
	}
	do := func(h transport.Header, p []byte) api.Status { return doOn(c, h, p) }
	snapType := raftpb.MsgSnap
	okMsg := &raftpb.Message{Type: &snapType, To: proto.Uint64(2), Snapshot: &raftpb.Snapshot{}}
	begin, _ := appendRaftRecord(nil, 5, okMsg)
	wrongTo, _ := appendRaftRecord(nil, 5, testMsg(raftpb.MsgSnap, 1, 3, 0, ""))
	notSnap, _ := appendRaftRecord(nil, 5, testMsg(raftpb.MsgApp, 1, 2, 0, ""))
	for name, tc := range map[string]struct {
		h transport.Header
		p []byte
	}{
		"data without begin": {transport.Header{Volume: 1, Offset: 1, Length: snapData}, []byte("x")},
		"end without begin":  {transport.Header{Volume: 1, Offset: 1, Length: snapEnd}, nil},
		"bad kind":           {transport.Header{Volume: 1, Length: 9}, nil},
		"begin garbage":      {transport.Header{Volume: 1, Length: snapBegin}, []byte("garbage")},
		"begin not MsgSnap":  {transport.Header{Volume: 1, Length: snapBegin}, notSnap},
		"begin for another":  {transport.Header{Volume: 1, Length: snapBegin}, wrongTo},
		"begin with seq 4":   {transport.Header{Volume: 1, Offset: 4, Length: snapBegin}, begin},
	} {
		if st := do(tc.h, tc.p); st != api.StatusBadRequest {
			t.Errorf("%s: %v", name, st)
		}
	}
	// Out of sequence after a good begin abandons the transfer.
	if st := do(transport.Header{Volume: 2, Length: snapBegin}, begin); st != api.StatusOK {
		t.Fatalf("begin: %v", st)
	}
	if st := do(transport.Header{Volume: 2, Offset: 5, Length: snapData}, []byte("x")); st != api.StatusBadRequest {
		t.Fatalf("out of sequence: %v", st)
	}
	if st := do(transport.Header{Volume: 2, Offset: 1, Length: snapEnd}, nil); st != api.StatusBadRequest {
		t.Fatalf("end after abandon: %v", st)
	}
	// A transfer's frames come on the connection that began it only.
	if st := do(transport.Header{Volume: 3, Length: snapBegin}, begin); st != api.StatusOK {
		t.Fatalf("begin: %v", st)
	}
	if st := doOn(c2, transport.Header{Volume: 3, Offset: 1, Length: snapData}, []byte("x")); st != api.StatusBadRequest {
		t.Fatalf("data frame on another connection: %v", st)
	}
	recv.close()
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Fatalf("%d receives started, want 2", calls)
	}
}
