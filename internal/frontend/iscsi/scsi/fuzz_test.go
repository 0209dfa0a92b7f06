package scsi

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
)

// memBackend is a small in-memory backend that checks the Backend contract.
type memBackend struct {
	t    testing.TB
	mu   sync.Mutex
	data []byte
	ro   bool
}

func (m *memBackend) Info() frontend.Info {
	m.mu.Lock()
	size := len(m.data)
	m.mu.Unlock()
	return frontend.Info{Size: int64(size), ReadOnly: m.ro, CanFlush: true, CanTrim: !m.ro, CanWriteZeroes: !m.ro,
		BlockSizes: frontend.BlockSizes{Minimum: 1, Preferred: 4096}}
}
func (m *memBackend) Check(context.Context) error { return nil }
func (m *memBackend) Close() error                { return nil }
func (m *memBackend) Submit(op api.Op, buf []byte, off, n int64, done func(error)) {
	bad := off < 0 || n < 0 || off+n > int64(len(m.data))
	switch op {
	case api.OpRead, api.OpWrite:
		bad = bad || n == 0 || int64(len(buf)) != n || (op == api.OpWrite && m.ro)
	case api.OpTrim, api.OpWriteZeroes:
		bad = bad || n == 0 || buf != nil || m.ro
	case api.OpFlush:
		bad = bad || buf != nil || off != 0 || n != 0
	default:
		bad = true
	}
	if bad {
		m.t.Errorf("backend contract broken: op %v off %d len %d buf %d", op, off, n, len(buf))
		done(frontend.ErrInvalid)
		return
	}
	m.mu.Lock()
	switch op {
	case api.OpRead:
		copy(buf, m.data[off:])
	case api.OpWrite:
		copy(m.data[off:], buf)
	case api.OpTrim, api.OpWriteZeroes:
		clear(m.data[off : off+n])
	}
	m.mu.Unlock()
	done(nil)
}

func newLU(t testing.TB, size int, ro bool) *LU {
	b := &memBackend{t: t, data: make([]byte, size), ro: ro}
	info := b.Info()
	return New(Config{Backend: b, Info: info, ID: 42, TargetName: "iqn.2026-11.io.basalt:c:v", MaxTransfer: 64 << 10})
}

// run decodes and executes cdb with dataOut and waits for the result.
func run(t testing.TB, lu *LU, cdb, dataOut []byte) Result {
	t.Helper()
	c, s := Decode(cdb, lu.BlockSize())
	if s != nil {
		return check(s)
	}
	ch := make(chan Result, 2)
	lu.Execute(c, dataOut, func(r Result) { ch <- r })
	select {
	case r := <-ch:
		if len(ch) != 0 {
			t.Fatalf("done called twice")
		}
		return r
	case <-time.After(time.Minute):
		t.Fatalf("command % x never completed", cdb)
	}
	return Result{}
}

// FuzzCDB: any CDB with any data either decodes into a command whose
// transfer sizes are sane or is refused with sense data; executing it calls
// done exactly once, keeps to the backend's contract, and answers at most
// its allocation length.
func FuzzCDB(f *testing.F) {
	for _, seed := range [][]byte{
		{0x12, 0, 0, 0, 96, 0}, {0x12, 1, 0x83, 0, 255, 0}, {0x12, 1, 0xb0, 0, 64, 0},
		{0x28, 0, 0, 0, 0, 1, 0, 0, 8, 0}, {0x2a, 8, 0, 0, 0, 0, 0, 0, 1, 0},
		{0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0},
		{0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 24, 0, 0},
		{0x89, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0},
		{0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0},
		{0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0}, {0x1a, 0, 0x3f, 0, 255, 0}, {0x5a, 0x10, 0x08, 0, 0, 0, 0, 1, 0, 0},
		{0xa3, 0x0c, 0x82, 0x9e, 0, 0x10, 0, 0, 1, 0, 0, 0}, {0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
		{0x2f, 0x02, 0, 0, 0, 0, 0, 0, 1, 0}, {0x08, 0, 0, 1, 0, 0}, {0x03, 1, 0, 0, 8, 0},
	} {
		f.Add(seed, []byte{0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0}, false)
	}
	f.Fuzz(func(t *testing.T, cdb, data []byte, ro bool) {
		lu := newLU(t, 1<<20, ro)
		c, s := Decode(cdb, lu.BlockSize())
		if s != nil {
			if s.Key == 0 {
				t.Fatalf("refused with NO SENSE")
			}
			return
		}
		if c.DataOut < 0 || c.DataIn < 0 {
			t.Fatalf("negative transfer: out %d in %d", c.DataOut, c.DataIn)
		}
		if c.DataOut > 64<<20 {
			return // the iSCSI layer never buffers that much (MaxTransfer)
		}
		out := make([]byte, c.DataOut)
		copy(out, data)
		r := run(t, lu, cdb, out)
		if r.Status == StatusGood && r.Sense != nil || r.Status == StatusCheckCondition && r.Sense == nil {
			t.Fatalf("status %#x with sense %v", r.Status, r.Sense)
		}
		if len(r.Data) > c.DataIn && c.Dir == DirIn {
			t.Fatalf("%d bytes of data-in for an allocation of %d", len(r.Data), c.DataIn)
		}
		if r.Sense != nil {
			if b := r.Sense.Fixed(); len(b) != 18 || b[0]&0x7f != 0x70 {
				t.Fatalf("bad fixed sense % x", b)
			}
		}
	})
}
