package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// handlerFunc adapts a function to Handler.
type handlerFunc func(rw ReplyWriter, h api.Header, payload []byte)

func (f handlerFunc) ServeFrame(rw ReplyWriter, h api.Header, payload []byte) { f(rw, h, payload) }

// startServer serves h on a loopback listener and returns its address.
func startServer(t testing.TB, cfg ServerConfig, h Handler) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(cfg, h)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv, ln.Addr().String()
}

func dial(t testing.TB, addr string) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), addr, ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pattern fills b with bytes derived from off, so a reply shows which request it answers.
func pattern(b []byte, off uint64) {
	for i := range b {
		b[i] = byte(off>>3) + byte(i*7)
	}
}

// echoHandler answers reads with pattern(Offset) of Length bytes and writes with
// the CRC of their payload in Hint, each after a random delay (replies come out of
// order).
func echoHandler(seed uint64, maxDelay time.Duration) Handler {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed))
	return handlerFunc(func(rw ReplyWriter, h api.Header, payload []byte) {
		mu.Lock()
		d := time.Duration(r.Int64N(int64(maxDelay) + 1))
		mu.Unlock()
		var out []byte
		switch h.Op {
		case api.OpRead:
			out = make([]byte, h.Length)
			pattern(out, h.Offset)
		case api.OpWrite:
			h.Hint = uint64(crc32.ChecksumIEEE(payload))
		}
		time.AfterFunc(d, func() { rw.Reply(h, out, nil) })
	})
}

func TestPipeliningOutOfOrder(t *testing.T) {
	_, addr := startServer(t, ServerConfig{}, echoHandler(1, 2*time.Millisecond))
	pipelineOutOfOrder(t, dial(t, addr), 8192, 100)
}

// pipelineOutOfOrder runs 32 goroutines of perWorker reads and writes of up to
// maxLen bytes each on c, and checks every reply's header and payload.
func pipelineOutOfOrder(t *testing.T, c *Conn, maxLen, perWorker int) {
	t.Helper()
	const workers = 32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			buf := make([]byte, maxLen)
			for i := range perWorker {
				n := 1 + r.IntN(len(buf))
				off := uint64(w)<<32 | uint64(i)<<12
				call := &Call{Header: api.Header{Offset: off, Length: uint32(n)}}
				if i%2 == 0 {
					call.Header.Op = api.OpRead
					call.ReadBuf = buf
				} else {
					call.Header.Op = api.OpWrite
					call.Payload = buf[:n]
					pattern(call.Payload, off)
				}
				if err := c.Do(context.Background(), call); err != nil {
					errs <- err
					return
				}
				if call.Reply.Offset != off || call.Reply.ID != call.Header.ID || !call.Reply.IsReply() {
					errs <- errors.New("reply header does not match request")
					return
				}
				if call.Header.Op == api.OpRead {
					want := make([]byte, n)
					pattern(want, off)
					if int(call.Reply.PayloadLen) != n || string(buf[:n]) != string(want) {
						errs <- errors.New("read payload mismatch")
						return
					}
				} else if call.Reply.Hint != uint64(crc32.ChecksumIEEE(call.Payload)) {
					errs <- errors.New("write payload corrupted on the way")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestRepliesReversed holds every reply until all requests arrived, then answers in
// reverse order: each call must still get its own reply.
func TestRepliesReversed(t *testing.T) {
	const n = 50
	type held struct {
		rw ReplyWriter
		h  api.Header
	}
	var mu sync.Mutex
	var all []held
	_, addr := startServer(t, ServerConfig{}, handlerFunc(func(rw ReplyWriter, h api.Header, _ []byte) {
		mu.Lock()
		defer mu.Unlock()
		all = append(all, held{rw, h})
		if len(all) == n {
			for i := n - 1; i >= 0; i-- {
				b := make([]byte, 8)
				binary.BigEndian.PutUint64(b, all[i].h.Offset)
				all[i].rw.Reply(all[i].h, b, nil)
			}
		}
	}))
	c := dial(t, addr)
	calls := make([]*Call, n)
	var wg sync.WaitGroup
	for i := range calls {
		calls[i] = &Call{Header: api.Header{Op: api.OpRead, Offset: uint64(i) * 1000, Length: 8}, ReadBuf: make([]byte, 8)}
		wg.Add(1)
		c.Go(calls[i], func(*Call) { wg.Done() })
	}
	wg.Wait()
	for i, call := range calls {
		if call.Err != nil {
			t.Fatal(call.Err)
		}
		if got := binary.BigEndian.Uint64(call.ReadBuf); got != uint64(i)*1000 {
			t.Fatalf("call %d got the reply for offset %d", i, got)
		}
	}
}

func TestConnDeathFailsPending(t *testing.T) {
	var got atomic.Int32
	srv, addr := startServer(t, ServerConfig{}, handlerFunc(func(ReplyWriter, api.Header, []byte) {
		got.Add(1) // never replies
	}))
	c := dial(t, addr)
	const n = 20
	var wg sync.WaitGroup
	calls := make([]*Call, n)
	for i := range calls {
		calls[i] = &Call{Header: api.Header{Op: api.OpPing}}
		wg.Add(1)
		c.Go(calls[i], func(*Call) { wg.Done() })
	}
	for got.Load() < n {
		time.Sleep(time.Millisecond)
	}
	srv.Close() // kills the connection under the client
	wg.Wait()
	for _, call := range calls {
		if !errors.Is(call.Err, ErrClosed) {
			t.Fatalf("pending call: %v, want ErrClosed", call.Err)
		}
	}
	if !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("Err() = %v", c.Err())
	}
	if err := c.Do(context.Background(), &Call{Header: api.Header{Op: api.OpPing}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("call on dead conn: %v", err)
	}
	if err := c.Send(api.Header{Op: api.OpRaft}, []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("send on dead conn: %v", err)
	}
}

func TestCloseFailsQueued(t *testing.T) {
	_, addr := startServer(t, ServerConfig{}, handlerFunc(func(ReplyWriter, api.Header, []byte) {}))
	c := dial(t, addr)
	var wg sync.WaitGroup
	calls := make([]*Call, 100)
	for i := range calls {
		calls[i] = &Call{Header: api.Header{Op: api.OpWrite}, Payload: make([]byte, 64<<10)}
		wg.Add(1)
		c.Go(calls[i], func(*Call) { wg.Done() })
	}
	c.Close()
	wg.Wait()
	for _, call := range calls {
		if !errors.Is(call.Err, ErrClosed) {
			t.Fatalf("call after Close: %v", call.Err)
		}
	}
}

func TestDoContextAbort(t *testing.T) {
	_, addr := startServer(t, ServerConfig{}, handlerFunc(func(rw ReplyWriter, h api.Header, _ []byte) {
		if h.Op == api.OpPing {
			rw.Reply(h, nil, nil)
		} // reads are never answered... until much later
		if h.Op == api.OpRead {
			time.AfterFunc(50*time.Millisecond, func() { rw.Reply(h, make([]byte, h.Length), nil) })
		}
	}))
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	buf := []byte("untouched")
	err := c.Do(ctx, &Call{Header: api.Header{Op: api.OpRead, Length: uint32(len(buf))}, ReadBuf: buf})
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do: %v", err)
	}
	time.Sleep(80 * time.Millisecond) // the late reply arrives and is discarded
	if string(buf) != "untouched" {
		t.Fatalf("aborted call's ReadBuf was written: %q", buf)
	}
	ping := &Call{Header: api.Header{Op: api.OpPing}}
	if err := c.Do(context.Background(), ping); err != nil || ping.Reply.Status != api.StatusOK {
		t.Fatalf("conn unusable after abort: %v", err)
	}
}

func TestShortReadBuf(t *testing.T) {
	_, addr := startServer(t, ServerConfig{}, echoHandler(2, 0))
	c := dial(t, addr)
	err := c.Do(context.Background(), &Call{Header: api.Header{Op: api.OpRead, Length: 100}, ReadBuf: make([]byte, 10)})
	if !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("Do: %v", err)
	}
	call := &Call{Header: api.Header{Op: api.OpRead, Length: 10}, ReadBuf: make([]byte, 10)}
	if err := c.Do(context.Background(), call); err != nil || call.Reply.PayloadLen != 10 {
		t.Fatalf("next call: %v", err)
	}
}

func TestStatusIsNotErr(t *testing.T) {
	_, addr := startServer(t, ServerConfig{}, handlerFunc(func(rw ReplyWriter, h api.Header, _ []byte) {
		h.Status, h.Hint = api.StatusNotLeader, 5
		rw.Reply(h, nil, nil)
	}))
	c := dial(t, addr)
	call := &Call{Header: api.Header{Op: api.OpWrite, Copyset: 3}, Payload: []byte("data")}
	if err := c.Do(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	if call.Reply.Status != api.StatusNotLeader || call.Reply.Hint != 5 || call.Reply.Copyset != 3 {
		t.Fatalf("reply %+v", call.Reply)
	}
}

// TestBackpressure: with MaxInFlight 4 and no replies, the server reads only 4
// requests; one-way frames are not held back by the bound; answering frees slots.
func TestBackpressure(t *testing.T) {
	var mu sync.Mutex
	var held []api.Header
	var raft atomic.Int32
	var rws []ReplyWriter
	released := make(chan struct{}, 100)
	_, addr := startServer(t, ServerConfig{MaxInFlight: 4}, handlerFunc(func(rw ReplyWriter, h api.Header, _ []byte) {
		if h.Op == api.OpRaft {
			raft.Add(1)
			return
		}
		mu.Lock()
		held = append(held, h)
		rws = append(rws, rw)
		mu.Unlock()
	}))
	c := dial(t, addr)
	for range 10 {
		if err := c.Send(api.Header{Op: api.OpRaft}, []byte("msg")); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		c.Go(&Call{Header: api.Header{Op: api.OpPing}}, func(*Call) { wg.Done() })
	}
	// Wait for the server to read what it may, then give it time to
	// (wrongly) read more.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(held)
		mu.Unlock()
		if n >= 4 && raft.Load() == 10 || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	n := len(held)
	mu.Unlock()
	if n != 4 {
		t.Fatalf("server read %d requests with MaxInFlight 4", n)
	}
	if raft.Load() != 10 {
		t.Fatalf("one-way frames delivered: %d", raft.Load())
	}
	// Answer as requests come in, until all 10 are done.
	for answered := 0; answered < 10; {
		mu.Lock()
		hs, ws := held, rws
		held, rws = nil, nil
		mu.Unlock()
		for i := range hs {
			ws[i].Reply(hs[i], nil, func() { released <- struct{}{} })
			answered++
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	if len(released) != 10 {
		t.Fatalf("release ran %d times for 10 replies", len(released))
	}
}

// TestOneWayOrder: Send frames arrive in order, with their payloads.
func TestOneWayOrder(t *testing.T) {
	got := make(chan uint64, 100)
	_, addr := startServer(t, ServerConfig{MaxInFlight: 1}, handlerFunc(func(_ ReplyWriter, h api.Header, p []byte) {
		if h.Op == api.OpRaft && binary.BigEndian.Uint64(p) == h.Hint {
			got <- h.Hint
		}
	}))
	c := dial(t, addr)
	for i := range uint64(100) {
		p := binary.BigEndian.AppendUint64(nil, i)
		if err := c.Send(api.Header{Op: api.OpRaft, Hint: i}, p); err != nil {
			t.Fatal(err)
		}
	}
	for i := range uint64(100) {
		select {
		case v := <-got:
			if v != i {
				t.Fatalf("frame %d arrived as %d", i, v)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("frame %d never arrived", i)
		}
	}
}

func TestRetain(t *testing.T) {
	kept := make(chan []byte, 2)
	_, addr := startServer(t, ServerConfig{}, handlerFunc(func(rw ReplyWriter, h api.Header, p []byte) {
		rw.Retain()
		kept <- p
		rw.Reply(h, nil, nil)
	}))
	c := dial(t, addr)
	a := []byte("first payload")
	b := []byte("other payload")
	for _, p := range [][]byte{a, b} {
		if err := c.Do(context.Background(), &Call{Header: api.Header{Op: api.OpWrite}, Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	if got := <-kept; string(got) != string(a) {
		t.Fatalf("retained payload overwritten: %q", got)
	}
}

// allocHandler keeps every payload, in buffers it allocates for frames of
// at least min bytes.
type allocHandler struct {
	min   int
	mu    sync.Mutex
	given map[*byte]bool // buffers AllocPayload returned
	kept  [][]byte
	own   []bool // kept[i] is a buffer AllocPayload returned
}

func (a *allocHandler) AllocPayload(h api.Header, n int) (*[]byte, int) {
	if n < a.min {
		return nil, 0
	}
	b := make([]byte, n+7)
	a.mu.Lock()
	a.given[&b[7]] = true
	a.mu.Unlock()
	return &b, 7
}

func (a *allocHandler) ServeFrame(rw ReplyWriter, h api.Header, p []byte) {
	a.mu.Lock()
	own := a.given[&p[0]]
	a.mu.Unlock()
	if buf, off := rw.(PayloadBufferer).PayloadBuffer(); own != (buf != nil) || own && &(*buf)[off] != &p[0] {
		panic("PayloadBuffer does not name the buffer AllocPayload gave")
	}
	if !own {
		rw.Retain()
	}
	a.mu.Lock()
	a.kept = append(a.kept, p)
	a.own = append(a.own, own)
	a.mu.Unlock()
	rw.Reply(h, nil, nil)
}

// A PayloadAllocator's buffers receive the payloads it asked for, exactly,
// and the server never reuses them; a vectored payload (Call.Vec) arrives
// as its pieces concatenated.
func TestPayloadAllocatorAndVec(t *testing.T) {
	a := &allocHandler{min: 1000, given: map[*byte]bool{}}
	_, addr := startServer(t, ServerConfig{}, a)
	c := dial(t, addr)
	var want [][]byte
	for i, n := range []int{10, 5000, 999, 1000, 70000, 20} {
		p := make([]byte, n)
		pattern(p, uint64(i))
		want = append(want, p)
		call := &Call{Header: api.Header{Op: api.OpWrite}, Payload: p[:n/3], Vec: [][]byte{p[n/3 : n/2], nil, p[n/2:]}}
		if err := c.Do(context.Background(), call); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, p := range want {
		if string(a.kept[i]) != string(p) {
			t.Fatalf("payload %d (%d bytes) arrived as %d bytes, or was overwritten later", i, len(p), len(a.kept[i]))
		}
		if own := len(p) >= a.min; a.own[i] != own {
			t.Fatalf("payload %d (%d bytes): in an allocated buffer %v, want %v", i, len(p), a.own[i], own)
		}
	}
}

// TestServerBadInput: garbage closes the connection; the server keeps serving.
func TestServerBadInput(t *testing.T) {
	_, addr := startServer(t, ServerConfig{}, echoHandler(3, 0))
	var huge [api.HeaderSize]byte
	(&api.Header{Op: api.OpWrite}).Encode(huge[:])
	binary.BigEndian.PutUint32(huge[20:], api.MaxPayload+1)
	var trunc [api.HeaderSize]byte
	(&api.Header{Op: api.OpWrite, PayloadLen: 100}).Encode(trunc[:])
	var reply [api.HeaderSize]byte
	(&api.Header{Op: api.OpRead, Flags: api.FlagReply}).Encode(reply[:])
	for name, in := range map[string][]byte{
		"garbage":   []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 64))),
		"huge":      huge[:],
		"truncated": append(trunc[:], 1, 2, 3),
		"reply":     reply[:],
		"short":     huge[:10],
	} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Write(in); err != nil {
			t.Fatal(err)
		}
		if name == "truncated" || name == "short" {
			nc.(*net.TCPConn).CloseWrite()
		}
		nc.SetReadDeadline(time.Now().Add(60 * time.Second))
		var b [1]byte
		if n, err := nc.Read(b[:]); n != 0 || err == nil || errors.Is(err, ErrClosed) {
			t.Fatalf("%s: connection not closed by server: n=%d err=%v", name, n, err)
		}
		nc.Close()
	}
	c := dial(t, addr)
	if err := c.Do(context.Background(), &Call{Header: api.Header{Op: api.OpPing}}); err != nil {
		t.Fatalf("server stopped serving: %v", err)
	}
}

// FuzzServerConn feeds arbitrary bytes to a server connection: it must never panic
// nor hang.
func FuzzServerConn(f *testing.F) {
	var b [api.HeaderSize]byte
	(&api.Header{Op: api.OpWrite, PayloadLen: 4, Length: 4}).Encode(b[:])
	f.Add(append(b[:], 1, 2, 3, 4))
	(&api.Header{Op: api.OpRaft, PayloadLen: 2}).Encode(b[:])
	f.Add(append(b[:], 1))
	f.Add([]byte("BSLT\x01"))
	f.Fuzz(func(t *testing.T, in []byte) {
		srv := NewServer(ServerConfig{MaxPayload: 1 << 16, MaxInFlight: 2}, echoHandler(4, 0))
		cli, sc := net.Pipe()
		srv.ServeConn(sc)
		go func() {
			var sink [4096]byte
			for {
				if _, err := cli.Read(sink[:]); err != nil {
					return
				}
			}
		}()
		cli.Write(in)
		cli.Close()
		srv.Close()
	})
}

// TestAbortRacesReplies: calls with deadlines close to the server's random delays,
// so aborts race replies. Each Do returns either the right data or ErrAborted, and
// once Do returned, its buffer is never written again.
func TestAbortRacesReplies(t *testing.T) {
	_, addr := startServer(t, ServerConfig{}, echoHandler(5, 4*time.Millisecond))
	c := dial(t, addr)
	const workers, perWorker = 16, 60
	var wg sync.WaitGroup
	var ok, aborted atomic.Int32
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 11))
			var done [][]byte
			for i := range perWorker {
				buf := make([]byte, 1024)
				off := uint64(w)<<32 | uint64(i)<<12
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(4*time.Millisecond))))
				err := c.Do(ctx, &Call{Header: api.Header{Op: api.OpRead, Offset: off, Length: 1024}, ReadBuf: buf})
				cancel()
				switch {
				case err == nil:
					want := make([]byte, 1024)
					pattern(want, off)
					if string(buf) != string(want) {
						errs <- errors.New("wrong data")
						return
					}
					ok.Add(1)
				case errors.Is(err, ErrAborted):
					aborted.Add(1)
				default:
					errs <- err
					return
				}
				clear(buf)
				done = append(done, buf)
			}
			time.Sleep(10 * time.Millisecond) // late replies arrive
			for _, b := range done {
				for _, x := range b {
					if x != 0 {
						errs <- errors.New("a buffer was written after Do returned")
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ok.Load() == 0 || aborted.Load() == 0 {
		t.Fatalf("no race exercised: %d ok, %d aborted", ok.Load(), aborted.Load())
	}
	if err := c.Do(context.Background(), &Call{Header: api.Header{Op: api.OpPing}}); err != nil {
		t.Fatalf("conn after the aborts: %v", err)
	}
}

// TestSnapshotFramesBypassBound: with the only in-flight slot held by an
// unanswered request, answered OpSnapshot frames still flow.
func TestSnapshotFramesBypassBound(t *testing.T) {
	_, addr := startServer(t, ServerConfig{MaxInFlight: 1}, handlerFunc(func(rw ReplyWriter, h api.Header, p []byte) {
		if h.Op == api.OpSnapshot {
			h.Hint = uint64(len(p))
			rw.Reply(h, nil, nil)
		} // OpPing: never answered, holds the slot
	}))
	c := dial(t, addr)
	c.Go(&Call{Header: api.Header{Op: api.OpPing}}, func(*Call) {})
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		call := &Call{Header: api.Header{Op: api.OpSnapshot, Offset: uint64(i)}, Payload: make([]byte, 100+i)}
		err := c.Do(ctx, call)
		cancel()
		if err != nil || call.Reply.Hint != uint64(100+i) {
			t.Fatalf("snapshot frame %d: %v, hint %d", i, err, call.Reply.Hint)
		}
	}
}

// TestAbortWhileWriting: the server took a request's header and then stopped
// reading (as a server whose requests all hang does at MaxInFlight), so the
// request's large payload can never be written. Aborting it must still end it
// (and the call queued behind it) rather than wait for the write forever: the
// writer holds the call until its write ends, which only closing the connection
// does. Without that, Abort left the call in flight and done never ran.
func TestAbortWhileWriting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gotHeader := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			gotHeader <- err
			return
		}
		t.Cleanup(func() { nc.Close() })
		var hb [api.HeaderSize]byte
		if _, err := io.ReadFull(nc, hb[:]); err != nil {
			gotHeader <- err
			return
		}
		_, err = api.DecodeHeader(hb[:])
		gotHeader <- err // and never read again
	}()
	c := dial(t, ln.Addr().String())

	// More than any socket buffers hold: the write stays in progress.
	big := &Call{Header: api.Header{Op: api.OpWrite, Length: 64 << 20}, Payload: make([]byte, 64<<20)}
	bigDone := make(chan struct{})
	c.Go(big, func(*Call) { close(bigDone) })
	if err := <-gotHeader; err != nil {
		t.Fatal(err)
	}
	behind := &Call{Header: api.Header{Op: api.OpPing}}
	behindDone := make(chan struct{})
	c.Go(behind, func(*Call) { close(behindDone) })

	cause := errors.New("test timeout")
	c.Abort(big, cause)
	for _, w := range []struct {
		name string
		call *Call
		done chan struct{}
		want error
	}{{"aborted call", big, bigDone, ErrAborted}, {"call queued behind it", behind, behindDone, ErrClosed}} {
		select {
		case <-w.done:
		case <-time.After(30 * time.Second): // a hang, not slowness
			t.Fatalf("%s: done did not run 30 s after the Abort", w.name)
		}
		if !errors.Is(w.call.Err, w.want) {
			t.Errorf("%s: err %v, want %v", w.name, w.call.Err, w.want)
		}
	}
	if !errors.Is(big.Err, cause) {
		t.Errorf("aborted call: err %v does not name the cause", big.Err)
	}
	if err := c.Err(); !errors.Is(err, ErrClosed) {
		t.Errorf("connection after the abort: %v, want closed", err)
	}
}
