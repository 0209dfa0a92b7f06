package chunkserver

import (
	"errors"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/pkg/api"
)

// statusOf maps the outcome of a proposal, a read barrier or a read to the
// wire status (and hint) the client gets: the one place that does. Outcomes
// are nil, a replicated result (*api.Error, from Apply), raftstore's typed
// errors, or a disk error reading a chunk.
func statusOf(err error) (api.Status, uint64) {
	var ae *api.Error
	var nl *raftstore.NotLeaderError
	switch {
	case err == nil:
		return api.StatusOK, 0
	case errors.As(err, &ae):
		return ae.Status, ae.Hint
	case errors.As(err, &nl): // ErrStopped too: the client tries the leader
		return api.StatusNotLeader, nl.Leader
	case errors.Is(err, raftstore.ErrStopped), errors.Is(err, raftstore.ErrRaftPanic):
		// ErrRaftPanic: this replica stopped, the others serve.
		return api.StatusNotLeader, 0
	case errors.Is(err, raftstore.ErrNoGroup):
		return api.StatusNoSuchCopyset, 0
	case errors.Is(err, raftstore.ErrDiskFull):
		// A replica stopped by a full disk, its own or its WAL's: the client
		// tries the other members, and reports NO_SPACE once a majority says so.
		return api.StatusNoSpace, 0
	}
	return api.StatusIOError, 0 // raftstore.ErrIO, a failed read
}

// diskStateOf is the heartbeat disk state of a chunkserver whose first
// stopped replica failed with err (nil: none stopped).
func diskStateOf(err error) api.DiskState {
	switch {
	case err == nil:
		return api.DiskState_DISK_STATE_OK
	case errors.Is(err, raftstore.ErrDiskFull):
		return api.DiskState_DISK_STATE_FULL
	}
	return api.DiskState_DISK_STATE_IO_ERROR
}
