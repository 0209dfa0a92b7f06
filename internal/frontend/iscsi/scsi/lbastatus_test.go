package scsi

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
)

// mapBackend is memBackend with a map (frontend.Mapper): a write allocates
// the granules it touches, a trim frees those it covers whole.
type mapBackend struct {
	memBackend
	alloc []bool
	fail  error
}

func (m *mapBackend) Submit(op api.Op, buf []byte, off, n int64, done func(error)) {
	m.memBackend.Submit(op, buf, off, n, func(err error) {
		if err == nil {
			m.mu.Lock()
			switch op {
			case api.OpWrite:
				for g := off / api.MapGranule; g < (off+n+api.MapGranule-1)/api.MapGranule; g++ {
					m.alloc[g] = true
				}
			case api.OpTrim, api.OpWriteZeroes:
				for g := (off + api.MapGranule - 1) / api.MapGranule; g < (off+n)/api.MapGranule; g++ {
					m.alloc[g] = false
				}
			}
			m.mu.Unlock()
		}
		done(err)
	})
}

func (m *mapBackend) Mapped(bits []byte, off, length int64, done func(error)) {
	if off%api.MapAlign != 0 || length%api.MapAlign != 0 || length == 0 || off+length > int64(len(m.data)) ||
		int64(len(bits)) != api.MappedBytes(length) {
		m.t.Errorf("Mapper contract broken: off %d len %d bits %d", off, length, len(bits))
		done(frontend.ErrInvalid)
		return
	}
	if m.fail != nil {
		done(m.fail)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(bits)
	for i := range length / api.MapGranule {
		if m.alloc[off/api.MapGranule+i] {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	done(nil)
}

func getLBAStatus(lba uint64, alloc uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0], cdb[1] = 0x9e, 0x12
	binary.BigEndian.PutUint64(cdb[2:], lba)
	binary.BigEndian.PutUint32(cdb[10:], alloc)
	return cdb
}

// descriptors decodes GET LBA STATUS data as "lba+n:status" strings.
func descriptors(t *testing.T, r Result) []string {
	t.Helper()
	if r.Status != StatusGood || len(r.Data) < 8 {
		t.Fatalf("GET LBA STATUS: status %#x, sense %v, %d bytes", r.Status, r.Sense, len(r.Data))
	}
	if n := binary.BigEndian.Uint32(r.Data); int(n) != len(r.Data)-4 || (n-4)%16 != 0 {
		t.Fatalf("parameter data length %d for %d bytes", n, len(r.Data))
	}
	var out []string
	for d := r.Data[8:]; len(d) >= 16; d = d[16:] {
		st := map[byte]string{0: "mapped", 1: "deallocated"}[d[12]&0x0f]
		out = append(out, fmt.Sprintf("%d+%d:%s", binary.BigEndian.Uint64(d), binary.BigEndian.Uint32(d[8:]), st))
	}
	return out
}

// GET LBA STATUS reports the blocks the backend's map says hold no data as
// deallocated, from the starting LBA, as many runs as the allocation length
// takes; the device's tail the map does not cover is mapped.
func TestGetLBAStatusFromTheMap(t *testing.T) {
	const size = 1<<20 + 8<<10 // 2064 blocks: the last 16 past the last whole MapAlign
	b := &mapBackend{memBackend: memBackend{t: t, data: make([]byte, size)}, alloc: make([]bool, size/api.MapGranule)}
	lu := New(Config{Backend: b, Info: b.Info(), ID: 1, TargetName: "iqn.2026-11.io.basalt:c:v"})
	want := func(what string, got []string, w ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s: %v, want %v", what, got, w)
		}
	}
	want("a new device", descriptors(t, run(t, lu, getLBAStatus(0, 1024), nil)), "0+2048:deallocated", "2048+16:mapped")
	// 4 KiB at block 64, and one block at 1000 (its granule: 1000..1007).
	if r := run(t, lu, cdb10(0x2a, 64, 8), make([]byte, 4096)); r.Status != StatusGood {
		t.Fatal(r.Sense)
	}
	if r := run(t, lu, cdb10(0x2a, 1001, 1), make([]byte, 512)); r.Status != StatusGood {
		t.Fatal(r.Sense)
	}
	want("after writes", descriptors(t, run(t, lu, getLBAStatus(0, 1024), nil)),
		"0+64:deallocated", "64+8:mapped", "72+928:deallocated", "1000+8:mapped", "1008+1040:deallocated", "2048+16:mapped")
	want("from inside a run", descriptors(t, run(t, lu, getLBAStatus(66, 1024), nil)),
		"66+6:mapped", "72+928:deallocated", "1000+8:mapped", "1008+1040:deallocated", "2048+16:mapped")
	want("one descriptor's room", descriptors(t, run(t, lu, getLBAStatus(66, 24), nil)), "66+6:mapped")
	want("in the tail", descriptors(t, run(t, lu, getLBAStatus(2050, 1024), nil)), "2050+14:mapped")
	// UNMAP of the 4 KiB frees it again.
	unmap := []byte{0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0}
	param := make([]byte, 24)
	binary.BigEndian.PutUint16(param[0:], 22)
	binary.BigEndian.PutUint16(param[2:], 16)
	binary.BigEndian.PutUint64(param[8:], 64)
	binary.BigEndian.PutUint32(param[16:], 8)
	if r := run(t, lu, unmap, param); r.Status != StatusGood {
		t.Fatal(r.Sense)
	}
	want("after UNMAP", descriptors(t, run(t, lu, getLBAStatus(0, 1024), nil)),
		"0+1000:deallocated", "1000+8:mapped", "1008+1040:deallocated", "2048+16:mapped")
	// Past the end: refused; a map that cannot be read: the failure's sense.
	if r := run(t, lu, getLBAStatus(size/512, 1024), nil); r.Status != StatusCheckCondition {
		t.Errorf("GET LBA STATUS past the end: status %#x", r.Status)
	}
	b.fail = fmt.Errorf("%w: the chunkservers are away", frontend.ErrUnavailable)
	if r := run(t, lu, getLBAStatus(0, 1024), nil); r.Status != StatusCheckCondition || r.Sense == nil {
		t.Errorf("GET LBA STATUS with the map unreadable: status %#x", r.Status)
	} else if s := senseOf(r); s[0] != 0x02 {
		t.Errorf("GET LBA STATUS with the map unreadable: sense %x, want NOT READY", s)
	}
}

// cdb10 is a 10-byte READ/WRITE CDB.
func cdb10(op byte, lba uint32, blocks uint16) []byte {
	c := make([]byte, 10)
	c[0] = op
	binary.BigEndian.PutUint32(c[2:], lba)
	binary.BigEndian.PutUint16(c[7:], blocks)
	return c
}
