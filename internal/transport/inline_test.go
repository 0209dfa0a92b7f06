package transport

import (
	"bufio"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// Tests of the inline write path (a sending goroutine writes its frame itself with
// one non-blocking writev) over real TCP sockets with small buffers, so writes
// come out partial.

// tcpPair returns both ends of a loopback TCP connection. Its socket buffers
// (a few hundred KiB before autotuning) hold far less than the multi-MiB frames
// these tests send, so those come out partial.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, _ := ln.Accept()
		accepted <- nc
	}()
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sv := <-accepted
	if sv == nil {
		t.Fatal("accept failed")
	}
	client, server = cl.(*net.TCPConn), sv.(*net.TCPConn)
	// A stream garbled by a bug must fail the test, not hang it.
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second))
	_ = server.SetReadDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

// within fails the test if f does not return within d: the callers of Go,
// SendAsync and Reply must never wait for the network.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s blocked on a peer that does not read", what)
	}
}

// readFrame reads one frame (header and payload) from r.
func readFrame(r io.Reader) (api.Header, []byte, error) {
	var hb [api.HeaderSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return api.Header{}, nil, err
	}
	h, err := api.DecodeHeader(hb[:])
	if err != nil {
		return api.Header{}, nil, err
	}
	p := make([]byte, h.PayloadLen)
	_, err = io.ReadFull(r, p)
	return h, p, err
}

func (c *Conn) handedOff() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handoff
}

func TestInlinePartialWriteHandedOff(t *testing.T) {
	cl, sv := tcpPair(t)
	c := NewConn(cl, ConnConfig{})
	t.Cleanup(func() { c.Close() })

	big := make([]byte, 32<<20)
	pattern(big, 1)
	small := []byte("second frame")
	var order []uint64
	var mu sync.Mutex
	sent := func(off uint64) func(error) {
		return func(err error) {
			if err != nil {
				t.Errorf("frame %d: %v", off, err)
			}
			mu.Lock()
			order = append(order, off)
			mu.Unlock()
		}
	}
	call := &Call{Header: api.Header{Op: api.OpRead, Offset: 3, Length: 8}, ReadBuf: make([]byte, 8)}
	replied := make(chan *Call, 1)
	within(t, 60*time.Second, "SendAsync and Go", func() {
		// The idle connection writes 32 MiB inline: the socket takes a part,
		// the writer goroutine must finish the rest before anything else.
		c.SendAsync(api.Header{Op: api.OpRaft, Offset: 1}, [][]byte{big[:1<<20], big[1<<20:]}, sent(1))
		if !c.handedOff() {
			t.Error("a 32 MiB frame did not fit the socket, yet the writer goroutine does not own the rest")
		}
		c.SendAsync(api.Header{Op: api.OpRaft, Offset: 2}, [][]byte{small}, sent(2))
		c.Go(call, func(cl *Call) { replied <- cl })
	})

	time.Sleep(50 * time.Millisecond) // let the writer sit on the full socket
	br := bufio.NewReader(sv)
	want := []struct {
		off     uint64
		payload []byte
	}{{1, big}, {2, small}, {3, nil}}
	var req api.Header
	for i, w := range want {
		h, p, err := readFrame(br)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h.Offset != w.off || h.ID != uint64(i+1) || string(p) != string(w.payload) {
			t.Fatalf("frame %d: offset %d id %d, %d payload bytes; want offset %d id %d, %d bytes (intact)",
				i, h.Offset, h.ID, len(p), w.off, i+1, len(w.payload))
		}
		req = h
	}
	// Answer the request; the call completes with its data.
	rep := req
	rep.Flags |= api.FlagReply
	rep.PayloadLen = 8
	hb := make([]byte, api.HeaderSize, api.HeaderSize+8)
	rep.Encode(hb)
	if _, err := sv.Write(append(hb, "abcdefgh"...)); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-replied:
		if got.Err != nil || string(got.ReadBuf) != "abcdefgh" {
			t.Fatalf("reply: err %v, data %q", got.Err, got.ReadBuf)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no reply")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Fatalf("SendAsync completions %v, want [1 2]", order)
	}
}

func TestPeerThatStopsReadingDoesNotBlockSenders(t *testing.T) {
	cl, _ := tcpPair(t) // the server end never reads
	c := NewConn(cl, ConnConfig{})
	payload := make([]byte, 1<<20)
	var done atomic.Int64
	const frames = 64 // 64 MiB: far more than the socket buffers hold
	// A blocked sender would block for good (the peer never reads): the
	// bounds only have to be generous.
	within(t, 60*time.Second, "SendAsync", func() {
		for i := range frames {
			start := time.Now()
			c.SendAsync(api.Header{Op: api.OpRaft, Offset: uint64(i)}, [][]byte{payload}, func(error) { done.Add(1) })
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("SendAsync %d took %v", i, d)
			}
		}
	})
	calls := make(chan *Call, 1)
	within(t, 60*time.Second, "Go", func() {
		c.Go(&Call{Header: api.Header{Op: api.OpWrite}, Payload: payload}, func(cl *Call) { calls <- cl })
	})
	if n := done.Load(); n >= frames {
		t.Fatalf("all %d frames reported written to a peer that reads nothing", n)
	}
	// Close fails everything still queued or being written.
	c.Close()
	select {
	case call := <-calls:
		if !errors.Is(call.Err, ErrClosed) {
			t.Fatalf("call err %v, want ErrClosed", call.Err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Go call not completed after Close")
	}
	deadline := time.Now().Add(60 * time.Second)
	for done.Load() != frames {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d SendAsync done callbacks ran after Close", done.Load(), frames)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrentSendersKeepOrder: frames go out in the order their calls were
// queued (their IDs), whichever goroutine writes them, with partial writes
// handed over between senders and the writer goroutine.
func TestConcurrentSendersKeepOrder(t *testing.T) {
	cl, sv := tcpPair(t)
	c := NewConn(cl, ConnConfig{})
	t.Cleanup(func() { c.Close() })
	const senders, perSender = 8, 300

	recvErr := make(chan error, 1)
	go func() {
		br := bufio.NewReader(sv)
		r := rand.New(rand.NewPCG(1, 2))
		next := make([]uint64, senders)
		for i := range senders * perSender {
			if r.IntN(50) == 0 {
				time.Sleep(time.Millisecond) // let the socket fill up now and then
			}
			h, p, err := readFrame(br)
			if err != nil {
				recvErr <- err
				return
			}
			s, seq := h.Offset>>32, h.Offset&0xffffffff
			want := make([]byte, len(p))
			pattern(want, h.Offset)
			switch {
			case h.ID != uint64(i+1):
				recvErr <- errors.New("frame IDs out of order on the wire")
				return
			case s >= senders || seq != next[s]:
				recvErr <- errors.New("a sender's frames out of order")
				return
			case string(p) != string(want):
				recvErr <- errors.New("payload corrupted")
				return
			}
			next[s]++
		}
		recvErr <- nil
	}()

	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(s), 7))
			for seq := range perSender {
				off := uint64(s)<<32 | uint64(seq)
				p := make([]byte, r.IntN(64<<10))
				pattern(p, off)
				if seq%3 == 0 {
					if err := c.Send(api.Header{Op: api.OpRaft, Offset: off}, p); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				c.SendAsync(api.Header{Op: api.OpRaft, Offset: off}, [][]byte{p}, nil)
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-recvErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("receiver did not get every frame")
	}
}

// TestReplyDoesNotBlockOnSlowClient: a handler's Reply returns at once even
// when the client reads nothing; the reply and the next one arrive intact, in
// order, once it reads.
func TestReplyDoesNotBlockOnSlowClient(t *testing.T) {
	big := make([]byte, 32<<20)
	pattern(big, 5)
	replyTook := make(chan time.Duration, 2)
	srv := NewServer(ServerConfig{}, handlerFunc(func(rw ReplyWriter, h api.Header, _ []byte) {
		go func() { // as a raft worker would
			start := time.Now()
			if h.Offset == 5 {
				rw.Reply(h, big, nil)
			} else {
				rw.Reply(h, []byte("tail"), nil)
			}
			replyTook <- time.Since(start)
		}()
	}))
	t.Cleanup(func() { srv.Close() })
	cl, sv := tcpPair(t)
	srv.ServeConn(sv)

	send := func(id, off uint64) {
		hb := make([]byte, api.HeaderSize)
		h := api.Header{Op: api.OpRead, ID: id, Offset: off}
		h.Encode(hb)
		if _, err := cl.Write(hb); err != nil {
			t.Fatal(err)
		}
	}
	send(1, 5)
	if d := <-replyTook; d > time.Second {
		t.Fatalf("Reply of 32 MiB to a client that does not read took %v", d)
	}
	send(2, 6)
	if d := <-replyTook; d > time.Second {
		t.Fatalf("Reply behind a stuck one took %v", d)
	}
	time.Sleep(50 * time.Millisecond)
	br := bufio.NewReader(cl)
	for i, want := range [][]byte{big, []byte("tail")} {
		h, p, err := readFrame(br)
		if err != nil {
			t.Fatal(err)
		}
		if h.ID != uint64(i+1) || !h.IsReply() || string(p) != string(want) {
			t.Fatalf("reply %d: id %d, %d bytes; want id %d, %d bytes intact", i, h.ID, len(p), i+1, len(want))
		}
	}
}
