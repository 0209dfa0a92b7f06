package memlog

import (
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/wal"
)

func ents(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, &raftpb.Entry{Index: new(i), Term: new(term), Data: []byte{byte(i)}})
	}
	return out
}

func TestSaveSnapshotCompact(t *testing.T) {
	l := New()
	if err := l.Save([]wal.Update{{Group: 1, Entries: ents(1, 10, 1), HardState: &raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(8))}}}); err != nil {
		t.Fatal(err)
	}
	st := l.Storage(1)
	hs, _, _ := st.InitialState()
	if last, _ := st.LastIndex(); last != 10 || hs.GetCommit() != 8 {
		t.Fatalf("last %d commit %d", last, hs.GetCommit())
	}
	// An entry at an existing index truncates from there (a new leader's log).
	if err := l.Save([]wal.Update{{Group: 1, Entries: ents(9, 9, 2)}}); err != nil {
		t.Fatal(err)
	}
	if last, _ := st.LastIndex(); last != 9 {
		t.Fatalf("after truncation last %d, want 9", last)
	}
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	snap := &raftpb.Snapshot{Data: []byte("s"), Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(8)), Term: new(uint64(1)), ConfState: cs}}
	if err := l.CreateSnapshot(1, snap, 6); err != nil {
		t.Fatal(err)
	}
	if first, _ := st.FirstIndex(); first != 7 || l.FirstIndex(1) != 7 {
		t.Fatalf("first index %d after compacting to 6", first)
	}
	// An older snapshot (one received meanwhile is newer) is ignored.
	old := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(5)), Term: new(uint64(1)), ConfState: cs}}
	if err := l.CreateSnapshot(1, old, 0); err != nil {
		t.Fatalf("older snapshot: %v", err)
	}
	if s, _ := st.Snapshot(); s.GetMetadata().GetIndex() != 8 {
		t.Fatalf("snapshot index %d", s.GetMetadata().GetIndex())
	}
	l.FailSave(true)
	if err := l.Save(nil); !errors.Is(err, ErrInjected) {
		t.Fatalf("injected failure: %v", err)
	}
	l.FailSave(false)
	if err := l.RemoveGroup(1); err != nil || l.FirstIndex(1) != 0 {
		t.Fatalf("remove: %v", err)
	}
}
