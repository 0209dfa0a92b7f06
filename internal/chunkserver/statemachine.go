package chunkserver

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/pkg/api"
)

// chunkStore is what the state machine needs of one copyset's chunk files;
// *datastore.Copyset implements it.
type chunkStore interface {
	WriteAt(id chunkID, p []byte, off int64) error
	ReadAt(id chunkID, p []byte, off int64) error
	Discard(id chunkID, off, n int64) error
	WriteZeroes(id chunkID, off, n int64) error
	Sync() error
	SaveMeta(b []byte) error
	LoadMeta() ([]byte, error)
	WriteSnapshot(w io.Writer) error
	// ReceiveSnapshot stages the data of the snapshot of index; InstallStaged
	// installs the data staged for index only (datastore.ErrNoStaged if none).
	// belongs, when not nil, says which chunks the copyset may hold: a
	// stream with another chunk is refused and nothing is staged.
	ReceiveSnapshotChecked(index uint64, r io.Reader, belongs func(chunkID) bool) error
	InstallStaged(index uint64) error
	// Installed is the index of the last InstallStaged begun: its data is in
	// place even when the process stopped inside it.
	Installed() (uint64, error)
	// DropStaged removes staged snapshots of indexes up to through.
	DropStaged(through uint64) error
	// DeleteVolume removes every chunk of a volume, durably.
	DeleteVolume(volume uint64) error
	// Volumes lists the volumes that have chunks here.
	Volumes() ([]uint64, error)
}

// ErrStopped is the error a copyset's state machine returns once a disk error
// stopped it: it applies nothing more until the process restarts.
var ErrStopped = errors.New("chunkserver: copyset replica stopped after a disk error")

// stateMachine is the replicated state of one copyset (raftstore.StateMachine):
// the chunk data in a chunkStore plus the per-volume highest epoch.
//
// Goroutines: Apply, Capture and InstallSnapshot run on the raftstore worker that
// owns the group (one at a time); Persist runs on a raftstore snapshot goroutine
// beside Apply; epochOf runs on any handler goroutine.
type stateMachine struct {
	group     uint64
	chunkSize int64
	store     chunkStore
	log       *slog.Logger
	// afterDelete, when set, runs right after a delete-volume entry was
	// applied (a fault-injection point: Knobs.AfterDeleteVolume).
	afterDelete func(group, volume uint64)
	// onFail is told once about the disk error that stopped this replica.
	onFail func(group uint64, err error)

	applied atomic.Uint64
	failed  atomic.Pointer[error]

	mu sync.Mutex // guards epochs and windows
	// epochs: highest epoch applied per volume; tombstoneEpoch for a deleted
	// volume.
	// INVARIANT: epochs[v] never decreases, except when InstallSnapshot replaces
	// the whole table with the (newer) leader's.
	// INVARIANT: once epochs[v] is tombstoneEpoch, no chunk of v is created
	// here again (every command of v is refused), and Recover sweeps any chunk
	// of v a crash left behind.
	epochs map[uint64]uint64
	// windows: per volume, the numbered requests of the writer of epochs[v]
	// (retried.go).
	// INVARIANT: windows[v] belongs to epochs[v]: raising the epoch drops it.
	windows map[uint64]*seqWindow
	// copysets returns the copyset count of the group's pool, which decides
	// the chunks a received snapshot may hold; nil: not checked (tests).
	copysets func() (uint32, bool)
}

func newStateMachine(group uint64, chunkSize int64, store chunkStore, onFail func(uint64, error)) *stateMachine {
	if onFail == nil {
		onFail = func(uint64, error) {}
	}
	return &stateMachine{
		group:     group,
		chunkSize: chunkSize,
		store:     store,
		log:       slog.Default(),
		onFail:    onFail,
		epochs:    make(map[uint64]uint64),
		windows:   make(map[uint64]*seqWindow),
	}
}

// Apply applies one committed command. Rejections (FENCED, a deleted volume,
// answered NO_SUCH_VOLUME) are results, returned as *api.Error, and change nothing. A disk error stops
// the replica: it is returned as a non-api error (raftstore then stops the group).
func (sm *stateMachine) Apply(index uint64, data []byte) error {
	return sm.applyEntry(index, data, false)
}

// ApplyFollower is Apply on a replica that does not lead the copyset
// (raftstore.FollowerApplier): large writes go around the page cache, since
// the leader serves the reads.
func (sm *stateMachine) ApplyFollower(index uint64, data []byte) error {
	return sm.applyEntry(index, data, true)
}

// uncachedStore is the optional part of a chunkStore that writes around the
// page cache (*datastore.Copyset).
type uncachedStore interface {
	WriteAtUncached(id chunkID, p []byte, off int64) error
}

func (sm *stateMachine) applyEntry(index uint64, data []byte, uncached bool) error {
	if p := sm.failed.Load(); p != nil {
		return *p
	}
	if len(data) == 0 { // raft's empty entry of a new term
		sm.applied.Store(index)
		return nil
	}
	c, err := decodeCommand(data)
	if err != nil {
		return sm.fail(fmt.Errorf("copyset %#x entry %d: %w", sm.group, index, err))
	}
	res, err := sm.apply(c, uncached)
	if err == nil && c.Op == cmdDeleteVolume && sm.afterDelete != nil {
		sm.afterDelete(sm.group, c.Volume)
	}
	if err != nil {
		return sm.fail(fmt.Errorf("copyset %#x entry %d (%v volume %d offset %d): %w",
			sm.group, index, c.Op, c.Volume, c.Offset, err))
	}
	sm.applied.Store(index)
	return res
}

// apply returns (result, disk error).
func (sm *stateMachine) apply(c command, uncached bool) (error, error) {
	if c.Op == cmdDeleteVolume {
		return nil, sm.deleteVolume(c.Volume)
	}
	sm.mu.Lock()
	high := sm.epochs[c.Volume]
	if high == tombstoneEpoch {
		sm.mu.Unlock()
		return api.ErrNoSuchVolume, nil
	}
	if c.Epoch < high {
		sm.mu.Unlock()
		return api.ErrFenced, nil
	}
	if c.Epoch > high {
		sm.epochs[c.Volume] = c.Epoch
		delete(sm.windows, c.Volume) // a new writer numbers its requests afresh
	}
	if c.Seq != 0 {
		w := sm.windows[c.Volume]
		if w == nil {
			w = &seqWindow{}
			sm.windows[c.Volume] = w
		}
		if apply, res := w.admit(c.Seq, c.Settled); !apply {
			sm.mu.Unlock()
			sm.log.Info("retried request not applied again", "copyset", sm.group, "volume", c.Volume,
				"epoch", c.Epoch, "seq", c.Seq, "op", c.Op, "offset", c.Offset, "answer", statusText(res))
			return res, nil
		}
	}
	sm.mu.Unlock()
	if c.Op == cmdFence {
		return nil, nil
	}
	id := chunkID{Volume: c.Volume, Index: c.Offset / uint64(sm.chunkSize)}
	off := int64(c.Offset % uint64(sm.chunkSize))
	if off+int64(c.Length) > sm.chunkSize {
		// The handler never proposes this; a command that would cross a chunk is
		// refused identically by every replica.
		return api.ErrOutOfRange, nil
	}
	switch c.Op {
	case cmdWrite:
		if u, ok := sm.store.(uncachedStore); ok && uncached {
			return nil, u.WriteAtUncached(id, c.Data, off)
		}
		return nil, sm.store.WriteAt(id, c.Data, off)
	case cmdTrim:
		return nil, sm.store.Discard(id, off, int64(c.Length))
	case cmdWriteZeroes:
		return nil, sm.store.WriteZeroes(id, off, int64(c.Length))
	}
	panic("unreachable: decodeCommand checked the op")
}

// deleteVolume applies a delete-volume entry: tombstone first, so that
// nothing of the volume is applied from here on, then the chunks go. Applying
// it twice (a replay after a crash) removes what replayed writes recreated.
func (sm *stateMachine) deleteVolume(volume uint64) error {
	sm.mu.Lock()
	sm.epochs[volume] = tombstoneEpoch
	delete(sm.windows, volume)
	sm.mu.Unlock()
	if err := sm.store.DeleteVolume(volume); err != nil {
		return err
	}
	sm.log.Info("volume deleted from copyset", "copyset", sm.group, "volume", volume)
	return nil
}

// sweepTombstoned removes the chunks of tombstoned volumes (Recover: none
// should exist, but a chunk file the file system brought back, or one
// from before tombstones existed, must not outlive its volume).
func (sm *stateMachine) sweepTombstoned() error {
	vols, err := sm.store.Volumes()
	if err != nil {
		return err
	}
	for _, v := range vols {
		if sm.epochOf(v) != tombstoneEpoch {
			continue
		}
		if err := sm.store.DeleteVolume(v); err != nil {
			return err
		}
		sm.log.Info("swept the chunks of a deleted volume", "copyset", sm.group, "volume", v)
	}
	return nil
}

// liveVolumes returns the volumes this copyset has epochs or chunks of and
// has not tombstoned.
func (sm *stateMachine) liveVolumes() ([]uint64, error) {
	vols, err := sm.store.Volumes()
	if err != nil {
		return nil, err
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	out := make([]uint64, 0, len(sm.epochs)+len(vols))
	for v, e := range sm.epochs {
		if e != tombstoneEpoch {
			out = append(out, v)
		}
	}
	for _, v := range vols {
		if _, ok := sm.epochs[v]; !ok {
			out = append(out, v)
		}
	}
	return out, nil
}

// fail stops the replica for good after the disk error err; the error it
// keeps tells a full disk from other errors (raftstore.DiskFailure).
func (sm *stateMachine) fail(err error) error {
	err = raftstore.DiskFailure(err)
	if sm.failed.CompareAndSwap(nil, &err) {
		sm.onFail(sm.group, err)
	}
	return *sm.failed.Load()
}

// Failed returns the disk error that stopped the replica (wrapping
// raftstore.ErrDiskFull or raftstore.ErrIO), or nil.
func (sm *stateMachine) Failed() error {
	if p := sm.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// epochOf returns the highest epoch applied for volume.
func (sm *stateMachine) epochOf(volume uint64) uint64 {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.epochs[volume]
}

// numbered tells what this replica applied of volume's request seq of the
// writer of epoch, as Apply would decide it now: applied true if it was
// (a retry: its effect is there); api.ErrStaleRequest if it was settled,
// api.ErrFenced or api.ErrNoSuchVolume if the epoch is refused; false and
// nil if it would be applied (seq 0: never numbered).
func (sm *stateMachine) numbered(volume, epoch, seq uint64) (bool, error) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	high := sm.epochs[volume]
	switch {
	case high == tombstoneEpoch:
		return false, api.ErrNoSuchVolume
	case epoch < high:
		return false, api.ErrFenced
	case epoch > high || seq == 0:
		return false, nil
	}
	w := sm.windows[volume]
	switch {
	case w == nil:
		return false, nil
	case seq < w.settled:
		return false, api.ErrStaleRequest
	}
	return w.has(seq), nil
}

// Applied returns the index of the last applied entry.
func (sm *stateMachine) Applied() uint64 { return sm.applied.Load() }

// Capture returns the encoded epoch table (with the writers' request
// windows) as of the last applied entry.
func (sm *stateMachine) Capture() []byte {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return encodeEpochs(sm.epochs, sm.windows)
}

// Persist makes every applied effect durable, then records (index, state).
// INVARIANT: the meta record never names an index whose data is not synced.
func (sm *stateMachine) Persist(index uint64, state []byte) error {
	if err := sm.store.Sync(); err != nil {
		return sm.fail(fmt.Errorf("copyset %#x persist %d: %w", sm.group, index, err))
	}
	if err := sm.store.SaveMeta(encodeMeta(index, state)); err != nil {
		return sm.fail(fmt.Errorf("copyset %#x persist %d: %w", sm.group, index, err))
	}
	return nil
}

// Recover loads what Persist or InstallSnapshot recorded and adopts its epochs.
func (sm *stateMachine) Recover() (uint64, []byte, error) {
	b, err := sm.store.LoadMeta()
	if err != nil {
		return 0, nil, fmt.Errorf("copyset %#x recover: %w", sm.group, err)
	}
	if b == nil {
		return 0, nil, nil
	}
	index, state, err := decodeMeta(b)
	if err != nil {
		return 0, nil, fmt.Errorf("copyset %#x recover: %w", sm.group, err)
	}
	epochs, windows, _ := decodeEpochs(state) // checked by decodeMeta
	sm.mu.Lock()
	sm.epochs, sm.windows = epochs, windows
	sm.mu.Unlock()
	if err := sm.sweepTombstoned(); err != nil {
		return 0, nil, fmt.Errorf("copyset %#x recover: %w", sm.group, err)
	}
	if err := sm.store.DropStaged(index); err != nil {
		return 0, nil, fmt.Errorf("copyset %#x recover: %w", sm.group, err)
	}
	sm.applied.Store(index)
	return index, state, nil
}

// WriteSnapshot streams the chunk data (leader side).
func (sm *stateMachine) WriteSnapshot(w io.Writer) error { return sm.store.WriteSnapshot(w) }

// ReceiveSnapshot stages a stream written by a leader's WriteSnapshot, the
// data of the snapshot of index. Staged snapshots raft can no longer install
// (at or below the applied index) are dropped first.
func (sm *stateMachine) ReceiveSnapshot(index uint64, r io.Reader) error {
	if err := sm.store.DropStaged(sm.applied.Load()); err != nil {
		return fmt.Errorf("copyset %#x receive snapshot %d: %w", sm.group, index, err)
	}
	var belongs func(chunkID) bool
	if sm.copysets != nil {
		n, ok := sm.copysets()
		if !ok {
			return fmt.Errorf("copyset %#x receive snapshot %d: the pool's copyset count is not known yet", sm.group, index)
		}
		_, self := api.SplitGroupID(sm.group)
		belongs = func(id chunkID) bool { return api.CopysetOf(id.Volume, id.Index, n) == self }
	}
	return sm.store.ReceiveSnapshotChecked(index, r, belongs)
}

// InstallSnapshot swaps in the data staged for index and adopts the
// snapshot's epochs. Only the data received for index is used: a follower
// can have two snapshots staged (overlapping streams), and installing the
// other one's data under this index made its replica differ from the others.
func (sm *stateMachine) InstallSnapshot(index uint64, state []byte) error {
	epochs, windows, err := decodeEpochs(state)
	if err != nil {
		return sm.fail(fmt.Errorf("copyset %#x install snapshot %d: %w", sm.group, index, err))
	}
	if err := sm.store.InstallStaged(index); errors.Is(err, datastore.ErrNoStaged) {
		// Called again after a restart that followed an install whose meta
		// record was not yet saved: the data is in place already, if the last
		// install begun was this one. Anything else would record index over
		// data that is not its own.
		inst, ierr := sm.store.Installed()
		if ierr != nil || inst != index {
			return sm.fail(fmt.Errorf("copyset %#x install snapshot %d: %w (last install begun: %d, %v)",
				sm.group, index, err, inst, ierr))
		}
		sm.log.Warn("snapshot already installed; recording it", "copyset", sm.group, "index", index)
	} else if err != nil {
		return sm.fail(fmt.Errorf("copyset %#x install snapshot %d: %w", sm.group, index, err))
	}
	if err := sm.store.SaveMeta(encodeMeta(index, state)); err != nil {
		return sm.fail(fmt.Errorf("copyset %#x install snapshot %d: %w", sm.group, index, err))
	}
	sm.mu.Lock()
	sm.epochs, sm.windows = epochs, windows
	sm.mu.Unlock()
	if err := sm.sweepTombstoned(); err != nil {
		return sm.fail(fmt.Errorf("copyset %#x install snapshot %d: %w", sm.group, index, err))
	}
	sm.applied.Store(index)
	return nil
}

// statusText names the answer a result gives ("OK" for nil).
func statusText(res error) string {
	st, _ := statusOf(res)
	return st.String()
}
