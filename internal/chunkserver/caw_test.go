package chunkserver

import (
	"bytes"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// cawOff is a 4 KiB block the compare-and-write tests use: chunk 2.
const cawOff = 2*hChunk + 8192

func cawHdr(off uint64, n uint32, seq uint64) api.Header {
	h := ioHdr(api.OpCompareAndWrite, off, n)
	h.Seq = seq
	return h
}

func fill(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

// goIO sends one frame without waiting; the reply comes on the channel.
func goIO(c *transport.Conn, h api.Header, payload []byte) <-chan api.Header {
	ch := make(chan api.Header, 1)
	call := &transport.Call{Header: h, Payload: payload, ReadBuf: make([]byte, hChunk)}
	c.Go(call, func(call *transport.Call) {
		if call.Err != nil {
			call.Reply.Status = api.StatusIOError
		}
		ch <- call.Reply
	})
	return ch
}

// pollUntil waits (generously) for cond.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

func (e *handlerEnv) replicaAt(off uint64) *replica {
	return e.hd.replica(api.GroupID(hPool, csOf(hVolume, off)))
}

func (e *handlerEnv) readBlock(c *transport.Conn, off uint64, n uint32) []byte {
	e.t.Helper()
	h := ioHdr(api.OpRead, off, n)
	r, p := e.do(c, h, nil)
	if r.Status != api.StatusOK {
		e.t.Fatalf("read: %v", r.Status)
	}
	return bytes.Clone(p)
}

// TestCompareAndWrite: equal data is replaced; different data is left and
// the answer names the first differing byte; bad requests are refused.
func TestCompareAndWrite(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	a, b := fill('a', 4096), fill('b', 4096)
	if r, _ := e.do(c, ioHdr(api.OpWrite, cawOff, 4096), a); r.Status != api.StatusOK {
		t.Fatalf("write: %v", r.Status)
	}
	if r, _ := e.do(c, cawHdr(cawOff, 4096, 0), append(bytes.Clone(a), b...)); r.Status != api.StatusOK {
		t.Fatalf("compare-and-write a→b: %v", r.Status)
	}
	if got := e.readBlock(c, cawOff, 4096); !bytes.Equal(got, b) {
		t.Fatal("compare-and-write a→b did not write b")
	}
	cmp := bytes.Clone(b)
	cmp[1234] = 'x'
	r, _ := e.do(c, cawHdr(cawOff, 4096, 0), append(cmp, fill('c', 4096)...))
	if r.Status != api.StatusMiscompare || r.Hint != 1234 {
		t.Fatalf("compare-and-write with byte 1234 different: %v hint %d, want MISCOMPARE at 1234", r.Status, r.Hint)
	}
	if got := e.readBlock(c, cawOff, 4096); !bytes.Equal(got, b) {
		t.Fatal("a miscompare wrote")
	}
	for _, tc := range []struct {
		name string
		h    api.Header
		p    []byte
		want api.Status
	}{
		{"half a payload", cawHdr(cawOff, 4096, 0), b, api.StatusBadRequest},
		{"over 64 KiB", cawHdr(0, 64<<10+512, 0), make([]byte, 2*(64<<10+512)), api.StatusBadRequest},
		{"across a chunk", cawHdr(hChunk-512, 1024, 0), make([]byte, 2048), api.StatusOutOfRange},
		{"read-only", func() api.Header { h := cawHdr(cawOff, 4096, 0); h.Epoch = 0; return h }(), append(bytes.Clone(b), b...), api.StatusReadOnly},
	} {
		if r, _ := e.do(c, tc.h, tc.p); r.Status != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, r.Status, tc.want)
		}
	}
}

// TestCompareAndWriteWaitsForWritesInFlight: a compare-and-write arriving
// while an overlapping write is proposed but not applied compares with the
// data that write leaves, not with what was there before it. Without the
// gate it compared with the old data, matched, and its write landed after
// the other: an update lost.
func TestCompareAndWriteWaitsForWritesInFlight(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	e.host.mu.Lock()
	e.host.hold = true
	e.host.mu.Unlock()
	w := fill('w', 4096)
	wr := goIO(c, ioHdr(api.OpWrite, cawOff, 4096), w)
	pollUntil(t, "the write is proposed", func() bool { return e.host.nParked() == 1 })
	// Compare with what is there now (zeros: never written).
	cr := goIO(c, cawHdr(cawOff+512, 512, 0), append(make([]byte, 512), fill('x', 512)...))
	g := &e.replicaAt(cawOff).gate
	// It waits in the gate (without one, it compares now and proposes).
	pollUntil(t, "the compare-and-write waits in the gate or proposes", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queued) == 1 || e.host.nParked() == 2
	})
	e.host.release()
	if r := <-wr; r.Status != api.StatusOK {
		t.Fatalf("write: %v", r.Status)
	}
	if r := <-cr; r.Status != api.StatusMiscompare || r.Hint != 0 {
		t.Fatalf("compare-and-write after the write in flight: %v hint %d, want MISCOMPARE at 0", r.Status, r.Hint)
	}
	if got := e.readBlock(c, cawOff, 4096); !bytes.Equal(got, w) {
		t.Fatal("the block does not hold the write")
	}
}

// TestWritesWaitForCompareAndWrite: while a compare-and-write is in flight,
// an overlapping write waits until it is done (then lands after it); a
// write elsewhere does not wait.
func TestWritesWaitForCompareAndWrite(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	e.host.mu.Lock()
	e.host.hold = true
	e.host.mu.Unlock()
	x, w, n := fill('x', 4096), fill('w', 1024), fill('n', 4096)
	cr := goIO(c, cawHdr(cawOff, 4096, 0), append(make([]byte, 4096), x...))
	pollUntil(t, "the compare-and-write's write is proposed", func() bool { return e.host.nParked() == 1 })
	wr := goIO(c, ioHdr(api.OpWrite, cawOff+2048, 1024), w) // overlaps
	g := &e.replicaAt(cawOff).gate
	pollUntil(t, "the overlapping write waits in the gate or is proposed", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.queued) == 1 || e.host.nParked() == 2
	})
	if k := e.host.nParked(); k != 1 {
		t.Fatalf("%d proposals while a compare-and-write holds the range, want its own only", k)
	}
	nr := goIO(c, ioHdr(api.OpWrite, cawOff+4096, 4096), n) // the next block: does not wait
	pollUntil(t, "the write elsewhere is proposed", func() bool { return e.host.nParked() == 2 })
	e.host.release()
	for what, ch := range map[string]<-chan api.Header{"compare-and-write": cr, "overlapping write": wr, "other write": nr} {
		if r := <-ch; r.Status != api.StatusOK {
			t.Fatalf("%s: %v", what, r.Status)
		}
	}
	want := bytes.Clone(x)
	copy(want[2048:], w)
	want = append(want, n...)
	if got := e.readBlock(c, cawOff, 8192); !bytes.Equal(got, want) {
		t.Fatal("the blocks do not hold the compare-and-write, then the overlapping write, and the other write")
	}
}

// TestRetriedCompareAndWrite: a retry (same Seq) of a compare-and-write
// whose write was applied is answered OK — compared again it would
// miscompare against its own write — while a new one is compared.
func TestRetriedCompareAndWrite(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	req := append(make([]byte, 4096), fill('x', 4096)...)
	if r, _ := e.do(c, cawHdr(cawOff, 4096, 1), req); r.Status != api.StatusOK {
		t.Fatalf("compare-and-write: %v", r.Status)
	}
	if r, _ := e.do(c, cawHdr(cawOff, 4096, 1), req); r.Status != api.StatusOK {
		t.Fatalf("its retry: %v, want OK (applied already)", r.Status)
	}
	if r, _ := e.do(c, cawHdr(cawOff, 4096, 2), req); r.Status != api.StatusMiscompare {
		t.Fatalf("a new compare-and-write of the same bytes: %v, want MISCOMPARE", r.Status)
	}
	// A request the writer settled is stale, not compared.
	h := cawHdr(cawOff, 4096, 3)
	h.Settled = 3
	if r, _ := e.do(c, h, append(fill('x', 4096), fill('y', 4096)...)); r.Status != api.StatusOK {
		t.Fatalf("compare-and-write 3: %v", r.Status)
	}
	if r, _ := e.do(c, cawHdr(cawOff, 4096, 2), req); r.Status != api.StatusStaleRequest {
		t.Fatalf("compare-and-write 2 after 3 settled it: %v, want STALE_REQUEST", r.Status)
	}
}

// TestCompareAndWriteTermMoved: the write of a compare-and-write is proposed
// only in the term its read barrier held in; when the term moved in between,
// the answer is NOT_LEADER (the client retries) and nothing is written.
func TestCompareAndWriteTermMoved(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	e.host.mu.Lock()
	e.host.moveTerm = true
	e.host.mu.Unlock()
	rep, _ := e.do(c, cawHdr(cawOff, 4096, 0), append(make([]byte, 4096), fill('x', 4096)...))
	if rep.Status != api.StatusNotLeader {
		t.Fatalf("compare-and-write with the term moved after its barrier: %v, want NOT_LEADER", rep.Status)
	}
	if got := e.readBlock(c, cawOff, 4096); !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("written though the term moved")
	}
}
