package chunkserver

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/pkg/api"
)

var update = flag.Bool("update", false, "rewrite golden files")

// memStore is an in-memory chunkStore for state-machine tests. failAfter > 0
// makes the n-th write fail with errDisk.
type memStore struct {
	mu        sync.Mutex
	chunkSize int64
	chunks    map[chunkID][]byte
	synced    map[chunkID][]byte
	meta      []byte
	staged    map[uint64]map[chunkID][]byte // by snapshot index
	installed uint64
	writes    int
	failAt    int
}

var errDisk = errors.New("test: disk error")

func newMemStore(chunkSize int64) *memStore {
	return &memStore{chunkSize: chunkSize, chunks: map[chunkID][]byte{}, synced: map[chunkID][]byte{}}
}

func (m *memStore) chunk(id chunkID) []byte {
	c := m.chunks[id]
	if c == nil {
		c = make([]byte, m.chunkSize)
		m.chunks[id] = c
	}
	return c
}

func (m *memStore) WriteAt(id chunkID, p []byte, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes++
	if m.failAt > 0 && m.writes >= m.failAt {
		return errDisk
	}
	copy(m.chunk(id)[off:], p)
	return nil
}

func (m *memStore) ReadAt(id chunkID, p []byte, off int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(p)
	if c := m.chunks[id]; c != nil {
		copy(p, c[off:])
	}
	return nil
}

func (m *memStore) Discard(id chunkID, off, n int64) error { return m.WriteZeroes(id, off, n) }
func (m *memStore) WriteZeroes(id chunkID, off, n int64) error {
	return m.WriteAt(id, make([]byte, n), off)
}

func (m *memStore) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, c := range m.chunks {
		m.synced[id] = bytes.Clone(c)
	}
	return nil
}

func (m *memStore) SaveMeta(b []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.meta = bytes.Clone(b)
	return nil
}

func (m *memStore) LoadMeta() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.meta), nil
}

// crash forgets everything not synced.
func (m *memStore) crash() *memStore {
	n := newMemStore(m.chunkSize)
	for id, c := range m.synced {
		n.chunks[id] = bytes.Clone(c)
		n.synced[id] = bytes.Clone(c)
	}
	n.meta = bytes.Clone(m.meta)
	return n
}

func (m *memStore) WriteSnapshot(w io.Writer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, c := range m.chunks {
		fmt.Fprintf(w, "%d %d %s\n", id.Volume, id.Index, hex.EncodeToString(c))
	}
	return nil
}

func (m *memStore) ReceiveSnapshotChecked(index uint64, r io.Reader, _ func(chunkID) bool) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	staged := map[chunkID][]byte{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var id chunkID
		var h string
		if _, err := fmt.Sscanf(line, "%d %d %s", &id.Volume, &id.Index, &h); err != nil {
			return err
		}
		c, err := hex.DecodeString(h)
		if err != nil {
			return err
		}
		staged[id] = c
	}
	m.mu.Lock()
	if m.staged == nil {
		m.staged = map[uint64]map[chunkID][]byte{}
	}
	m.staged[index] = staged
	m.mu.Unlock()
	return nil
}

func (m *memStore) InstallStaged(index uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	staged, ok := m.staged[index]
	if !ok {
		return datastore.ErrNoStaged
	}
	m.chunks = staged
	m.installed = index
	for i := range m.staged {
		if i <= index {
			delete(m.staged, i)
		}
	}
	return nil
}

func (m *memStore) Installed() (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.installed, nil
}

func (m *memStore) DropStaged(through uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.staged {
		if i <= through {
			delete(m.staged, i)
		}
	}
	return nil
}

// DeleteVolume removes the volume's chunks durably (synced too), as the
// datastore's does.
func (m *memStore) DeleteVolume(volume uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.chunks {
		if id.Volume == volume {
			delete(m.chunks, id)
		}
	}
	for id := range m.synced {
		if id.Volume == volume {
			delete(m.synced, id)
		}
	}
	return nil
}

func (m *memStore) Volumes() ([]uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[uint64]bool{}
	var out []uint64
	for id := range m.chunks {
		if !seen[id.Volume] {
			seen[id.Volume] = true
			out = append(out, id.Volume)
		}
	}
	return out, nil
}

func (m *memStore) volumeChunks(volume uint64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for id := range m.chunks {
		if id.Volume == volume {
			n++
		}
	}
	return n
}

func (m *memStore) equal(o *memStore) bool {
	z := make([]byte, m.chunkSize)
	keys := map[chunkID]bool{}
	for id := range m.chunks {
		keys[id] = true
	}
	for id := range o.chunks {
		keys[id] = true
	}
	for id := range keys {
		a, b := m.chunks[id], o.chunks[id]
		if a == nil {
			a = z
		}
		if b == nil {
			b = z
		}
		if !bytes.Equal(a, b) {
			return false
		}
	}
	return true
}

const testChunk = 1 << 12

func readBack(t *testing.T, s chunkStore, vol, off uint64, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	id := chunkID{Volume: vol, Index: off / testChunk}
	if err := s.ReadAt(id, p, int64(off%testChunk)); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestApplyFencing(t *testing.T) {
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	w := func(i, epoch, off uint64, b byte) error {
		return sm.Apply(i, encodeCommand(command{Op: cmdWrite, Volume: 7, Epoch: epoch, Offset: off, Length: 4, Data: bytes.Repeat([]byte{b}, 4)}))
	}
	if err := w(1, 1, testChunk+8, 'a'); err != nil {
		t.Fatalf("epoch 1 write: %v", err)
	}
	if got := readBack(t, st, 7, testChunk+8, 4); string(got) != "aaaa" {
		t.Fatalf("read %q, want aaaa", got)
	}
	// A new writer's epoch arrives with a fence.
	if err := sm.Apply(2, encodeCommand(command{Op: cmdFence, Volume: 7, Epoch: 3})); err != nil {
		t.Fatalf("fence: %v", err)
	}
	if sm.epochOf(7) != 3 {
		t.Fatalf("epoch %d after fence, want 3", sm.epochOf(7))
	}
	// The old writer is refused and changes nothing.
	if err := w(3, 1, testChunk+8, 'b'); !errors.Is(err, api.ErrFenced) {
		t.Fatalf("stale write: %v, want FENCED", err)
	}
	if got := readBack(t, st, 7, testChunk+8, 4); string(got) != "aaaa" {
		t.Fatalf("stale write changed data: %q", got)
	}
	// Equal and newer epochs pass; a newer one raises the table.
	if err := w(4, 3, testChunk+8, 'c'); err != nil {
		t.Fatal(err)
	}
	if err := w(5, 4, testChunk+10, 'd'); err != nil {
		t.Fatal(err)
	}
	if got := readBack(t, st, 7, testChunk+8, 6); string(got) != "ccdddd" {
		t.Fatalf("read %q, want ccdddd", got)
	}
	if sm.epochOf(7) != 4 || sm.epochOf(8) != 0 {
		t.Fatalf("epochs %d %d", sm.epochOf(7), sm.epochOf(8))
	}
	// Other volumes are independent.
	if err := sm.Apply(6, encodeCommand(command{Op: cmdWriteZeroes, Volume: 8, Epoch: 1, Offset: 0, Length: 16})); err != nil {
		t.Fatal(err)
	}
	// Trim and zeroes read back as zeros.
	if err := sm.Apply(7, encodeCommand(command{Op: cmdTrim, Volume: 7, Epoch: 4, Offset: testChunk + 9, Length: 2})); err != nil {
		t.Fatal(err)
	}
	if got := readBack(t, st, 7, testChunk+8, 6); string(got) != "c\x00\x00ddd" {
		t.Fatalf("after trim %q", got)
	}
	if sm.Applied() != 7 {
		t.Fatalf("applied %d", sm.Applied())
	}
}

func TestApplyCrossChunk(t *testing.T) {
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	err := sm.Apply(2, encodeCommand(command{Op: cmdWriteZeroes, Volume: 1, Epoch: 1, Offset: testChunk - 1, Length: 2}))
	if !errors.Is(err, api.ErrOutOfRange) {
		t.Fatalf("cross-chunk: %v", err)
	}
}

// A delete-volume entry tombstones the volume and removes its chunks; every
// later command of it is refused NO_SUCH_VOLUME and changes nothing, and the
// tombstone survives Persist and Recover.
func TestApplyDeleteVolume(t *testing.T) {
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	wr := func(index, vol, epoch, off uint64) error {
		return sm.Apply(index, encodeCommand(command{Op: cmdWrite, Volume: vol, Epoch: epoch, Offset: off, Length: 1, Data: []byte{1}}))
	}
	for i, off := range []uint64{0, testChunk, 2 * testChunk} {
		if err := wr(uint64(i+1), 9, 3, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := wr(4, 8, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := sm.Apply(5, encodeCommand(command{Op: cmdDeleteVolume, Volume: 9})); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if n := st.volumeChunks(9); n != 0 || sm.epochOf(9) != tombstoneEpoch {
		t.Fatalf("after delete: %d chunks, epoch %#x", n, sm.epochOf(9))
	}
	if st.volumeChunks(8) != 1 {
		t.Fatal("delete removed another volume's chunk")
	}
	for i, c := range []command{
		{Op: cmdWrite, Volume: 9, Epoch: 4, Length: 1, Data: []byte{2}},
		{Op: cmdWrite, Volume: 9, Epoch: 1 << 62, Length: 1, Data: []byte{2}},
		{Op: cmdFence, Volume: 9, Epoch: 7},
		{Op: cmdWriteZeroes, Volume: 9, Epoch: 4, Length: 8},
	} {
		if err := sm.Apply(uint64(6+i), encodeCommand(c)); !errors.Is(err, api.ErrNoSuchVolume) {
			t.Fatalf("%v after delete: %v", c.Op, err)
		}
	}
	if st.volumeChunks(9) != 0 || sm.epochOf(9) != tombstoneEpoch || sm.Applied() != 9 {
		t.Fatal("a deleted volume's command changed state")
	}
	// Applying the delete again (a replay) is harmless.
	if err := sm.Apply(10, encodeCommand(command{Op: cmdDeleteVolume, Volume: 9})); err != nil {
		t.Fatal(err)
	}
	if err := sm.Persist(10, sm.Capture()); err != nil {
		t.Fatal(err)
	}
	re := newStateMachine(1, testChunk, st.crash(), nil)
	if idx, _, err := re.Recover(); err != nil || idx != 10 || re.epochOf(9) != tombstoneEpoch {
		t.Fatalf("recover: %d %v epoch %#x", idx, err, re.epochOf(9))
	}
}

// A crash after a delete was applied but before it was persisted: the
// restarted replica replays the writes (recreating chunks) and then the
// delete, and ends with nothing of the volume. A chunk of a tombstoned
// volume that survived a crash anyway is swept by Recover.
func TestDeleteVolumeCrashAndSweep(t *testing.T) {
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	log := [][]byte{
		encodeCommand(command{Op: cmdWrite, Volume: 9, Epoch: 1, Length: 1, Data: []byte{1}}),
		encodeCommand(command{Op: cmdWrite, Volume: 9, Epoch: 1, Offset: testChunk, Length: 1, Data: []byte{1}}),
		encodeCommand(command{Op: cmdDeleteVolume, Volume: 9}),
	}
	if err := sm.Apply(1, log[0]); err != nil {
		t.Fatal(err)
	}
	if err := sm.Persist(1, sm.Capture()); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(log); i++ {
		if err := sm.Apply(uint64(i+1), log[i]); err != nil {
			t.Fatal(err)
		}
	}
	st2 := st.crash()
	re := newStateMachine(1, testChunk, st2, nil)
	idx, _, err := re.Recover()
	if err != nil || idx != 1 {
		t.Fatalf("recover: %d %v", idx, err)
	}
	for i := idx; i < uint64(len(log)); i++ {
		if err := re.Apply(i+1, log[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := st2.volumeChunks(9); n != 0 {
		t.Fatalf("%d chunks of the deleted volume after replay", n)
	}
	if err := re.Persist(3, re.Capture()); err != nil {
		t.Fatal(err)
	}
	// A chunk file the file system brought back: swept at the next start.
	st3 := st2.crash()
	st3.chunks[chunkID{Volume: 9, Index: 4}] = make([]byte, testChunk)
	if _, _, err := newStateMachine(1, testChunk, st3, nil).Recover(); err != nil {
		t.Fatal(err)
	}
	if n := st3.volumeChunks(9); n != 0 {
		t.Fatalf("%d chunks of a tombstoned volume after Recover", n)
	}
}

func TestApplyDiskErrorStops(t *testing.T) {
	st := newMemStore(testChunk)
	st.failAt = 2
	var failed []error
	sm := newStateMachine(5, testChunk, st, func(g uint64, err error) { failed = append(failed, err) })
	wr := encodeCommand(command{Op: cmdWrite, Volume: 1, Epoch: 1, Length: 1, Data: []byte{1}})
	if err := sm.Apply(1, wr); err != nil {
		t.Fatal(err)
	}
	err := sm.Apply(2, wr)
	var ae *api.Error
	if err == nil || errors.As(err, &ae) || !errors.Is(err, errDisk) {
		t.Fatalf("disk error: %v, want a non-api error wrapping the disk error", err)
	}
	if err := sm.Apply(3, encodeCommand(command{Op: cmdFence, Volume: 1, Epoch: 2})); err == nil {
		t.Fatal("a stopped replica applied another entry")
	}
	if len(failed) != 1 || sm.Applied() != 1 || sm.Failed() == nil {
		t.Fatalf("failed=%v applied=%d", failed, sm.Applied())
	}
	if err := sm.Apply(4, []byte{9, 9}); err == nil {
		t.Fatal("garbage applied")
	}
}

func TestApplyGarbageStops(t *testing.T) {
	sm := newStateMachine(5, testChunk, newMemStore(testChunk), nil)
	if err := sm.Apply(1, []byte("not a command at all, definitely")); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("garbage: %v", err)
	}
}

// randomLog builds a seeded log of commands over two volumes with rising epochs.
func randomLog(seed int64, n int) [][]byte {
	r := rand.New(rand.NewSource(seed))
	var log [][]byte
	epoch := map[uint64]uint64{1: 1, 2: 1}
	for i := 0; i < n; i++ {
		vol := uint64(1 + r.Intn(2))
		ep := epoch[vol]
		switch r.Intn(10) {
		case 0:
			epoch[vol]++
			log = append(log, encodeCommand(command{Op: cmdFence, Volume: vol, Epoch: epoch[vol]}))
			continue
		case 1:
			ep-- // a stale writer, fenced whenever the fence got there first
		}
		off := uint64(r.Intn(3*testChunk - 64))
		ln := uint32(1 + r.Intn(64))
		if off%testChunk+uint64(ln) > testChunk {
			ln = uint32(testChunk - off%testChunk)
		}
		c := command{Volume: vol, Epoch: ep, Offset: off, Length: ln}
		switch r.Intn(4) {
		case 0:
			c.Op = cmdTrim
		case 1:
			c.Op = cmdWriteZeroes
		default:
			c.Op = cmdWrite
			c.Data = make([]byte, ln)
			r.Read(c.Data)
		}
		log = append(log, encodeCommand(c))
	}
	return log
}

// A crash after a Persist replays the log from the persisted index over chunk
// files that may hold any later effects; the end state equals a run without crash.
func TestReplayIdempotent(t *testing.T) {
	log := randomLog(42, 400)
	ref := newMemStore(testChunk)
	refSM := newStateMachine(1, testChunk, ref, nil)
	for i, e := range log {
		_ = refSM.Apply(uint64(i+1), e)
	}

	for _, persistAt := range []int{0, 1, 100, 250, 399} {
		for _, crashAt := range []int{persistAt, persistAt + 1, 400} {
			if crashAt > 400 {
				continue
			}
			st := newMemStore(testChunk)
			sm := newStateMachine(1, testChunk, st, nil)
			for i := 0; i < crashAt; i++ {
				_ = sm.Apply(uint64(i+1), log[i])
				if i+1 == persistAt {
					if err := sm.Persist(uint64(i+1), sm.Capture()); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Some unsynced writes reached the disk, others not: simulate the
			// worst case by keeping them all (the synced copy is kept too).
			st2 := st.crash()
			for id, c := range st.chunks {
				st2.chunks[id] = bytes.Clone(c)
			}
			sm2 := newStateMachine(1, testChunk, st2, nil)
			idx, _, err := sm2.Recover()
			if err != nil {
				t.Fatal(err)
			}
			if int(idx) != persistAt {
				t.Fatalf("recovered index %d, want %d", idx, persistAt)
			}
			for i := int(idx); i < len(log); i++ {
				_ = sm2.Apply(uint64(i+1), log[i])
			}
			if !st2.equal(ref) {
				t.Fatalf("persist %d crash %d: replay diverged", persistAt, crashAt)
			}
			if !bytes.Equal(sm2.Capture(), refSM.Capture()) {
				t.Fatalf("persist %d crash %d: epochs diverged", persistAt, crashAt)
			}
		}
	}
}

func TestCapturePersistRecoverSnapshot(t *testing.T) {
	log := randomLog(7, 200)
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	for i, e := range log {
		_ = sm.Apply(uint64(i+1), e)
	}
	state := sm.Capture()
	if err := sm.Persist(200, state); err != nil {
		t.Fatal(err)
	}
	// Recover on the crashed copy sees exactly the persisted state, and the data
	// synced by Persist.
	st2 := st.crash()
	sm2 := newStateMachine(1, testChunk, st2, nil)
	idx, got, err := sm2.Recover()
	if err != nil || idx != 200 || !bytes.Equal(got, state) {
		t.Fatalf("recover: %d %x %v", idx, got, err)
	}
	if !st2.equal(st) {
		t.Fatal("Persist did not sync the data")
	}
	// A follower gets the same state through the snapshot methods.
	var buf bytes.Buffer
	if err := sm.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	fst := newMemStore(testChunk)
	fsm := newStateMachine(1, testChunk, fst, nil)
	_ = fsm.Apply(1, encodeCommand(command{Op: cmdWrite, Volume: 3, Epoch: 1, Length: 1, Data: []byte{1}}))
	if err := fsm.ReceiveSnapshot(200, &buf); err != nil {
		t.Fatal(err)
	}
	if err := fsm.InstallSnapshot(200, state); err != nil {
		t.Fatal(err)
	}
	if !fst.equal(st) || !bytes.Equal(fsm.Capture(), state) || fsm.Applied() != 200 {
		t.Fatal("installed snapshot differs from the leader")
	}
	if idx, _, _ := newStateMachine(1, testChunk, fst, nil).Recover(); idx != 200 {
		t.Fatalf("install did not record index: %d", idx)
	}
	if _, _, err := decodeEpochs([]byte{1, 0, 0, 0, 2, 0}); !errors.Is(err, ErrBadEpochTable) {
		t.Fatalf("bad table: %v", err)
	}
}

// TestCommandGolden freezes the command, epoch-table and meta encodings (they
// live in the WAL and in chunk directories). Run with -update to rewrite after
// a deliberate format change.
func TestCommandGolden(t *testing.T) {
	cmds := []command{
		{Op: cmdWrite, Volume: 0x0102030405060708, Epoch: 3, Offset: 16<<20 + 4096, Length: 5, Seq: 12, Settled: 10, Data: []byte("hello")},
		{Op: cmdTrim, Volume: 7, Epoch: 1, Offset: 512, Length: 65536, Seq: 1, Settled: 1},
		{Op: cmdWriteZeroes, Volume: 7, Epoch: 2, Offset: 0, Length: 4096, Seq: 1 << 40, Settled: 1<<40 - 3},
		{Op: cmdFence, Volume: 7, Epoch: 9},
		{Op: cmdDeleteVolume, Volume: 7},
	}
	var out strings.Builder
	for _, c := range cmds {
		b := encodeCommand(c)
		fmt.Fprintf(&out, "%-12v %s\n", c.Op, hex.EncodeToString(b))
		d, err := decodeCommand(b)
		if err != nil || d.Op != c.Op || d.Volume != c.Volume || d.Epoch != c.Epoch || d.Offset != c.Offset ||
			d.Length != c.Length || d.Seq != c.Seq || d.Settled != c.Settled || !bytes.Equal(d.Data, c.Data) {
			t.Fatalf("round trip of %+v: %+v %v", c, d, err)
		}
	}
	tbl := encodeEpochs(map[uint64]uint64{9: 2, 3: 1},
		map[uint64]*seqWindow{9: {settled: 5, applied: []seqRange{{5, 5}, {7, 9}}}, 3: {settled: 2}})
	fmt.Fprintf(&out, "%-12s %s\n", "epochs", hex.EncodeToString(tbl))
	fmt.Fprintf(&out, "%-12s %s\n", "meta", hex.EncodeToString(encodeMeta(1234, tbl)))
	path := filepath.Join("testdata", "command.golden")
	if *update {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Fatalf("encoding changed:\n got:\n%s\nwant:\n%s", out.String(), want)
	}
	for _, bad := range [][]byte{nil, make([]byte, 31), append([]byte{2}, make([]byte, 40)...),
		append([]byte{3}, make([]byte, 47)...), append([]byte{1, 9}, make([]byte, 30)...),
		append(encodeCommand(cmds[0]), 'x'), append(encodeCommand(cmds[3]), 'x')} {
		if _, err := decodeCommand(bad); !errors.Is(err, ErrBadCommand) {
			t.Fatalf("decode %x: %v", bad, err)
		}
	}
	e, w, err := decodeEpochs(tbl)
	if err != nil || len(e) != 2 || e[9] != 2 || len(w) != 2 || w[9].settled != 5 || !slices.Equal(w[9].applied, []seqRange{{5, 5}, {7, 9}}) {
		t.Fatalf("epoch table round trip: %v %v %v", e, w, err)
	}
}

// TestCommandV1Decodes: commands, epoch tables and meta records written
// before version 2 (testdata/command_v1.golden, frozen) are still read, as
// unnumbered requests: a WAL and chunk directory from before replay.
func TestCommandV1Decodes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "command_v1.golden"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		raw, err := hex.DecodeString(f[1])
		if err != nil {
			t.Fatal(err)
		}
		switch f[0] {
		case "epochs":
			e, w, err := decodeEpochs(raw)
			if err != nil || len(e) != 2 || e[3] != 1 || e[9] != 2 || len(w) != 0 {
				t.Fatalf("v1 epoch table: %v %v %v", e, w, err)
			}
		case "meta":
			if idx, _, err := decodeMeta(raw); err != nil || idx != 1234 {
				t.Fatalf("v1 meta: %d %v", idx, err)
			}
		default:
			c, err := decodeCommand(raw)
			if err != nil || c.Op.String() != f[0] || c.Volume == 0 && c.Op != cmdDeleteVolume || c.Seq != 0 {
				t.Fatalf("v1 %s: %+v %v", f[0], c, err)
			}
			if c.Op == cmdWrite && string(c.Data) != "hello" {
				t.Fatalf("v1 write carries %q", c.Data)
			}
		}
	}
}
