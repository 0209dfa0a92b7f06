package wal

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// misaligned returns n random bytes whose address is off past a page
// boundary (memory outside the Go heap, unmapped when the test ends).
func misaligned(t testing.TB, n, off int, rng *rand.Rand) []byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, int(roundUp(int64(n+off))), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	b := m[off : off+n : off+n]
	rng.Read(b)
	return b
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// decodeEntriesRecord decodes the entries record at b[0:] (sealed for seq).
func decodeEntriesRecord(t *testing.T, b []byte, seq uint64) []*pb.Entry {
	t.Helper()
	n, st := checkRecord(b, segTag(seq))
	if st != recOK {
		t.Fatalf("record state %v", st)
	}
	d := &decoder{b: b[recHeaderSize : recHeaderSize+n]}
	if typ := d.u8(); typ != recEntries {
		t.Fatalf("record type %d", typ)
	}
	_, first, count := d.u64(), d.u64(), d.u32()
	var out []*pb.Entry
	for i := range uint64(count) {
		term, et, size := d.u64(), d.u8(), d.u32()
		if et&entryPadded != 0 {
			d.bytes(int(d.u16()))
		}
		e := &pb.Entry{Term: new(term), Index: new(first + i), Type: new(pb.EntryType(et &^ (entryHasData | entryPadded)))}
		if data := d.bytes(int(size)); et&entryHasData != 0 {
			e.Data = append([]byte{}, data...)
		}
		out = append(out, e)
	}
	if d.err != nil || d.off != len(d.b) {
		t.Fatalf("decode: %v, %d of %d bytes", d.err, d.off, len(d.b))
	}
	return out
}

// TestEntriesByReference: large entries (refMinBytes and more) are left out
// of the buffer and referenced, padded so that each one's offset in the batch
// and its address agree modulo dioAlign, whatever its alignment in memory; the
// batch (buffer and data pieces) is the record, whose length and CRC are good
// and whose entries decode to those given; sealing a batch in place, without
// its data, makes the same records as sealing it whole.
func TestEntriesByReference(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	var ents []*pb.Entry
	for i := range 12 {
		size := rng.Intn(3000)
		if i%3 == 1 {
			size = refMinBytes + rng.Intn(50<<10)
		}
		e := mkEnts(uint64(i+1), 1, 1, size, int64(i))[0]
		if i%3 == 1 {
			e.Data = misaligned(t, size, []int{0, 1, 40, 511}[i/3], rng)
		}
		ents = append(ents, e)
	}
	var refs []dataRef
	got := appendEntries([]byte("prefix"), 7, ents, &refs)
	if len(refs) != 4 {
		t.Fatalf("%d refs, want 4", len(refs))
	}
	for _, r := range refs {
		if (addrOf(r.data)-uintptr(r.off))%dioAlign != 0 {
			t.Fatalf("data of %d bytes at %d has address %#x: not congruent modulo %d", len(r.data), r.off, addrOf(r.data), dioAlign)
		}
	}
	whole := bytes.Join(batchIOV(nil, got, refs), nil)
	if len(whole) != batchSize(got, refs) {
		t.Fatalf("batch of %d bytes, batchSize says %d", len(whole), batchSize(got, refs))
	}
	rec := whole[len("prefix"):]
	sealRecords(rec, nil, 1)
	dec := decodeEntriesRecord(t, rec, 1)
	if len(dec) != len(ents) {
		t.Fatalf("%d entries decoded, want %d", len(dec), len(ents))
	}
	for i := range ents {
		if !proto.Equal(dec[i], ents[i]) {
			t.Fatalf("entry %d decodes differently", i)
		}
	}

	refs = nil
	b := appendEntries(nil, 7, ents[:6], &refs)
	b = appendHardState(b, 7, hardState{term: 1, vote: 2, commit: 3})
	b = appendEntries(b, 8, ents[6:], &refs)
	sealRecords(b, refs, 9)
	whole = bytes.Join(batchIOV(nil, b, refs), nil)
	n := 0
	for off := 0; off < len(whole); n++ {
		l, st := checkRecord(whole[off:], segTag(9))
		if st != recOK {
			t.Fatalf("record %d at %d: state %v", n, off, st)
		}
		off += recHeaderSize + l
	}
	if n != 3 {
		t.Fatalf("%d records, want 3", n)
	}
}

// Batches of large entries at every alignment in memory, written with
// O_DIRECT at offsets that are not aligned either, read back the same from
// the cache, from the disk and after a restart — and their data went to the
// disk from the entries themselves, not through the gathering buffer.
func TestDirectWriteInPlace(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, func(c *Config) { c.SegmentSize = 8 << 20; c.CacheBytes = 1 })
	rng := rand.New(rand.NewSource(9))
	var all []*pb.Entry
	idx := uint64(1)
	for batch := range 12 {
		var ents []*pb.Entry
		for i := range 1 + batch%3 {
			size := 64<<10 + rng.Intn(200<<10)
			e := &pb.Entry{Term: new(uint64(1)), Index: new(idx), Type: new(pb.EntryType_EntryNormal),
				Data: misaligned(t, size, (batch*131+i*37)%4096, rng)}
			idx++
			ents = append(ents, e)
		}
		// A small entry first moves the large ones off any alignment.
		small := &pb.Entry{Term: new(uint64(1)), Index: new(idx), Type: new(pb.EntryType_EntryNormal), Data: make([]byte, batch*17)}
		idx++
		ents = append(ents, small)
		mustSave(t, w, Update{Group: 3, HardState: hs(1, 1, idx-1), Entries: ents})
		all = append(all, ents...)
	}
	if w.direct.refused {
		t.Skip("this file system refuses O_DIRECT: nothing to test here")
	}
	if w.direct.copyRefs || w.direct.inPlace == 0 {
		t.Fatalf("no entry data written in place (copied instead: %v)", w.direct.copyRefs)
	}
	check := func(w *WAL, when string) {
		t.Helper()
		got, err := w.Storage(3).Entries(1, idx, 1<<40)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if len(got) != len(all) {
			t.Fatalf("%s: %d entries, want %d", when, len(got), len(all))
		}
		for i := range all {
			if !bytes.Equal(got[i].Data, all[i].Data) {
				t.Fatalf("%s: entry %d (%d bytes) differs", when, i+1, len(all[i].Data))
			}
		}
	}
	check(w, "before restart")
	w.Close()
	w = openT(t, dir, nil)
	defer w.Close()
	check(w, "after restart")
	if b, err := os.ReadFile(filepath.Join(dir, segmentName(1))); err != nil || le.Uint32(b[4:]) != segVersion {
		t.Fatalf("segment version: %v", err)
	}
}

// The pieces a direct write hands the kernel, with the entry data in place or
// all of it copied (the fallback), are the same bytes: head, pad record,
// records with their data, zeros to the page end; and every piece starts and
// ends on a dioAlign boundary, as O_DIRECT requires.
func TestDirectGather(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	var ents []*pb.Entry
	for i := range 6 {
		size := 100 + rng.Intn(1000)
		if i%2 == 1 {
			size = refMinBytes + rng.Intn(300<<10)
		}
		ents = append(ents, &pb.Entry{Term: new(uint64(1)), Index: new(uint64(i + 1)), Type: new(pb.EntryType_EntryNormal),
			Data: misaligned(t, size, rng.Intn(4096), rng)})
	}
	var refs []dataRef
	buf := appendEntries(nil, 9, ents, &refs)
	head := bytes.Repeat([]byte{7}, 1000)
	pre := appendPad(nil, padBefore(int64(len(head))))
	end := len(head) + len(pre) + batchSize(buf, refs)
	p := pageWrite{head: head, pre: pre, buf: buf, refs: refs, zeros: int(roundUp(int64(end))) - end}
	want := bytes.Join([][]byte{head, pre, bytes.Join(batchIOV(nil, buf, refs), nil), make([]byte, p.zeros)}, nil)
	d := newDirectWriter()
	defer d.close()
	if err := d.grow(p.size()); err != nil {
		t.Fatal(err)
	}
	for _, copyAll := range []bool{false, true} {
		inPlace := d.gather(&p, copyAll)
		if got := bytes.Join(d.iov, nil); !bytes.Equal(got, want) {
			t.Fatalf("copyAll %v: the pieces (%d bytes) are not the write (%d bytes)", copyAll, len(got), len(want))
		}
		if want := map[bool]int{false: len(refs), true: 0}[copyAll]; inPlace != want {
			t.Fatalf("copyAll %v: %d pieces in place, want %d", copyAll, inPlace, want)
		}
		for i, v := range d.iov {
			if addrOf(v)%dioAlign != 0 || len(v)%dioAlign != 0 {
				t.Fatalf("copyAll %v: piece %d of %d bytes at %#x is not aligned", copyAll, i, len(v), addrOf(v))
			}
		}
	}
}
