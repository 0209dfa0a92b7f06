package chunkserver

import (
	"errors"
	"syscall"

	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/pkg/api"
)

// isNoSpace reports whether err means the disk is full (a chunk write, or the
// WAL's own ENOSPC).
func isNoSpace(err error) bool {
	return errors.Is(err, datastore.ErrNoSpace) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// stoppedStatus is what a replica stopped by a disk error answers: the client
// tries the other members, and reports the error once a majority says so.
func stoppedStatus(err error) api.Status {
	if isNoSpace(err) {
		return api.StatusNoSpace
	}
	return api.StatusIOError
}

// isNoGroup reports whether err means the copyset is not hosted.
func isNoGroup(err error) bool { return errors.Is(err, api.ErrNoSuchCopyset) }

// diskState is the heartbeat state for a replica stopped by err.
func diskState(err error) string {
	if isNoSpace(err) {
		return "disk full"
	}
	return "io error"
}
