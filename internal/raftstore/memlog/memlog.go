package memlog

import (
	"errors"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/wal"
)

// ErrInjected is returned by Save while FailSave is set.
var ErrInjected = errors.New("memlog: injected save failure")

// Log is safe for concurrent use.
type Log struct {
	mu       sync.Mutex
	groups   map[uint64]*raft.MemoryStorage
	saves    int
	failSave bool
}

// New returns an empty Log.
func New() *Log { return &Log{groups: make(map[uint64]*raft.MemoryStorage)} }

func (l *Log) storage(group uint64) *raft.MemoryStorage {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.groups[group]
	if st == nil {
		st = raft.NewMemoryStorage()
		l.groups[group] = st
	}
	return st
}

// Save applies every update: snapshot, then entries, then hard state.
func (l *Log) Save(updates []wal.Update) error {
	l.mu.Lock()
	fail := l.failSave
	l.saves++
	l.mu.Unlock()
	if fail {
		return ErrInjected
	}
	for _, u := range updates {
		st := l.storage(u.Group)
		if !raft.IsEmptySnap(u.Snapshot) {
			if err := st.ApplySnapshot(u.Snapshot); err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
				return err
			}
		}
		if len(u.Entries) > 0 {
			if err := st.Append(u.Entries); err != nil {
				return err
			}
		}
		if !raft.IsEmptyHardState(u.HardState) {
			if err := st.SetHardState(u.HardState); err != nil {
				return err
			}
		}
	}
	return nil
}

// SaveAsync is Save with its outcome handed to done, at once.
func (l *Log) SaveAsync(updates []wal.Update, done func(error)) { done(l.Save(updates)) }

// SetApplied does nothing: MemoryStorage holds every entry until compaction.
func (l *Log) SetApplied(group, index uint64) {}

// Storage returns the group's storage, created empty if unknown.
func (l *Log) Storage(group uint64) raft.Storage { return l.storage(group) }

// CreateSnapshot records snap and compacts the log up to compactTo. A snapshot not
// newer than the current one is ignored.
func (l *Log) CreateSnapshot(group uint64, snap *raftpb.Snapshot, compactTo uint64) error {
	st := l.storage(group)
	md := snap.GetMetadata()
	if _, err := st.CreateSnapshot(md.GetIndex(), md.GetConfState(), snap.GetData()); err != nil {
		if errors.Is(err, raft.ErrSnapOutOfDate) {
			return nil
		}
		return err
	}
	if compactTo == 0 {
		return nil
	}
	if err := st.Compact(compactTo); err != nil && !errors.Is(err, raft.ErrCompacted) {
		return err
	}
	return nil
}

// RemoveGroup forgets the group.
func (l *Log) RemoveGroup(group uint64) error {
	l.mu.Lock()
	delete(l.groups, group)
	l.mu.Unlock()
	return nil
}

// FirstIndex is the group's first log index (compaction moves it), 0 if unknown.
func (l *Log) FirstIndex(group uint64) uint64 {
	l.mu.Lock()
	st := l.groups[group]
	l.mu.Unlock()
	if st == nil {
		return 0
	}
	i, _ := st.FirstIndex()
	return i
}

// Saves counts Save calls.
func (l *Log) Saves() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.saves
}

// FailSave makes every later Save fail (true) or succeed again (false).
func (l *Log) FailSave(fail bool) {
	l.mu.Lock()
	l.failSave = fail
	l.mu.Unlock()
}
