package chunkserver

import (
	"bytes"
	"io"
	"log/slog"
	"testing"

	"github.com/basalt-storage/basalt/internal/datastore"
)

// snapTestChunk is the chunk size of the overlapping-snapshot tests' copysets.
const snapTestChunk = 64 << 10

// newDiskSM returns the state machine of copyset 1 on a real datastore.
func newDiskSM(t *testing.T) *stateMachine {
	t.Helper()
	st, err := datastore.Open(datastore.Config{Dir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cs, err := st.Copyset(1, snapTestChunk)
	if err != nil {
		t.Fatal(err)
	}
	return newStateMachine(1, snapTestChunk, cs, nil)
}

// leaderSnapshot is a snapshot as a leader streams it: its index, its state
// (Capture) and its data stream (WriteSnapshot).
type leaderSnapshot struct {
	index uint64
	state []byte
	data  []byte
}

func takeSnapshot(t *testing.T, sm *stateMachine) leaderSnapshot {
	t.Helper()
	var buf bytes.Buffer
	if err := sm.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return leaderSnapshot{index: sm.Applied(), state: sm.Capture(), data: buf.Bytes()}
}

// block0 reads the first 4 KiB of volume 3.
func block0(t *testing.T, sm *stateMachine) []byte {
	t.Helper()
	p := make([]byte, 4096)
	if err := sm.store.ReadAt(chunkID{Volume: 3}, p, 0); err != nil {
		t.Fatal(err)
	}
	return p
}

// overlapLeader applies writes to a leader and takes two snapshots of it:
// old at index 10 (volume 3's first block all 'a'), new at index 20 (all 'b').
func overlapLeader(t *testing.T) (old, new leaderSnapshot) {
	leader := newDiskSM(t)
	write := func(index uint64, fill byte) {
		c := command{Op: cmdWrite, Volume: 3, Epoch: 1, Offset: 0, Length: 4096, Data: bytes.Repeat([]byte{fill}, 4096)}
		if err := leader.Apply(index, encodeCommand(c)); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= 10; i++ {
		write(i, 'a')
	}
	old = takeSnapshot(t, leader)
	for i := uint64(11); i <= 20; i++ {
		write(i, 'b')
	}
	new = takeSnapshot(t, leader)
	return old, new
}

// A returning follower gets two overlapping snapshot streams: both are staged
// before raft installs the older one. Installing index 10 must install index
// 10's data, not whatever was staged last (the divergence TestMoveKeepsRedundancy
// found: the newer data recorded as the older index, then older entries
// replayed over it).
func TestInstallSnapshotUsesItsOwnStagedData(t *testing.T) {
	old, new := overlapLeader(t)
	f := newDiskSM(t)
	if err := f.ReceiveSnapshot(old.index, bytes.NewReader(old.data)); err != nil {
		t.Fatal(err)
	}
	if err := f.ReceiveSnapshot(new.index, bytes.NewReader(new.data)); err != nil {
		t.Fatal(err)
	}
	if err := f.InstallSnapshot(old.index, old.state); err != nil {
		t.Fatal(err)
	}
	if got := block0(t, f); got[0] != 'a' {
		t.Fatalf("after installing snapshot %d the block holds %q, want index %d's 'a'", old.index, got[:1], old.index)
	}
	if err := f.InstallSnapshot(new.index, new.state); err != nil {
		t.Fatal(err)
	}
	if got := block0(t, f); got[0] != 'b' || f.Applied() != new.index {
		t.Fatalf("after installing snapshot %d the block holds %q (applied %d), want 'b'", new.index, got[:1], f.Applied())
	}
}

// The other order: the older snapshot's data is staged and installed, the
// newer one's never arrived (its stream was refused or failed). Installing the
// newer index must not record it over the older data ("snapshot already
// installed"): the replica would differ from the others.
func TestInstallSnapshotWithoutItsDataFails(t *testing.T) {
	old, new := overlapLeader(t)
	f := newDiskSM(t)
	if err := f.ReceiveSnapshot(old.index, bytes.NewReader(old.data)); err != nil {
		t.Fatal(err)
	}
	if err := f.InstallSnapshot(old.index, old.state); err != nil {
		t.Fatal(err)
	}
	if err := f.InstallSnapshot(new.index, new.state); err == nil {
		t.Fatalf("snapshot %d installed without its data: applied %d, block holds %q", new.index, f.Applied(), block0(t, f)[:1])
	}
	if idx, _, _ := f.Recover(); idx == new.index {
		t.Fatalf("index %d recorded over index %d's data", new.index, old.index)
	}
}

// The restart case the "already installed" path is for: the process stopped
// after the datastore installed snapshot 10 but before its index was
// recorded; raft calls InstallSnapshot(10) again, finds nothing staged, and
// records 10 because 10 is the install the datastore last began.
func TestInstallSnapshotAgainAfterRestart(t *testing.T) {
	old, _ := overlapLeader(t)
	f := newDiskSM(t)
	if err := f.ReceiveSnapshot(old.index, bytes.NewReader(old.data)); err != nil {
		t.Fatal(err)
	}
	if err := f.store.InstallStaged(old.index); err != nil { // then the process died
		t.Fatal(err)
	}
	if err := f.InstallSnapshot(old.index, old.state); err != nil {
		t.Fatal(err)
	}
	if idx, _, err := f.Recover(); idx != old.index || err != nil || block0(t, f)[0] != 'a' {
		t.Fatalf("recover: %d %v, block %q", idx, err, block0(t, f)[:1])
	}
}
