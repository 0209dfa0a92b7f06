package scsi

import (
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// newDisk is an in-memory backend of size bytes that fails t when the LU
// breaks the Backend contract; an LU takes its Info as it is, so the block
// sizes are set.
func newDisk(t testing.TB, size int, ro bool) *frontendtest.Disk {
	d := frontendtest.NewDisk(size)
	d.T, d.ReadOnly = t, ro
	d.BlockSizes = frontend.BlockSizes{Minimum: 1, Preferred: 4096}
	return d
}

func newLU(t testing.TB, size int, ro bool) *LU {
	b := newDisk(t, size, ro)
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
		{0x15, 0x10, 0, 0, 28, 0}, {0x55, 0x10, 0, 0, 0, 0, 0, 0, 28, 0},
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
