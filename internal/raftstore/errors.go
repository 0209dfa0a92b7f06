package raftstore

import "errors"

// Sentinel errors returned by Host methods. Results delivered to proposal and read
// callbacks are *api.Error values (NOT_LEADER with a hint, IO_ERROR, NO_SUCH_COPYSET),
// so the data plane can put them on the wire unchanged.
var (
	// ErrConfig: the Config is invalid (zero NodeID, missing Log or Transport, ...).
	ErrConfig = errors.New("raftstore: invalid config")
	// ErrGroupExists: CreateGroup was called for a group the host already runs.
	ErrGroupExists = errors.New("raftstore: group already exists")
	// ErrNoGroup: the host does not run the group.
	ErrNoGroup = errors.New("raftstore: no such group")
	// ErrStopped: the host was stopped.
	ErrStopped = errors.New("raftstore: host stopped")
	// ErrNoPeers: a new group that does not join needs its initial members.
	ErrNoPeers = errors.New("raftstore: bootstrap needs peers")
	// ErrConfChangeRejected: raft refused a membership change, because another one
	// was still pending when it was proposed. Retry after the pending one applied.
	ErrConfChangeRejected = errors.New("raftstore: conf change rejected (another is pending)")
	// ErrGroupFailed: the group stopped after a state machine or log failure; see
	// GroupStatus.Healthy and the log for the cause.
	ErrGroupFailed = errors.New("raftstore: group failed")
)
