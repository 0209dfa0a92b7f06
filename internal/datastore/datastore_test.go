package datastore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const testChunk = 1 << 20 // 1 MiB chunks keep tests fast

func openStore(t testing.TB, dir string, prealloc int, knobs Knobs) *Store {
	t.Helper()
	s, err := Open(Config{Dir: dir, PreallocChunks: prealloc, Knobs: knobs, Logger: quietLog})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func mustCopyset(t testing.TB, s *Store, group uint64) *Copyset {
	t.Helper()
	cs, err := s.Copyset(group, testChunk)
	if err != nil {
		t.Fatalf("Copyset: %v", err)
	}
	return cs
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func readChunk(t testing.TB, cs *Copyset, id ChunkID) []byte {
	t.Helper()
	b := make([]byte, cs.ChunkSize())
	if err := cs.ReadAt(id, b, 0); err != nil {
		t.Fatalf("ReadAt %v: %v", id, err)
	}
	return b
}

func TestThinReads(t *testing.T) {
	s := openStore(t, t.TempDir(), 0, Knobs{})
	defer s.Close()
	cs := mustCopyset(t, s, 7)
	id := ChunkID{1, 0}
	buf := bytes.Repeat([]byte{0xff}, 8192)
	if err := cs.ReadAt(id, buf, 4096); err != nil {
		t.Fatal(err)
	}
	if !isZero(buf) {
		t.Fatal("absent chunk did not read as zeros")
	}
	if ids, _ := cs.Chunks(); len(ids) != 0 {
		t.Fatalf("a read created a chunk: %v", ids)
	}
	data := bytes.Repeat([]byte{0xab}, 100)
	if err := cs.WriteAt(id, data, 5000); err != nil {
		t.Fatal(err)
	}
	got := readChunk(t, cs, id)
	want := make([]byte, testChunk)
	copy(want[5000:], data)
	if !bytes.Equal(got, want) {
		t.Fatal("chunk content differs from one write over zeros")
	}
	if ids, _ := cs.Chunks(); len(ids) != 1 || ids[0] != id {
		t.Fatalf("Chunks = %v, want [%v]", ids, id)
	}
	// IO crossing the chunk end is refused.
	if err := cs.WriteAt(id, data, testChunk-50); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("write past the chunk end: %v, want ErrOutOfRange", err)
	}
	if err := cs.ReadAt(id, data, -1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read at -1: %v, want ErrOutOfRange", err)
	}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func TestDiscardAndWriteZeroes(t *testing.T) {
	s := openStore(t, t.TempDir(), 0, Knobs{})
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	r := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name   string
		off, n int64
	}{
		{"partial-unaligned", 1000, 3000},
		{"block-aligned", 8192, 16384},
		{"head", 0, 4096},
		{"tail", testChunk - 12345, 12345},
		{"whole-chunk", 0, testChunk},
		{"empty", 500, 0},
	}
	ops := map[string]func(ChunkID, int64, int64) error{
		"discard": cs.Discard, "zeroes": cs.WriteZeroes,
	}
	idx := uint64(0)
	for opName, op := range ops {
		for _, tc := range cases {
			t.Run(opName+"/"+tc.name, func(t *testing.T) {
				id := ChunkID{9, idx}
				idx++
				want := randBytes(r, testChunk)
				if err := cs.WriteAt(id, want, 0); err != nil {
					t.Fatal(err)
				}
				if err := op(id, tc.off, tc.n); err != nil {
					t.Fatal(err)
				}
				clear(want[tc.off : tc.off+tc.n])
				if got := readChunk(t, cs, id); !bytes.Equal(got, want) {
					t.Fatalf("content after %s [%d,+%d) differs", opName, tc.off, tc.n)
				}
				if cs.DirtyCount() == 0 {
					t.Fatal("chunk not dirty after the op")
				}
				// Checksum counts holes as zeros: equal to the crc of the bytes.
				sum, err := cs.Checksum(id)
				if err != nil {
					t.Fatal(err)
				}
				if w := crcOf(want); sum != w {
					t.Fatalf("Checksum %08x, crc of content %08x", sum, w)
				}
			})
		}
	}
	// On an absent chunk both are no-ops that leave it absent.
	if err := cs.Discard(ChunkID{100, 0}, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if err := cs.WriteZeroes(ChunkID{100, 1}, 0, 4096); err != nil {
		t.Fatal(err)
	}
	for _, id := range []ChunkID{{100, 0}, {100, 1}} {
		if sum, _ := cs.Checksum(id); sum != crcOf(make([]byte, testChunk)) {
			t.Fatalf("absent chunk checksum %08x is not the crc of zeros", sum)
		}
	}
	ids, _ := cs.Chunks()
	for _, id := range ids {
		if id.Volume == 100 {
			t.Fatalf("discard/zero created chunk %v", id)
		}
	}
}

// countingSync counts fdatasync calls per chunk file name.
type countingSync struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingSync) knobs() Knobs {
	c.calls = map[string]int{}
	return Knobs{Fdatasync: func(fd int, name string) error {
		c.mu.Lock()
		c.calls[name]++
		c.mu.Unlock()
		return unix.Fdatasync(fd)
	}}
}

func (c *countingSync) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.calls
	c.calls = map[string]int{}
	return m
}

func TestSyncFsyncsEachDirtyChunkOnce(t *testing.T) {
	var cnt countingSync
	dir := t.TempDir()
	s := openStore(t, dir, 2, cnt.knobs())
	cs := mustCopyset(t, s, 3)
	r := rand.New(rand.NewPCG(3, 4))
	want := map[ChunkID][]byte{}
	// Many writes to 5 chunks, several per chunk; chunk 6 only read.
	for i := range 40 {
		id := ChunkID{1, uint64(i % 5)}
		if want[id] == nil {
			want[id] = make([]byte, testChunk)
		}
		off := int64(r.IntN(testChunk - 4096))
		p := randBytes(r, 4096)
		if err := cs.WriteAt(id, p, off); err != nil {
			t.Fatal(err)
		}
		copy(want[id][off:], p)
	}
	readChunk(t, cs, ChunkID{1, 6})
	if got := cs.DirtyCount(); got != 5 {
		t.Fatalf("DirtyCount = %d, want 5", got)
	}
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	calls := cnt.take()
	if len(calls) != 5 {
		t.Fatalf("Sync fsynced %d files (%v), want the 5 dirty ones", len(calls), calls)
	}
	for id := range want {
		if n := calls[id.fileName()]; n != 1 {
			t.Fatalf("chunk %v fsynced %d times, want 1", id, n)
		}
	}
	// Nothing dirty: a second Sync fsyncs nothing.
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	if calls := cnt.take(); len(calls) != 0 {
		t.Fatalf("idle Sync fsynced %v", calls)
	}
	// One more write → exactly that chunk.
	id := ChunkID{1, 2}
	if err := cs.WriteAt(id, []byte("again"), 10); err != nil {
		t.Fatal(err)
	}
	copy(want[id][10:], "again")
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	if calls := cnt.take(); len(calls) != 1 || calls[id.fileName()] != 1 {
		t.Fatalf("Sync after one write fsynced %v", calls)
	}
	s.Close()

	// Reopen: everything written before Sync is there.
	s = openStore(t, dir, 2, Knobs{})
	defer s.Close()
	cs = mustCopyset(t, s, 3)
	for id, w := range want {
		if !bytes.Equal(readChunk(t, cs, id), w) {
			t.Fatalf("chunk %v differs after reopen", id)
		}
	}
}

func TestSyncErrorKeepsChunksDirty(t *testing.T) {
	fail := true
	var mu sync.Mutex
	s := openStore(t, t.TempDir(), 0, Knobs{Fdatasync: func(int, string) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("injected EIO")
		}
		return nil
	}})
	defer s.Close()
	cs := mustCopyset(t, s, 3)
	for i := range 3 {
		if err := cs.WriteAt(ChunkID{1, uint64(i)}, []byte{1}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := cs.Sync(); !errors.Is(err, ErrIO) {
		t.Fatalf("Sync with failing fdatasync: %v, want ErrIO", err)
	}
	if n := cs.DirtyCount(); n != 3 {
		t.Fatalf("after a failed Sync %d chunks dirty, want 3", n)
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := cs.DirtyCount(); n != 0 {
		t.Fatalf("after Sync %d chunks dirty", n)
	}
}

// TestSyncConcurrentWithWrites: a chunk written while Sync runs is either
// synced by it or still dirty afterwards — never silently dropped.
func TestSyncConcurrentWithWrites(t *testing.T) {
	var cnt countingSync
	s := openStore(t, t.TempDir(), 0, cnt.knobs())
	defer s.Close()
	cs := mustCopyset(t, s, 3)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	const writers = 4
	var written [writers]int
	for w := range writers {
		wg.Go(func() {
			p := make([]byte, 4096)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := cs.WriteAt(ChunkID{uint64(w), uint64(i % 8)}, p, int64(i%16)*4096); err != nil {
					t.Error(err)
					return
				}
				written[w]++
			}
		})
	}
	for range 20 {
		if err := cs.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := cs.DirtyCount(); n != 0 {
		t.Fatalf("%d chunks dirty after a final Sync with no writers", n)
	}
	calls := cnt.take()
	for w := range writers {
		for i := range min(written[w], 8) {
			if calls[ChunkID{uint64(w), uint64(i)}.fileName()] == 0 {
				t.Fatalf("chunk %d/%d written but never fsynced", w, i)
			}
		}
	}
}

// TestRestartReplay is the crash-recovery story of docs/design.md §3/§5: writes up
// to a "snapshot" are synced and meta saved; later writes are lost with the
// page cache (we never Sync them) and replayed from the log after restart.
// Replaying is idempotent, so the result equals a store that never crashed.
func TestRestartReplay(t *testing.T) {
	type op struct {
		kind   int // 0 write, 1 discard, 2 zeroes
		id     ChunkID
		off    int64
		data   []byte
		length int64
	}
	r := rand.New(rand.NewPCG(5, 6))
	gen := func(n int) []op {
		var ops []op
		for range n {
			o := op{kind: r.IntN(5) / 3 * (1 + r.IntN(2)), id: ChunkID{uint64(r.IntN(2)), uint64(r.IntN(4))}}
			o.length = int64(1+r.IntN(16)) * 512
			o.off = int64(r.IntN(testChunk/512-16)) * 512
			if o.kind == 0 {
				o.data = randBytes(r, int(o.length))
			}
			ops = append(ops, o)
		}
		return ops
	}
	apply := func(t *testing.T, cs *Copyset, ops []op) {
		t.Helper()
		for _, o := range ops {
			var err error
			switch o.kind {
			case 0:
				err = cs.WriteAt(o.id, o.data, o.off)
			case 1:
				err = cs.Discard(o.id, o.off, o.length)
			case 2:
				err = cs.WriteZeroes(o.id, o.off, o.length)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	before, after := gen(200), gen(200)

	// Reference: a store that applies everything with no crash.
	ref := openStore(t, t.TempDir(), 0, Knobs{})
	defer ref.Close()
	refCS := mustCopyset(t, ref, 1)
	apply(t, refCS, before)
	apply(t, refCS, after)

	dir := t.TempDir()
	s := openStore(t, dir, 2, Knobs{})
	cs := mustCopyset(t, s, 1)
	apply(t, cs, before)
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := cs.SaveMeta([]byte("applied=200")); err != nil {
		t.Fatal(err)
	}
	apply(t, cs, after[:120]) // later writes reach the page cache...
	s.Close()                 // ...then the process dies without Sync.

	// The disk after a power cut holds the synced state plus whatever part
	// of the unsynced writes the kernel had written back: model it as a copy
	// of the synced state with a random subset of the later ops applied.
	crashDir := t.TempDir()
	{
		s := openStore(t, dir, 0, Knobs{})
		cs := mustCopyset(t, s, 1)
		c2 := openStore(t, crashDir, 0, Knobs{})
		cs2 := mustCopyset(t, c2, 1)
		var buf bytes.Buffer
		// The synced state = ref's "before" state; rebuild it by streaming
		// a store that applied only "before".
		pre := openStore(t, t.TempDir(), 0, Knobs{})
		preCS := mustCopyset(t, pre, 1)
		apply(t, preCS, before)
		if err := preCS.WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		if err := cs2.ReceiveSnapshot(7, &buf); err != nil {
			t.Fatal(err)
		}
		if err := cs2.InstallStaged(7); err != nil {
			t.Fatal(err)
		}
		meta, _ := cs.LoadMeta()
		cs2.SaveMeta(meta)
		var partial []op
		for _, o := range after[:120] {
			if r.IntN(2) == 0 {
				partial = append(partial, o)
			}
		}
		apply(t, cs2, partial)
		pre.Close()
		c2.Close()
		s.Close()
	}

	for name, d := range map[string]string{"clean close": dir, "power cut": crashDir} {
		t.Run(name, func(t *testing.T) {
			replayAndCompare(t, d, refCS, func(cs *Copyset) { apply(t, cs, after) })
		})
	}
}

func replayAndCompare(t *testing.T, dir string, refCS *Copyset, replay func(*Copyset)) {
	s := openStore(t, dir, 2, Knobs{})
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	meta, err := cs.LoadMeta()
	if err != nil || string(meta) != "applied=200" {
		t.Fatalf("LoadMeta = %q, %v", meta, err)
	}
	replay(cs) // replay from the snapshot: some ops apply twice
	compareStores(t, refCS, cs)
}

// compareStores checks that two copysets hold the same chunks with the same
// checksums (chunks absent on one side must be all zeros on the other).
func compareStores(t *testing.T, a, b *Copyset) {
	t.Helper()
	ids := map[ChunkID]bool{}
	for _, cs := range []*Copyset{a, b} {
		l, err := cs.Chunks()
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range l {
			ids[id] = true
		}
	}
	if len(ids) == 0 {
		t.Fatal("no chunks to compare")
	}
	for id := range ids {
		sa, err := a.Checksum(id)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := b.Checksum(id)
		if err != nil {
			t.Fatal(err)
		}
		if sa != sb {
			t.Fatalf("chunk %v: checksum %08x vs %08x", id, sa, sb)
		}
	}
}

func TestMetaAtomic(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 0, Knobs{})
	cs := mustCopyset(t, s, 0xabc)
	if m, err := cs.LoadMeta(); m != nil || err != nil {
		t.Fatalf("fresh LoadMeta = %q, %v; want nil, nil", m, err)
	}
	if err := cs.SaveMeta([]byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := cs.SaveMeta([]byte("two")); err != nil {
		t.Fatal(err)
	}
	if m, _ := cs.LoadMeta(); string(m) != "two" {
		t.Fatalf("LoadMeta = %q, want two", m)
	}
	if err := cs.SaveMeta([]byte{}); err != nil {
		t.Fatal(err)
	}
	if m, err := cs.LoadMeta(); m == nil || len(m) != 0 || err != nil {
		t.Fatalf("empty meta reads back as %v, %v", m, err)
	}
	if err := cs.SaveMeta([]byte("three")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	csDir := filepath.Join(dir, "copysets", "0000000000000abc")
	// A crash while writing the temp file leaves meta.tmp behind: ignored.
	os.WriteFile(filepath.Join(csDir, "meta.tmp"), []byte("garbage"), 0o644)
	s = openStore(t, dir, 0, Knobs{})
	cs = mustCopyset(t, s, 0xabc)
	if m, err := cs.LoadMeta(); string(m) != "three" || err != nil {
		t.Fatalf("after a torn temp file LoadMeta = %q, %v", m, err)
	}
	s.Close()
	// "three" is record 4 in meta.0, "" record 3 in meta.1. The newest slot
	// torn (garbage, a flipped byte, cut short): the record before it.
	// Both slots damaged: ErrCorrupt.
	slot0, slot1 := filepath.Join(csDir, "meta.0"), filepath.Join(csDir, "meta.1")
	good0, _ := os.ReadFile(slot0)
	good1, _ := os.ReadFile(slot1)
	flipped := bytes.Clone(good0)
	flipped[len(flipped)-1] ^= 1
	for name, b := range map[string][]byte{
		"garbage": []byte("not a meta record at all"), "flipped": flipped,
		"truncated": good0[:len(good0)-2], "short": good0[:5], "empty": {},
	} {
		os.WriteFile(slot0, b, 0o644)
		s = openStore(t, dir, 0, Knobs{})
		cs = mustCopyset(t, s, 0xabc)
		if m, err := cs.LoadMeta(); m == nil || len(m) != 0 || err != nil {
			t.Errorf("%s newest slot: LoadMeta = %q, %v; want the previous record (empty)", name, m, err)
		}
		s.Close()
		os.WriteFile(slot1, b, 0o644)
		s = openStore(t, dir, 0, Knobs{})
		cs = mustCopyset(t, s, 0xabc)
		if _, err := cs.LoadMeta(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s in both slots: LoadMeta error %v, want ErrCorrupt", name, err)
		}
		s.Close()
		os.WriteFile(slot1, good1, 0o644)
	}
	os.WriteFile(slot0, good0, 0o644)

	// After a torn newest slot, the next save goes to that slot again and
	// reads back; a save after it to the other one.
	os.WriteFile(slot0, flipped, 0o644)
	s = openStore(t, dir, 0, Knobs{})
	cs = mustCopyset(t, s, 0xabc)
	for _, want := range []string{"four", "five"} {
		if err := cs.SaveMeta([]byte(want)); err != nil {
			t.Fatal(err)
		}
		if m, err := cs.LoadMeta(); string(m) != want || err != nil {
			t.Fatalf("LoadMeta = %q, %v; want %s", m, err, want)
		}
	}
	s.Close()
	s = openStore(t, dir, 0, Knobs{})
	if m, err := mustCopyset(t, s, 0xabc).LoadMeta(); string(m) != "five" || err != nil {
		t.Fatalf("after reopen LoadMeta = %q, %v; want five", m, err)
	}
	s.Close()
}

// TestMetaFromOlderVersion: a copyset whose meta is the single file older
// versions wrote (write meta.tmp, rename) reads it, a first save into a slot
// torn by a crash still leaves it, and a save that completed replaces it.
func TestMetaFromOlderVersion(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 0, Knobs{})
	mustCopyset(t, s, 0xabc)
	s.Close()
	csDir := filepath.Join(dir, "copysets", "0000000000000abc")
	if err := writeAtomic(csDir, metaFileName, metaMagic, []byte("old")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(csDir, "meta.1"), []byte("torn first record"), 0o644)
	s = openStore(t, dir, 0, Knobs{})
	cs := mustCopyset(t, s, 0xabc)
	if m, err := cs.LoadMeta(); string(m) != "old" || err != nil {
		t.Fatalf("LoadMeta = %q, %v; want old", m, err)
	}
	if err := cs.SaveMeta([]byte("new")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(csDir, metaFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the old meta file is still there after a save: %v", err)
	}
	s = openStore(t, dir, 0, Knobs{})
	defer s.Close()
	if m, err := mustCopyset(t, s, 0xabc).LoadMeta(); string(m) != "new" || err != nil {
		t.Fatalf("LoadMeta = %q, %v; want new", m, err)
	}
	// A damaged old file with no slot: ErrCorrupt, as before.
	dir2 := t.TempDir()
	s2 := openStore(t, dir2, 0, Knobs{})
	mustCopyset(t, s2, 1)
	s2.Close()
	os.WriteFile(filepath.Join(dir2, "copysets", "0000000000000001", metaFileName), []byte("garbage"), 0o644)
	s2 = openStore(t, dir2, 0, Knobs{})
	defer s2.Close()
	if _, err := mustCopyset(t, s2, 1).LoadMeta(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged old meta: LoadMeta error %v, want ErrCorrupt", err)
	}
}

func TestCopysetsAndDeleteVolume(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 0, Knobs{})
	a := mustCopyset(t, s, 1)
	b := mustCopyset(t, s, 2)
	if _, err := s.Copyset(1, testChunk*2); !errors.Is(err, ErrChunkSize) {
		t.Fatalf("reopen with another chunk size: %v, want ErrChunkSize", err)
	}
	for i := range 3 {
		for _, v := range []uint64{10, 11} {
			if err := a.WriteAt(ChunkID{v, uint64(i)}, []byte("x"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.WriteAt(ChunkID{10, 9}, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteVolume(10); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	ids, _ := a.Chunks()
	if len(ids) != 3 || ids[0].Volume != 11 {
		t.Fatalf("after DeleteVolume(10) chunks = %v", ids)
	}
	p := make([]byte, 1)
	a.ReadAt(ChunkID{10, 0}, p, 0)
	if p[0] != 0 {
		t.Fatal("deleted chunk still reads its data")
	}
	if err := s.RemoveCopyset(2); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteAt(ChunkID{1, 1}, p, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("write to removed copyset: %v, want ErrClosed", err)
	}
	s.Close()
	s = openStore(t, dir, 0, Knobs{})
	defer s.Close()
	if got := s.Copysets(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("Copysets after reopen = %v, want [1]", got)
	}
	a = mustCopyset(t, s, 1)
	if ids, _ := a.Chunks(); len(ids) != 3 {
		t.Fatalf("chunks after reopen = %v", ids)
	}
	capacity, used, err := s.Usage()
	if err != nil || capacity == 0 || used > capacity {
		t.Fatalf("Usage = %d, %d, %v", capacity, used, err)
	}
}

func TestFDCacheBounded(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir(), MaxOpenFiles: 4, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	for i := range 20 {
		if err := cs.WriteAt(ChunkID{1, uint64(i)}, []byte{byte(i + 1)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.fds.openCount(); n > 4 {
		t.Fatalf("%d chunk files open, limit 4", n)
	}
	p := make([]byte, 1)
	for i := range 20 {
		if err := cs.ReadAt(ChunkID{1, uint64(i)}, p, 0); err != nil || p[0] != byte(i+1) {
			t.Fatalf("chunk %d reads %d, %v", i, p[0], err)
		}
	}
	if err := cs.Sync(); err != nil { // reopens evicted dirty chunks to fsync
		t.Fatal(err)
	}
}

func TestPool(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 3, Knobs{})
	cs := mustCopyset(t, s, 1)
	waitFor(t, "pool filled", func() bool { return s.pool.readyCount(testChunk) == 3 })
	poolDir := filepath.Join(dir, "pool", "1048576")
	before := listNames(t, poolDir)
	// A first write takes a pool file: the file moves, it is not created.
	ino := inode(t, filepath.Join(poolDir, before[len(before)-1]))
	if err := cs.WriteAt(ChunkID{1, 0}, []byte("a"), 0); err != nil {
		t.Fatal(err)
	}
	if got := inode(t, filepath.Join(dir, "copysets", "0000000000000001", "chunks", ChunkID{1, 0}.fileName())); got != ino {
		t.Fatalf("chunk file inode %d, want the pool file's %d", got, ino)
	}
	waitFor(t, "pool refilled", func() bool { return s.pool.readyCount(testChunk) == 3 })
	// Deleted chunk files come back to the pool, zeroed.
	for i := range 4 {
		if err := cs.WriteAt(ChunkID{2, uint64(i)}, bytes.Repeat([]byte{7}, 4096), 0); err != nil {
			t.Fatal(err)
		}
	}
	deleted := map[uint64]bool{}
	for i := range 4 {
		deleted[inode(t, filepath.Join(dir, "copysets", "0000000000000001", "chunks", ChunkID{2, uint64(i)}.fileName()))] = true
	}
	waitFor(t, "pool refilled", func() bool { return s.pool.readyCount(testChunk) == 3 })
	if err := cs.DeleteVolume(2); err != nil {
		t.Fatal(err)
	}
	// 3 ready + 4 recycled: up to 2×3 become ready, the 4th is unlinked.
	waitFor(t, "recycled files ready", func() bool { return s.pool.readyCount(testChunk) == 6 })
	reused := 0
	for _, name := range listNames(t, poolDir) {
		if deleted[inode(t, filepath.Join(poolDir, name))] {
			reused++
		}
	}
	if reused != 3 {
		t.Fatalf("%d deleted chunk files back in the pool, want 3", reused)
	}
	for i := range 6 {
		id := ChunkID{3, uint64(i)}
		if err := cs.WriteAt(id, []byte{1}, testChunk-1); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, testChunk)
		want[testChunk-1] = 1
		if !bytes.Equal(readChunk(t, cs, id), want) {
			t.Fatalf("chunk %v from a recycled pool file holds old data", id)
		}
	}
	s.Close()
	// Ready files survive a restart; a half-made one is removed; one that
	// holds data (a chunk whose rename out of the pool a crash undid) is
	// zeroed before it is handed out again.
	os.WriteFile(filepath.Join(poolDir, "tmp-00000000000000ff"), []byte("x"), 0o644)
	names := listNames(t, poolDir)
	dirtied := filepath.Join(poolDir, names[0])
	f, err := os.OpenFile(dirtied, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("old chunk data"), 4096)
	f.Sync()
	f.Close()
	s = openStore(t, dir, 3, Knobs{})
	defer s.Close()
	if _, err := os.Stat(filepath.Join(poolDir, "tmp-00000000000000ff")); err == nil {
		t.Fatal("half-made pool file survived Open")
	}
	waitFor(t, "pool after restart", func() bool {
		rec, _ := os.ReadDir(filepath.Join(poolDir, "recycle"))
		return len(rec) == 0 && s.pool.readyCount(testChunk) >= 3
	})
	for _, name := range listNames(t, poolDir) {
		if !holdsNoData(filepath.Join(poolDir, name)) {
			t.Fatalf("ready pool file %s holds data", name)
		}
	}
}

func TestPoolDisabled(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 0, Knobs{})
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	if err := cs.WriteAt(ChunkID{1, 0}, []byte("a"), 100); err != nil {
		t.Fatal(err)
	}
	if err := cs.DeleteVolume(1); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "pool")); len(ents) != 0 {
		t.Fatalf("disabled pool holds %d entries", len(ents))
	}
	st, err := os.Stat(filepath.Join(dir, "copysets", "0000000000000001", "chunks"))
	if err != nil || !st.IsDir() {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "copysets", "0000000000000001", "chunks")); len(ents) != 0 {
		t.Fatalf("deleted chunk still on disk: %v", ents)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func listNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestHotPathDoesNotAllocate: WriteAt and ReadAt of an existing chunk, and
// of an absent one (read), allocate nothing per call.
func TestHotPathDoesNotAllocate(t *testing.T) {
	s := openStore(t, t.TempDir(), 0, Knobs{})
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	p := make([]byte, 4096)
	id := ChunkID{1, 0}
	if err := cs.WriteAt(id, p, 0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { cs.WriteAt(id, p, 4096) }); n != 0 {
		t.Errorf("WriteAt allocates %.1f times per call", n)
	}
	if n := testing.AllocsPerRun(100, func() { cs.ReadAt(id, p, 4096) }); n != 0 {
		t.Errorf("ReadAt allocates %.1f times per call", n)
	}
	if n := testing.AllocsPerRun(100, func() { cs.ReadAt(ChunkID{2, 0}, p, 0) }); n != 0 {
		t.Errorf("ReadAt of an absent chunk allocates %.1f times per call", n)
	}
}

// TestReadAtCached: the no-wait read serves what the page cache holds (and
// absent chunks, as zeros) and refuses, without reading, what it does not: a
// range dropped from the cache, a chunk whose file is not open. Refused reads
// then succeed with ReadAt.
func TestReadAtCached(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, MaxOpenFiles: 1, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	want := randBytes(rand.New(rand.NewPCG(1, 2)), 8192)
	a, b := ChunkID{1, 0}, ChunkID{1, 1}
	for _, id := range []ChunkID{a, b} {
		if err := cs.WriteAt(id, want, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, len(want))
	if err := cs.ReadAt(b, p, 4096); err != nil { // Sync may have closed b's file
		t.Fatal(err)
	}
	clear(p)
	ok, err := cs.ReadAtCached(b, p, 4096)
	if !ok && s.noWait.Load() {
		t.Skip("preadv2(RWF_NOWAIT) is unsupported on the filesystem of t.TempDir(): reads always take the goroutine path")
	}
	if err != nil || !ok || !bytes.Equal(p, want) {
		t.Fatalf("cached read of a fresh write: ok=%v err=%v equal=%v", ok, err, bytes.Equal(p, want))
	}
	if ok, err := cs.ReadAtCached(ChunkID{9, 0}, p, 0); err != nil || !ok || !bytes.Equal(p, make([]byte, len(p))) {
		t.Fatalf("absent chunk: ok=%v err=%v, want zeros", ok, err)
	}
	// MaxOpenFiles 1: b's read closed a's file.
	if ok, err := cs.ReadAtCached(a, p, 4096); ok || err != nil {
		t.Fatalf("chunk whose file is closed: ok=%v err=%v, want refused", ok, err)
	}
	// Drop b's pages from the page cache (its file stays open).
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) == nil && fs.Type == unix.TMPFS_MAGIC {
		t.Skip("t.TempDir() is on tmpfs: its pages cannot be dropped from the page cache")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "copysets", "*", "chunks", "*"))
	for _, f := range files {
		fd, err := unix.Open(f, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
		unix.Close(fd)
	}
	if ok, err := cs.ReadAtCached(b, p, 4096); ok || err != nil {
		t.Fatalf("range dropped from the page cache: ok=%v err=%v, want refused", ok, err)
	}
	clear(p)
	if err := cs.ReadAt(b, p, 4096); err != nil || !bytes.Equal(p, want) {
		t.Fatalf("ReadAt after a refused cached read: err=%v equal=%v", err, bytes.Equal(p, want))
	}
	if ok, err := cs.ReadAtCached(b, p[:4096], 4096); err != nil || !ok || !bytes.Equal(p[:4096], want[:4096]) {
		t.Fatalf("cached read after ReadAt brought the range back: ok=%v err=%v", ok, err)
	}
	if n := testing.AllocsPerRun(100, func() { cs.ReadAtCached(b, p[:4096], 4096) }); n != 0 {
		t.Errorf("ReadAtCached allocates %.1f times per call", n)
	}
}

func TestErrorClassification(t *testing.T) {
	if err := ioError("pwrite x", unix.ENOSPC); !errors.Is(err, ErrNoSpace) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("ENOSPC → %v, want ErrNoSpace wrapping ENOSPC", err)
	}
	if err := ioError("pwrite x", unix.EIO); !errors.Is(err, ErrIO) || errors.Is(err, ErrNoSpace) {
		t.Fatalf("EIO → %v, want ErrIO", err)
	}
}

// TestConcurrentStress runs every kind of operation at once on one copyset
// with a tiny descriptor cache, so eviction, deferred close, Sync and
// snapshots race with IO. It checks for errors and, under -race, data races;
// then that a volume nobody deleted reads back what was last written.
func TestConcurrentStress(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir(), PreallocChunks: 2, MaxOpenFiles: 3, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	run := func(name string, seed uint64, f func(r *rand.Rand) error) {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, seed))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := f(r); err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
			}
		})
	}
	p := make([]byte, 4096)
	run("write", 1, func(r *rand.Rand) error {
		return cs.WriteAt(ChunkID{uint64(1 + r.IntN(2)), uint64(r.IntN(6))}, p, int64(r.IntN(200))*4096)
	})
	q := make([]byte, 4096)
	run("read", 2, func(r *rand.Rand) error {
		return cs.ReadAt(ChunkID{uint64(1 + r.IntN(2)), uint64(r.IntN(6))}, q, int64(r.IntN(200))*4096)
	})
	run("trim", 3, func(r *rand.Rand) error {
		return cs.Discard(ChunkID{uint64(1 + r.IntN(2)), uint64(r.IntN(6))}, int64(r.IntN(200))*4096, 8192)
	})
	run("sync", 4, func(*rand.Rand) error { return cs.Sync() })
	run("snapshot+checksum", 5, func(r *rand.Rand) error {
		if _, err := cs.Checksum(ChunkID{1, uint64(r.IntN(6))}); err != nil {
			return err
		}
		return cs.WriteSnapshot(io.Discard)
	})
	run("delete", 6, func(*rand.Rand) error {
		time.Sleep(2 * time.Millisecond)
		return cs.DeleteVolume(2)
	})
	time.Sleep(400 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := s.fds.openCount(); n > 3 {
		t.Fatalf("%d files open after the storm, limit 3", n)
	}
	// Volume 1 was never deleted: a final write per chunk reads back.
	for i := range 6 {
		id := ChunkID{1, uint64(i)}
		want := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		if err := cs.WriteAt(id, want, 8192); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4096)
		if err := cs.ReadAt(id, got, 8192); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("chunk %v: read back %v, %v", id, got[:4], err)
		}
	}
	if err := cs.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestPoolPerChunkSize: each copyset takes pool files of its own chunk size.
func TestPoolPerChunkSize(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, 2, Knobs{})
	defer s.Close()
	small := mustCopyset(t, s, 1)
	big, err := s.Copyset(2, 2*testChunk)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both pools filled", func() bool {
		return s.pool.readyCount(testChunk) == 2 && s.pool.readyCount(2*testChunk) == 2
	})
	for i := range 3 {
		for _, cs := range []*Copyset{small, big} {
			id := ChunkID{1, uint64(i)}
			if err := cs.WriteAt(id, []byte{1}, cs.ChunkSize()-1); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(filepath.Join(cs.chunksDir, id.fileName()))
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != cs.ChunkSize() {
				t.Fatalf("copyset %d got a %d-byte chunk file, chunk size %d", cs.Group(), st.Size(), cs.ChunkSize())
			}
		}
	}
	if _, err := s.Copyset(3, 1000); err == nil {
		t.Fatal("a chunk size that is not a multiple of 512 was accepted")
	}
}

// DataExtents reports where a chunk file holds data: nothing for an absent
// chunk or a fresh pool file, the written range (at the file system's block
// size) after a write, and a hole after a discard.
func TestDataExtents(t *testing.T) {
	for _, prealloc := range []int{0, 2} {
		t.Run(fmt.Sprintf("prealloc=%d", prealloc), func(t *testing.T) {
			s := openStore(t, t.TempDir(), prealloc, Knobs{})
			defer s.Close()
			cs := mustCopyset(t, s, 7)
			id := ChunkID{1, 0}
			extents := func(off, n int64) string {
				t.Helper()
				var b strings.Builder
				if err := cs.DataExtents(id, off, n, func(o, k int64) { fmt.Fprintf(&b, "[%d,%d)", o, o+k) }); err != nil {
					t.Fatal(err)
				}
				return b.String()
			}
			if got := extents(0, testChunk); got != "" {
				t.Fatalf("absent chunk: %s", got)
			}
			if err := cs.WriteAt(id, bytes.Repeat([]byte{1}, 8192), 64<<10); err != nil {
				t.Fatal(err)
			}
			if got := extents(0, testChunk); got != "[65536,73728)" {
				if got == fmt.Sprintf("[0,%d)", testChunk) {
					t.Skip("this file system reports no holes (SEEK_DATA)")
				}
				t.Fatalf("after a write: %s", got)
			}
			if got := extents(68<<10, 64<<10); got != "[69632,73728)" {
				t.Fatalf("a range from inside the data: %s", got)
			}
			if err := cs.Discard(id, 64<<10, 4096); err != nil {
				t.Fatal(err)
			}
			if got := extents(0, testChunk); got != "[69632,73728)" {
				t.Fatalf("after a discard: %s", got)
			}
			if err := cs.DataExtents(id, testChunk-4096, 8192, func(int64, int64) {}); err == nil {
				t.Fatal("a range past the chunk's end")
			}
		})
	}
}
