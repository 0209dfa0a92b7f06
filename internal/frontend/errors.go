package frontend

import "errors"

// Error classes: what kind of failure an IO met, in terms every block protocol
// has a code for. An Opener's Classify wraps each failure of its backends in one
// of them, and a protocol server maps the class to its own code with errors.Is
// (the table is in doc.go). Anything unclassified counts as ErrIO.
var (
	// ErrReadOnly: a write, trim or write-zeroes on a read-only export.
	ErrReadOnly = errors.New("frontend: export is read-only")
	// ErrFenced: this front end lost the device's writer role: a newer writer
	// opened it elsewhere, or the lease that kept the role lapsed. Its IO can
	// never succeed again; an attachment made after this gets a fresh backend.
	ErrFenced = errors.New("frontend: writer fenced by a newer writer")
	// ErrNoSpace: the storage behind the device is full.
	ErrNoSpace = errors.New("frontend: no space left")
	// ErrOutOfRange: the IO lies (partly) beyond the end of the device.
	ErrOutOfRange = errors.New("frontend: IO beyond the end of the device")
	// ErrInvalid: the backend judged the request malformed.
	ErrInvalid = errors.New("frontend: invalid request")
	// ErrNotSupported: the backend cannot do this kind of IO.
	ErrNotSupported = errors.New("frontend: operation not supported")
	// ErrUnavailable: the storage could not serve the IO in time (no leader, no
	// route, a deadline passed); the same IO may succeed later or on another path.
	ErrUnavailable = errors.New("frontend: storage unavailable")
	// ErrShuttingDown: the backend is closing; the client should disconnect.
	ErrShuttingDown = errors.New("frontend: shutting down")
	// ErrIO: the storage failed the IO (disk errors on a majority of replicas).
	ErrIO = errors.New("frontend: IO error")
)

// Errors of the export lifecycle.
var (
	// ErrNoSuchExport: Opener.Open or Stat for a name that does not exist.
	ErrNoSuchExport = errors.New("frontend: no such export")
	// ErrClosed: Exports.Attach after Exports.Close.
	ErrClosed = errors.New("frontend: exports closed")
	// ErrBadInfo: a backend described itself inconsistently (block sizes that
	// are not powers of two, a negative size): a bug in the backend.
	ErrBadInfo = errors.New("frontend: backend info is invalid")
)
