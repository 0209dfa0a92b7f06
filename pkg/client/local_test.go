package client

import (
	"bytes"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basalt-storage/basalt/pkg/api"
)

// fakeLocal serves fake chunkserver id in process, as a chunkserver's Local does.
type fakeLocal struct {
	s     *fakeServer
	calls atomic.Int64
}

func (l *fakeLocal) LocalID() uint64 { return l.s.id }

func (l *fakeLocal) Go(req api.Header, payload, readBuf []byte, done func(api.Header)) {
	l.calls.Add(1)
	l.s.serve(localReply{readBuf, done}, req, payload)
}

type localReply struct {
	readBuf []byte
	done    func(api.Header)
}

func (r localReply) Reply(h api.Header, payload []byte, release func()) {
	n := copy(r.readBuf, payload)
	h.PayloadLen = uint32(n)
	if release != nil {
		release()
	}
	r.done(h)
}
func (localReply) Retain()              {}
func (localReply) RemoteAddr() net.Addr { return nil }

// TestLocalFastPath: pieces whose leader is the Local chunkserver never touch its
// socket; the rest go over connections as usual, and the data is the same.
func TestLocalFastPath(t *testing.T) {
	c := newFakeCluster(t)
	var remoteToLocal atomic.Int64
	c.setHook(func(server uint64, h api.Header) action {
		if server == 1 && h.Op != api.OpPing {
			remoteToLocal.Add(1)
		}
		return serve
	})
	l := &fakeLocal{s: c.servers[1]}
	reg := prometheus.NewRegistry()
	v := c.open(t, func(cfg *Config) { cfg.Local = l; cfg.Metrics = NewMetrics(reg) })
	r := rand.New(rand.NewPCG(2, 2))
	model := make([]byte, tSize)
	for range 40 {
		n := 1 + r.IntN(3*tChunk)
		off := r.Int64N(tSize - int64(n))
		p := randBytes(r, n)
		if _, err := v.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	got := make([]byte, tSize)
	if _, err := v.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("volume differs from the model")
	}
	if l.calls.Load() == 0 {
		t.Fatal("the local fast path was never used")
	}
	if n := remoteToLocal.Load(); n != 0 {
		t.Fatalf("%d frames went over a socket to the local chunkserver", n)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counter := func(name, op string) float64 {
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, lp := range m.GetLabel() {
					if op == "" || lp.GetName() == "op" && lp.GetValue() == op {
						return m.GetCounter().GetValue()
					}
				}
				if op == "" {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}
	if n := counter("basalt_client_local_attempts_total", ""); n != float64(l.calls.Load()) {
		t.Fatalf("local_attempts_total %v, want %d", n, l.calls.Load())
	}
	if n := counter("basalt_client_io_total", "write"); n != 40 {
		t.Fatalf("io_total{op=write} %v, want 40", n)
	}
}
