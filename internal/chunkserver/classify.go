package chunkserver

import (
	"errors"

	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/pkg/api"
)

// isNoSpace reports whether err means the disk is full.
func isNoSpace(err error) bool { return errors.Is(err, datastore.ErrNoSpace) }

// isNoGroup reports whether err means the copyset is not hosted.
func isNoGroup(err error) bool { return errors.Is(err, api.ErrNoSuchCopyset) }

// diskState is the heartbeat state for a replica stopped by err.
func diskState(err error) string {
	if isNoSpace(err) {
		return "disk full"
	}
	return "io error"
}
