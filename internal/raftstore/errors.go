package raftstore

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors of the host. Proposal and read callbacks get nil, the state machine's
// own result (an *api.Error from Apply), or an error wrapping one of
// ErrNotLeader, ErrNoGroup, ErrStopped, ErrDiskFull or ErrIO; the data plane
// maps those to wire statuses (internal/chunkserver, statusOf).
var (
	// ErrConfig: the Config is invalid (zero NodeID, missing Log or Transport, ...).
	ErrConfig = errors.New("raftstore: invalid config")
	// ErrGroupExists: CreateGroup was called for a group the host already runs.
	ErrGroupExists = errors.New("raftstore: group already exists")
	// ErrNoGroup: the host does not run the group (never did, or RemoveGroup).
	ErrNoGroup = errors.New("raftstore: no such group")
	// ErrStopped: the host was stopped; callbacks outstanding then get it.
	ErrStopped = errors.New("raftstore: host stopped")
	// ErrNoPeers: a new group that does not join needs its initial members.
	ErrNoPeers = errors.New("raftstore: bootstrap needs peers")
	// ErrConfChangeRejected: raft refused a membership change, because another one
	// was still pending when it was proposed. Retry after the pending one applied.
	ErrConfChangeRejected = errors.New("raftstore: conf change rejected (another is pending)")
	// ErrNotLeader: this node does not lead the group, lost leadership (or its
	// term) before a proposal applied, or raft dropped the proposal. The error
	// is a *NotLeaderError, which names the leader when this node knows it.
	ErrNotLeader = errors.New("raftstore: not the leader")
	// ErrDiskFull: the group stopped because its disk is full: a log append
	// or the state machine failed with ENOSPC or EDQUOT. GroupStatus.Err and
	// every later callback of the group wrap it, and the cause.
	ErrDiskFull = errors.New("raftstore: disk full")
	// ErrIO: the group stopped after any other disk failure (see ErrDiskFull).
	ErrIO = errors.New("raftstore: disk IO error")
	// ErrPeerBusy: a Transport's SendSnapshot found the follower busy
	// (receiving another snapshot of the group, or too many); the stream is
	// retried after snapBusyBackoff.
	ErrPeerBusy = errors.New("raftstore: peer busy receiving snapshots")
)

// NotLeaderError is the ErrNotLeader a callback gets.
type NotLeaderError struct {
	Leader uint64 // the leader this node knows of; 0: none (or itself)
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return "raftstore: not the leader (leader unknown)"
	}
	return fmt.Sprintf("raftstore: not the leader (leader %d)", e.Leader)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// DiskFailure returns cause, a disk error that stops a group, wrapped in
// ErrDiskFull when the disk is full (cause wraps syscall.ENOSPC or
// syscall.EDQUOT, as internal/datastore's and internal/wal's errors do) and in
// ErrIO otherwise; a cause that already wraps either is returned as it is. It
// is the one place that tells a full disk from other disk errors.
func DiskFailure(cause error) error {
	switch {
	case errors.Is(cause, ErrDiskFull) || errors.Is(cause, ErrIO):
		return cause
	case errors.Is(cause, syscall.ENOSPC) || errors.Is(cause, syscall.EDQUOT):
		return fmt.Errorf("%w: %w", ErrDiskFull, cause)
	}
	return fmt.Errorf("%w: %w", ErrIO, cause)
}
