package datastore

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

var (
	// ErrNoSpace means the disk is full (ENOSPC). The operation changed nothing
	// that a later retry could not redo; a chunkserver stops taking writes.
	ErrNoSpace = errors.New("datastore: no space left on device")
	// ErrIO wraps every other error returned by the operating system for a
	// chunk, pool, meta or snapshot file. A replica that sees it while
	// applying must stop, never skip the entry.
	ErrIO = errors.New("datastore: I/O error")
	// ErrCorrupt means stored or received bytes failed validation: a meta or
	// info file with a bad CRC, or a snapshot stream that is truncated,
	// malformed or fails its trailer CRC.
	ErrCorrupt = errors.New("datastore: corrupt data")
	// ErrClosed is returned by every method after Store.Close or after the
	// copyset was removed.
	ErrClosed = errors.New("datastore: closed")
	// ErrOutOfRange means an IO does not fit inside one chunk. Callers split
	// IO at chunk boundaries before they get here; this is an assertion.
	ErrOutOfRange = errors.New("datastore: range outside the chunk")
	// ErrChunkSize means a copyset was opened, or a snapshot received, with a
	// chunk size other than the one the copyset was created with.
	ErrChunkSize = errors.New("datastore: chunk size mismatch")
	// ErrNoStaged means InstallStaged was called with no complete received
	// snapshot waiting in the staging area.
	ErrNoStaged = errors.New("datastore: no staged snapshot")
)

// ioError classifies an OS error: ENOSPC wraps ErrNoSpace, anything else ErrIO.
// op says what was being done and usually names the file.
func ioError(op string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %s: %w", ErrNoSpace, op, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrIO, op, err)
}
