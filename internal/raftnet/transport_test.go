package raftnet

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

var update = flag.Bool("update", false, "rewrite golden files")

func testLogger(testing.TB) *slog.Logger {
	if os.Getenv("BASALT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func testMsg(typ raftpb.MessageType, from, to, index uint64, data string) *raftpb.Message {
	m := &raftpb.Message{Type: &typ, From: &from, To: &to, Index: &index, Term: proto.Uint64(3)}
	if data != "" {
		m.Entries = []*raftpb.Entry{{Index: proto.Uint64(index + 1), Term: proto.Uint64(3), Data: []byte(data)}}
	}
	return m
}

// goldenBatch is the batch of TestBatchGolden: a MsgApp with an entry whose
// data travels as a piece of its own, a small one, a conf change and a
// leader's empty entry; a heartbeat; a vote with a context.
func goldenBatch() []raftstore.Message {
	app := testMsg(raftpb.MsgApp, 1, 2, 7, "")
	app.LogTerm, app.Commit = proto.Uint64(3), proto.Uint64(6)
	cc := raftpb.EntryConfChangeV2
	app.Entries = []*raftpb.Entry{
		{Term: proto.Uint64(3), Index: proto.Uint64(8), Data: bytes.Repeat([]byte("basalt!"), 100)},
		{Term: proto.Uint64(3), Index: proto.Uint64(9), Data: []byte("cmd")},
		{Term: proto.Uint64(3), Index: proto.Uint64(10), Type: &cc, Data: []byte{}},
		{Term: proto.Uint64(4), Index: proto.Uint64(11)},
	}
	vote := testMsg(raftpb.MsgPreVote, 1, 2, 11, "")
	vote.Context = []byte("campaign")
	return []raftstore.Message{
		{Group: 0x100000002, Msg: app},
		{Group: 0x100000003, Msg: testMsg(raftpb.MsgHeartbeat, 1, 2, 0, "")},
		{Group: 0x100000004, Msg: vote},
	}
}

// encodeBatch encodes msgs as Send does, and as one contiguous payload.
func encodeBatch(t testing.TB, msgs []raftstore.Message) (pieces [][]byte, flat []byte) {
	t.Helper()
	var f frameBuilder
	for _, m := range msgs {
		r := newRecord(m)
		if err := f.add(&r); err != nil {
			t.Fatal(err)
		}
		var err error
		if flat, err = appendRecord(flat, m); err != nil {
			t.Fatal(err)
		}
	}
	pieces = f.pieces()
	if got := bytes.Join(pieces, nil); !bytes.Equal(got, flat) || len(got) != f.size {
		t.Fatalf("Send's pieces (%d bytes, size %d) differ from appendRecord's %d bytes", len(got), f.size, len(flat))
	}
	return pieces, flat
}

func sameMessages(t *testing.T, got, want []raftstore.Message) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Group != want[i].Group || !proto.Equal(got[i].Msg, want[i].Msg) {
			t.Fatalf("message %d: group %d %v, want group %d %v", i, got[i].Group, got[i].Msg, want[i].Group, want[i].Msg)
		}
	}
}

// TestBatchGolden freezes the OpRaft payload format (doc.go).
func TestBatchGolden(t *testing.T) {
	msgs := goldenBatch()
	pieces, b := encodeBatch(t, msgs)
	if len(pieces) != 3 {
		t.Fatalf("%d pieces, want 3: the 700-byte entry's data is a piece of its own", len(pieces))
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
	for _, alias := range []bool{false, true} {
		buf := bytes.Clone(b)
		dec, err := decodeBatch(buf, alias)
		if err != nil {
			t.Fatal(err)
		}
		sameMessages(t, dec, msgs)
		// Without alias nothing points into the payload (its buffer is
		// reused); with alias the data is the payload's.
		for i := range buf {
			buf[i] = 0xff
		}
		data := dec[0].Msg.GetEntries()[0].GetData()
		if aliased := data[0] == 0xff; aliased != alias {
			t.Fatalf("alias %v: decoded data aliases the payload: %v", alias, aliased)
		}
		if e := dec[0].Msg.GetEntries()[3]; e.Data != nil || dec[0].Msg.GetEntries()[2].Data == nil {
			t.Fatal("absent and empty entry data are not told apart")
		}
	}
}

// TestMessageFields: withoutEntries copies every field of a raftpb.Message
// but its entries, and the record encodes every field of a raftpb.Entry. A
// raft upgrade that adds a field fails here until the codec handles it.
func TestMessageFields(t *testing.T) {
	fields := func(m proto.Message) map[string]bool {
		out := map[string]bool{}
		fd := m.ProtoReflect().Descriptor().Fields()
		for i := range fd.Len() {
			out[string(fd.Get(i).Name())] = true
		}
		return out
	}
	wantMsg := []string{"type", "to", "from", "term", "logTerm", "index", "entries", "commit", "vote",
		"snapshot", "reject", "rejectHint", "context", "responses"}
	got := fields(&raftpb.Message{})
	for _, f := range wantMsg {
		delete(got, f)
	}
	if len(got) != 0 {
		t.Fatalf("raftpb.Message has fields withoutEntries does not copy: %v", got)
	}
	got = fields(&raftpb.Entry{})
	for _, f := range []string{"Term", "Index", "Type", "Data"} {
		delete(got, f)
	}
	if len(got) != 0 {
		t.Fatalf("raftpb.Entry has fields the record does not encode: %v", got)
	}
	// Every field set: the copy without entries loses nothing else.
	typ, b := raftpb.MsgApp, true
	m := &raftpb.Message{Type: &typ, To: proto.Uint64(2), From: proto.Uint64(1), Term: proto.Uint64(3),
		LogTerm: proto.Uint64(4), Index: proto.Uint64(5), Commit: proto.Uint64(6), Vote: proto.Uint64(7),
		Snapshot: &raftpb.Snapshot{Data: []byte("s")}, Reject: &b, RejectHint: proto.Uint64(8),
		Context: []byte("c"), Responses: []*raftpb.Message{{To: proto.Uint64(9)}},
		Entries: []*raftpb.Entry{{Data: []byte("e")}}}
	want := proto.Clone(m).(*raftpb.Message)
	want.Entries = nil
	if c := withoutEntries(m); !proto.Equal(c, want) {
		t.Fatalf("withoutEntries lost a field:\n got %v\nwant %v", c, want)
	}
}

func TestBatchGarbage(t *testing.T) {
	_, good := encodeBatch(t, []raftstore.Message{{Group: 1, Msg: testMsg(raftpb.MsgApp, 1, 2, 7, "cmd")}})
	withEntries, _ := proto.Marshal(testMsg(raftpb.MsgApp, 1, 2, 7, "cmd"))
	// Field 7 (entries) as a varint: protobuf keeps it as an unknown field.
	unknown, _ := proto.Marshal(testMsg(raftpb.MsgHeartbeat, 1, 2, 0, ""))
	unknown = append(unknown, 0x38, 0x30)
	corrupt := func(at int, b ...byte) []byte {
		c := bytes.Clone(good)
		copy(c[at:], b)
		return c
	}
	msgLen := int(good[11])
	table := recordHeader + msgLen
	for name, b := range map[string][]byte{
		"short header":      good[:5],
		"truncated data":    good[:len(good)-1],
		"truncated table":   good[:table+5],
		"huge message":      corrupt(8, 0xff, 0xff, 0xff, 0xff),
		"huge entry count":  corrupt(12, 0xff, 0xff, 0xff, 0xff),
		"huge data length":  corrupt(table+18, 0xff, 0xff, 0xff, 0xff),
		"unknown flag":      corrupt(table, 0x80),
		"data without flag": corrupt(table, entryHasTerm|entryHasIndex),
		// Raft has three entry types; the WAL keeps the type in 7 bits.
		"unknown entry type": corrupt(table, entryFlags, 3),
		"entry type 0x80":    corrupt(table, entryFlags, 0x80),
		"not a protobuf":     append([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0}, 0xff, 0xff, 0xff),
		"entries inside":     append([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, byte(len(withEntries)), 0, 0, 0, 0}, withEntries...),
		"trailing record":    append(bytes.Clone(good), 1, 2, 3),
		"unknown field":      append([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, byte(len(unknown)), 0, 0, 0, 0}, unknown...),
	} {
		if _, err := decodeBatch(b, false); !errors.Is(err, ErrBadBatch) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if msgs, err := decodeBatch(nil, false); err != nil || len(msgs) != 0 {
		t.Fatalf("empty batch: %v %v", msgs, err)
	}
}

// FuzzDecodeBatch: no input crashes the decoder, and what it accepts
// encodes and decodes again to the same messages.
func FuzzDecodeBatch(f *testing.F) {
	_, good := encodeBatch(f, goldenBatch())
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, alias := range []bool{false, true} {
			b := bytes.Clone(in)
			msgs, err := decodeBatch(b, alias)
			if !bytes.Equal(b, in) {
				t.Fatal("the decoder wrote to its input")
			}
			if err != nil {
				continue
			}
			for _, m := range msgs {
				if m.Msg == nil {
					t.Fatal("nil message without error")
				}
			}
			_, again := encodeBatch(t, msgs)
			msgs2, err := decodeBatch(again, false)
			if err != nil {
				t.Fatalf("re-encoded batch does not decode: %v", err)
			}
			sameMessages(t, msgs2, msgs)
			if !alias {
				// Without alias the messages own their bytes.
				for i := range b {
					b[i] ^= 0xff
				}
				if _, after := encodeBatch(t, msgs); !bytes.Equal(after, again) {
					t.Fatal("decoded messages alias the input")
				}
			}
		}
	})
}

// frameSink is a transport.Handler that records the frames it gets.
type frameSink struct {
	mu     sync.Mutex
	frames []api.Header
	msgs   [][]raftstore.Message
	got    chan struct{}
}

func (s *frameSink) ServeFrame(rw transport.ReplyWriter, h api.Header, payload []byte) {
	msgs, _ := decodeBatch(payload, false)
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
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer pt.Close()
	pt.SetPeers(map[uint64]string{2: addr, 3: "127.0.0.1:1", 1: "self-ignored"})
	msgs := []raftstore.Message{
		{Group: 10, Msg: testMsg(raftpb.MsgApp, 1, 2, 1, "a")},
		{Group: 11, Msg: testMsg(raftpb.MsgHeartbeat, 1, 2, 0, "")},
		{Group: 10, Msg: testMsg(raftpb.MsgApp, 1, 3, 1, "a")}, // unreachable peer
		{Group: 12, Msg: testMsg(raftpb.MsgApp, 1, 9, 1, "a")}, // unknown peer
		{Group: 10, Msg: testMsg(raftpb.MsgApp, 1, 2, 2, "b")},
	}
	start := time.Now()
	pt.Send(msgs)
	// Send hands the messages to per-peer senders and returns: it never
	// waits for a dial (generous bound for a loaded machine).
	if d := time.Since(start); d > 10*time.Second {
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
	if h := sink.frames[0]; h.Op != api.OpRaft || h.Hint != 1 {
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
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer pt.Close()
	one, _ := appendRecord(nil, raftstore.Message{Msg: testMsg(raftpb.MsgApp, 1, 2, 0, "0123456789")})
	pt.frameLimit = 2*len(one) + 1
	pt.SetPeers(map[uint64]string{2: addr, 3: "127.0.0.1:1"})
	var msgs []raftstore.Message
	for i := 0; i < 5; i++ {
		msgs = append(msgs, raftstore.Message{Group: uint64(i), Msg: testMsg(raftpb.MsgApp, 1, 2, uint64(i), "0123456789")},
			raftstore.Message{Group: 99, Msg: testMsg(raftpb.MsgApp, 1, 3, uint64(i), "x")})
	}
	msgs = append(msgs, raftstore.Message{Group: 5, Msg: testMsg(raftpb.MsgApp, 1, 2, 5, string(make([]byte, 3*len(one))))})
	pt.Send(msgs)
	var got [][]raftstore.Message
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

func (s *checkSink) ServeFrame(rw transport.ReplyWriter, h api.Header, payload []byte) {
	msgs, err := decodeBatch(payload, false)
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

// Frames are written from their pieces (the entries' own data) while Send
// builds the next ones: frames sent back to back, through the connection
// directly and through the sender goroutine, while the receiver stalls now
// and then (the writer waits mid-frame), all arrive intact and in order.
func TestPeerSendBufferReuse(t *testing.T) {
	sink := &checkSink{}
	addr := serveSink(t, sink)
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer pt.Close()
	pt.SetPeers(map[uint64]string{2: addr})
	p := pt.peerOf(2)
	const total = 2000
	for i := uint64(0); i < total; i++ {
		if i%50 == 0 {
			// The next frames go through the sender goroutine's path again.
			p.mu.Lock()
			p.conn = nil
			p.mu.Unlock()
		}
		pt.Send([]raftstore.Message{{Group: 7, Msg: testMsg(raftpb.MsgApp, 1, 2, i, string(reuseData(i)))}})
	}
	deadline := time.Now().Add(60 * time.Second)
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

// The entries a Receiver steps into its host keep their data for as long as
// the host keeps them, as raft and the WAL do: a large frame's entries alias
// a buffer of their own; a small frame's are copied out of the transport's
// pooled buffer, which later frames reuse (and which bufpool.Put poisons
// under -race).
func TestReceivedEntriesKeepTheirData(t *testing.T) {
	host := &funcHost{}
	recv := New(Config{Self: 2, Logger: testLogger(t), SnapshotRate: -1}).Receiver(host)
	defer recv.Close()
	addr := serveSink(t, recv)
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer pt.Close()
	pt.SetPeers(map[uint64]string{2: addr})
	// Frames below and above aliasMinFrame, each size many times over.
	sizes := []int{100, 3 << 10, 40 << 10, aliasMinFrame, 300 << 10}
	data := func(i uint64) []byte {
		return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, sizes[i%uint64(len(sizes))]/3+1)
	}
	const total = 60
	for i := uint64(0); i < total; i++ {
		pt.Send([]raftstore.Message{{Group: 7, Msg: testMsg(raftpb.MsgApp, 1, 2, i, string(data(i)))}})
	}
	var got []raftstore.Message
	for deadline := time.Now().Add(60 * time.Second); len(got) < total && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		host.mu.Lock()
		got = slices.Clone(host.stepped)
		host.mu.Unlock()
	}
	if len(got) != total {
		t.Fatalf("%d of %d messages arrived", len(got), total)
	}
	for _, m := range got {
		i := m.Msg.GetIndex()
		if d := m.Msg.GetEntries()[0].GetData(); !bytes.Equal(d, data(i)) {
			t.Fatalf("message %d: its %d bytes of entry data changed after the frame was served", i, len(d))
		}
	}
}

// A MsgApp with an entry of MaxEntryData bytes, every field at its largest,
// fits in a frame and arrives.
func TestLargestEntryArrives(t *testing.T) {
	host := &funcHost{}
	recv := New(Config{Self: 2, Logger: testLogger(t), SnapshotRate: -1}).Receiver(host)
	defer recv.Close()
	addr := serveSink(t, recv)
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer pt.Close()
	pt.SetPeers(map[uint64]string{2: addr})
	big := uint64(math.MaxUint64)
	cc := raftpb.EntryConfChangeV2
	m := testMsg(raftpb.MsgApp, big, 2, big, "")
	m.Term, m.LogTerm, m.Commit = &big, &big, &big
	m.Entries = []*raftpb.Entry{{Term: &big, Index: &big, Type: &cc, Data: make([]byte, MaxEntryData)}}
	if r := newRecord(raftstore.Message{Group: big, Msg: m}); r.size > api.MaxPayload {
		t.Fatalf("record of %d bytes, more than a frame's %d", r.size, api.MaxPayload)
	}
	pt.Send([]raftstore.Message{{Group: big, Msg: m}})
	var n int
	for deadline := time.Now().Add(60 * time.Second); n == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		host.mu.Lock()
		n = len(host.stepped)
		if n > 0 && len(host.stepped[0].Msg.GetEntries()[0].GetData()) != MaxEntryData {
			t.Errorf("entry of %d bytes arrived", len(host.stepped[0].Msg.GetEntries()[0].GetData()))
		}
		host.mu.Unlock()
	}
	if n != 1 {
		t.Fatal("the largest entry did not arrive")
	}
}

// funcHost is a Host whose ReceiveSnapshot is receive; Step records.
type funcHost struct {
	receive func(m raftstore.Message, r io.Reader) error
	mu      sync.Mutex
	stepped []raftstore.Message
}

func (h *funcHost) Step(msgs []raftstore.Message) {
	h.mu.Lock()
	h.stepped = append(h.stepped, msgs...)
	h.mu.Unlock()
}

func (h *funcHost) ReceiveSnapshot(m raftstore.Message, r io.Reader) error { return h.receive(m, r) }

// newReceiver returns the Receiver of chunkserver 2 with receive as its
// host's ReceiveSnapshot.
func newReceiver(t testing.TB, receive func(m raftstore.Message, r io.Reader) error) *Receiver {
	return New(Config{Self: 2, Logger: testLogger(t), SnapshotRate: -1}).Receiver(&funcHost{receive: receive})
}

func TestSnapshotTransfer(t *testing.T) {
	var mu sync.Mutex
	var got []byte
	var gotMsg raftstore.Message
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		b, err := io.ReadAll(r)
		mu.Lock()
		got, gotMsg = b, m
		mu.Unlock()
		if bytes.HasPrefix(b, []byte("fail")) {
			return errors.New("test: cannot stage")
		}
		return err
	})
	defer recv.Close()
	addr := serveSink(t, recv)
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer pt.Close()
	pt.SetPeers(map[uint64]string{2: addr})

	snapType := raftpb.MsgSnap
	msg := &raftpb.Message{Type: &snapType, From: proto.Uint64(1), To: proto.Uint64(2),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(99), Term: proto.Uint64(2)}}}
	data := bytes.Repeat([]byte("0123456789abcdef"), (3*snapFrameSize)/16+123)
	err := pt.SendSnapshot(raftstore.Message{Group: 77, Msg: msg}, func(w io.Writer) error {
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
	err = pt.SendSnapshot(raftstore.Message{Group: 77, Msg: msg}, func(w io.Writer) error {
		_, err := w.Write([]byte("fail please"))
		return err
	})
	if !errors.Is(err, ErrSnapshotRejected) {
		t.Fatalf("failed receive: %v", err)
	}
	// Unknown peer.
	msg.To = proto.Uint64(5)
	if err := pt.SendSnapshot(raftstore.Message{Group: 77, Msg: msg}, func(io.Writer) error { return nil }); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
}

func TestSnapshotReceiverBadFrames(t *testing.T) {
	calls := 0
	var mu sync.Mutex
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		mu.Lock()
		calls++
		mu.Unlock()
		_, err := io.Copy(io.Discard, r)
		return err
	})
	addr := serveSink(t, recv)
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
	doOn := func(c *transport.Conn, h api.Header, p []byte) api.Status {
		h.Op = api.OpSnapshot
		call := &transport.Call{Header: h, Payload: p}
		if err := c.Do(context.Background(), call); err != nil {
			t.Fatal(err)
		}
		return call.Reply.Status
	}
	do := func(h api.Header, p []byte) api.Status { return doOn(c, h, p) }
	snapType := raftpb.MsgSnap
	okMsg := &raftpb.Message{Type: &snapType, To: proto.Uint64(2), Snapshot: &raftpb.Snapshot{}}
	begin, _ := appendRecord(nil, raftstore.Message{Group: 5, Msg: okMsg})
	wrongTo, _ := appendRecord(nil, raftstore.Message{Group: 5, Msg: testMsg(raftpb.MsgSnap, 1, 3, 0, "")})
	notSnap, _ := appendRecord(nil, raftstore.Message{Group: 5, Msg: testMsg(raftpb.MsgApp, 1, 2, 0, "")})
	for name, tc := range map[string]struct {
		h api.Header
		p []byte
	}{
		"data without begin": {api.Header{Volume: 1, Offset: 1, Length: snapData}, []byte("x")},
		"end without begin":  {api.Header{Volume: 1, Offset: 1, Length: snapEnd}, nil},
		"bad kind":           {api.Header{Volume: 1, Length: 9}, nil},
		"begin garbage":      {api.Header{Volume: 1, Length: snapBegin}, []byte("garbage")},
		"begin not MsgSnap":  {api.Header{Volume: 1, Length: snapBegin}, notSnap},
		"begin for another":  {api.Header{Volume: 1, Length: snapBegin}, wrongTo},
		"begin with seq 4":   {api.Header{Volume: 1, Offset: 4, Length: snapBegin}, begin},
	} {
		if st := do(tc.h, tc.p); st != api.StatusBadRequest {
			t.Errorf("%s: %v", name, st)
		}
	}
	// Out of sequence after a good begin abandons the transfer.
	if st := do(api.Header{Volume: 2, Length: snapBegin}, begin); st != api.StatusOK {
		t.Fatalf("begin: %v", st)
	}
	if st := do(api.Header{Volume: 2, Offset: 5, Length: snapData}, []byte("x")); st != api.StatusBadRequest {
		t.Fatalf("out of sequence: %v", st)
	}
	if st := do(api.Header{Volume: 2, Offset: 1, Length: snapEnd}, nil); st != api.StatusBadRequest {
		t.Fatalf("end after abandon: %v", st)
	}
	// A transfer's frames come on the connection that began it only.
	if st := do(api.Header{Volume: 3, Length: snapBegin}, begin); st != api.StatusOK {
		t.Fatalf("begin: %v", st)
	}
	if st := doOn(c2, api.Header{Volume: 3, Offset: 1, Length: snapData}, []byte("x")); st != api.StatusBadRequest {
		t.Fatalf("data frame on another connection: %v", st)
	}
	recv.Close()
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Fatalf("%d receives started, want 2", calls)
	}
}

// A closed Receiver starts no snapshot transfer: Close waits for the receive
// goroutines, and one started later would outlive it (and the raft host).
func TestSnapshotReceiverClosed(t *testing.T) {
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		_, err := io.Copy(io.Discard, r)
		return err
	})
	addr := serveSink(t, recv)
	c, err := transport.Dial(context.Background(), addr, transport.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	recv.Close()
	snapType := raftpb.MsgSnap
	begin, _ := appendRecord(nil, raftstore.Message{Group: 5,
		Msg: &raftpb.Message{Type: &snapType, To: proto.Uint64(2), Snapshot: &raftpb.Snapshot{}}})
	call := &transport.Call{Header: api.Header{Op: api.OpSnapshot, Volume: 1, Length: snapBegin}, Payload: begin}
	if err := c.Do(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	if call.Reply.Status != api.StatusIOError {
		t.Fatalf("snapshot begin after Close: %v, want IO_ERROR", call.Reply.Status)
	}
}

// The receiver places a frame's first large entry so that its data, AlignSkip
// bytes in, is 512-byte aligned in memory (what a follower's O_DIRECT write
// wants), whatever comes before it in the frame; the data arrives intact.
func TestLargeEntryDataAligned(t *testing.T) {
	const skip = 40
	host := &funcHost{}
	recv := New(Config{Self: 2, Logger: testLogger(t), SnapshotRate: -1, AlignSkip: skip}).Receiver(host)
	defer recv.Close()
	addr := serveSink(t, recv)
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1, AlignSkip: skip})
	defer pt.Close()
	pt.SetPeers(map[uint64]string{2: addr})
	data := func(i uint64, n int) []byte {
		return bytes.Repeat([]byte{byte(i), 0xa5, byte(n)}, n/3)
	}
	const total = 20
	for i := range uint64(total) {
		// Before the large entry: a heartbeat of another group, small
		// entries of varying size, so that its offset in the frame varies.
		app := testMsg(raftpb.MsgApp, 1, 2, i, string(data(i, 3+int(i*7))))
		app.Entries = append(app.Entries, &raftpb.Entry{Data: data(i, 256<<10+skip)}, &raftpb.Entry{Data: data(i+1, 100<<10)})
		pt.Send([]raftstore.Message{
			{Group: 3, Msg: testMsg(raftpb.MsgHeartbeat, 1, 2, 0, "")},
			{Group: 7, Msg: app},
		})
	}
	var got []raftstore.Message
	for deadline := time.Now().Add(60 * time.Second); len(got) < 2*total && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		host.mu.Lock()
		got = slices.Clone(host.stepped)
		host.mu.Unlock()
	}
	if len(got) != 2*total {
		t.Fatalf("%d of %d messages arrived", len(got), 2*total)
	}
	for _, m := range got {
		if m.Group != 7 {
			continue
		}
		i := m.Msg.GetIndex()
		ents := m.Msg.GetEntries()
		if len(ents) != 3 || !bytes.Equal(ents[1].GetData(), data(i, 256<<10+skip)) || !bytes.Equal(ents[2].GetData(), data(i+1, 100<<10)) {
			t.Fatalf("message %d: entries differ from those sent", i)
		}
		if a := uintptr(unsafe.Pointer(&ents[1].GetData()[skip])) % dataAlign; a != 0 {
			t.Fatalf("message %d: the large entry's data %d bytes in is %d bytes past a %d-byte boundary", i, skip, a, dataAlign)
		}
	}
}

// Two overlapping snapshot streams for one group (a slow one still running
// when a newer one begins, e.g. from a new leader): the receiver refuses the
// second (BUSY) so that its sender reports the failure to raft and retries
// later, instead of staging two snapshots of one copyset at once. A stream
// for another group, and one for the same group once the first ended, go on.
func TestSnapshotReceiverOneStreamPerGroup(t *testing.T) {
	release := make(chan struct{})
	started := make(chan uint64, 4)
	var mu sync.Mutex
	received := map[uint64]int{} // snapshot index → receives that returned
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		idx := m.Msg.GetSnapshot().GetMetadata().GetIndex()
		started <- idx
		if idx == 10 {
			<-release // the slow stream
		}
		_, err := io.Copy(io.Discard, r)
		mu.Lock()
		received[idx]++
		mu.Unlock()
		return err
	})
	defer recv.Close()
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock() // before recv.Close, which waits for the receives
	addr := serveSink(t, recv)
	pt := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer pt.Close()
	pt.SetPeers(map[uint64]string{2: addr})

	snapMsg := func(index uint64) *raftpb.Message {
		snapType := raftpb.MsgSnap
		return &raftpb.Message{Type: &snapType, From: proto.Uint64(1), To: proto.Uint64(2),
			Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(index), Term: proto.Uint64(2)}}}
	}
	write := func(w io.Writer) error { _, err := w.Write([]byte("chunk data")); return err }
	first := make(chan error, 1)
	go func() { first <- pt.SendSnapshot(raftstore.Message{Group: 77, Msg: snapMsg(10)}, write) }()
	select {
	case idx := <-started:
		if idx != 10 {
			t.Fatalf("receive of index %d started first", idx)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the first stream did not begin")
	}
	// The first stream is in its receive now: a second one for group 77 is refused.
	err := pt.SendSnapshot(raftstore.Message{Group: 77, Msg: snapMsg(20)}, write)
	if !errors.Is(err, ErrSnapshotRejected) || !errors.Is(err, raftstore.ErrPeerBusy) {
		t.Fatalf("second concurrent stream for one group: %v, want ErrSnapshotRejected and ErrPeerBusy", err)
	}
	// Another group is not held up.
	if err := pt.SendSnapshot(raftstore.Message{Group: 78, Msg: snapMsg(30)}, write); err != nil {
		t.Fatalf("stream for another group: %v", err)
	}
	unblock()
	if err := <-first; err != nil {
		t.Fatalf("first stream: %v", err)
	}
	// Once the first ended, the newer snapshot goes through.
	if err := pt.SendSnapshot(raftstore.Message{Group: 77, Msg: snapMsg(20)}, write); err != nil {
		t.Fatalf("stream after the first ended: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if received[10] != 1 || received[20] != 1 || received[30] != 1 {
		t.Fatalf("receives per index: %v, want one each of 10, 20, 30", received)
	}
}

// TestSnapshotStreamFromFormerLeaderEnds: a follower receiving a (throttled,
// slow) snapshot from a leader that has since lost its leadership hears from
// the new leader. The new leader's stream is refused as busy this once, and
// the former leader's is ended there and then: raft would drop its snapshot
// for its older term, and the new leader's would otherwise wait for it (in
// TestMoveKeepsRedundancy a minute, retried ten times a second). The next
// attempt goes through while the former leader's stream fails.
func TestSnapshotStreamFromFormerLeaderEnds(t *testing.T) {
	var mu sync.Mutex
	results := map[uint64]error{} // snapshot term → its receive's result
	started := make(chan uint64, 4)
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		started <- m.Msg.GetTerm()
		_, err := io.Copy(io.Discard, r)
		mu.Lock()
		results[m.Msg.GetTerm()] = err
		mu.Unlock()
		return err
	})
	defer recv.Close()
	addr := serveSink(t, recv)
	snapMsg := func(from, term uint64) *raftpb.Message {
		snapType := raftpb.MsgSnap
		return &raftpb.Message{Type: &snapType, From: proto.Uint64(from), To: proto.Uint64(2), Term: proto.Uint64(term),
			Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(50), Term: proto.Uint64(term)}}}
	}
	former := New(Config{Self: 1, Logger: testLogger(t), SnapshotRate: -1})
	defer former.Close()
	former.SetPeers(map[uint64]string{2: addr})
	leader := New(Config{Self: 3, Logger: testLogger(t), SnapshotRate: -1})
	defer leader.Close()
	leader.SetPeers(map[uint64]string{2: addr})

	// The former leader (term 4) sends a frame, then more only when told.
	more := make(chan struct{})
	formerDone := make(chan error, 1)
	go func() {
		formerDone <- former.SendSnapshot(raftstore.Message{Group: 77, Msg: snapMsg(1, 4)}, func(w io.Writer) error {
			frame := bytes.Repeat([]byte("f"), snapFrameSize)
			if _, err := w.Write(frame); err != nil {
				return err
			}
			<-more
			_, err := w.Write(frame)
			return err
		})
	}()
	select {
	case term := <-started:
		if term != 4 {
			t.Fatalf("receive of term %d started first", term)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the former leader's stream did not begin")
	}
	write := func(w io.Writer) error { _, err := w.Write([]byte("the new leader's chunks")); return err }
	err := leader.SendSnapshot(raftstore.Message{Group: 77, Msg: snapMsg(3, 5)}, write)
	if !errors.Is(err, raftstore.ErrPeerBusy) {
		t.Fatalf("the new leader's first stream: %v, want ErrPeerBusy", err)
	}
	// The former leader's stream was ended: its receive fails, and so do
	// its next frames.
	close(more)
	select {
	case err := <-formerDone:
		if err == nil {
			t.Fatal("the former leader's stream succeeded after the new leader's arrived")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the former leader's stream did not end")
	}
	// The new leader's next attempt goes through (once the former's receive
	// returned: poll, as raft's retry would).
	deadline := time.Now().Add(60 * time.Second)
	for {
		err = leader.SendSnapshot(raftstore.Message{Group: 77, Msg: snapMsg(3, 5)}, write)
		if err == nil || !errors.Is(err, raftstore.ErrPeerBusy) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the new leader's stream after the former's ended: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if results[4] == nil || results[5] != nil {
		t.Fatalf("receive results by term: %v; want term 4 failed, term 5 received", results)
	}
}

// TestSnapshotSessionsBounded: streams begun and left open (each for a group
// of its own) are capped: beyond maxSnapSessionsPerSender from one sender
// (all senders are one, 0, on an unauthenticated data plane) a begin is
// answered BUSY, and once the open ones end a new one is accepted again.
func TestSnapshotSessionsBounded(t *testing.T) {
	recv := newReceiver(t, func(m raftstore.Message, r io.Reader) error {
		_, err := io.Copy(io.Discard, r)
		return err
	})
	defer recv.Close()
	addr := serveSink(t, recv)
	c, err := transport.Dial(context.Background(), addr, transport.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	do := func(h api.Header, p []byte) api.Status {
		h.Op = api.OpSnapshot
		call := &transport.Call{Header: h, Payload: p}
		if err := c.Do(context.Background(), call); err != nil {
			t.Fatal(err)
		}
		return call.Reply.Status
	}
	snapType := raftpb.MsgSnap
	begin := func(group uint64) []byte {
		b, _ := appendRecord(nil, raftstore.Message{Group: group,
			Msg: &raftpb.Message{Type: &snapType, To: proto.Uint64(2), Snapshot: &raftpb.Snapshot{}}})
		return b
	}
	busy := 0
	for i := uint64(1); i <= 2*maxSnapSessionsPerSender; i++ {
		switch st := do(api.Header{Volume: i, Length: snapBegin}, begin(100+i)); st {
		case api.StatusOK:
		case api.StatusBusy:
			busy++
		default:
			t.Fatalf("begin %d: %v", i, st)
		}
	}
	if busy != maxSnapSessionsPerSender {
		t.Fatalf("%d begins refused BUSY, want %d (the cap)", busy, maxSnapSessionsPerSender)
	}
	// End the accepted ones; a new stream is then accepted.
	for i := uint64(1); i <= maxSnapSessionsPerSender; i++ {
		if st := do(api.Header{Volume: i, Offset: 1, Length: snapEnd}, nil); st != api.StatusOK {
			t.Fatalf("end %d: %v", i, st)
		}
	}
	if st := do(api.Header{Volume: 999, Length: snapBegin}, begin(999)); st != api.StatusOK {
		t.Fatalf("begin after the others ended: %v", st)
	}
}
