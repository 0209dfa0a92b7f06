package api

import "fmt"

// Status is the numeric result code carried in every data-plane reply frame.
// Codes are part of the wire format: never renumber them.
type Status uint32

const (
	StatusOK Status = 0
	// StatusNotLeader: the chunkserver is not the copyset's leader. The reply's Hint
	// field holds the leader's chunkserver id when known (0 otherwise).
	StatusNotLeader Status = 1
	// StatusFenced: the request's epoch is older than one the copyset has already seen
	// for this volume; another writer has opened it (docs/design.md §6).
	StatusFenced Status = 2
	// StatusOutOfRange: the request reaches past the end of the volume or crosses a chunk.
	StatusOutOfRange Status = 3
	// StatusNoSuchVolume: the volume id is unknown (never created, or deleted).
	StatusNoSuchVolume Status = 4
	// StatusBusy: the chunkserver's queue is full; back off and retry.
	StatusBusy Status = 5
	// StatusIOError: the replica could not read or write its disk.
	StatusIOError Status = 6
	// StatusBadRequest: a malformed or inconsistent request (wrong copyset, bad op).
	StatusBadRequest Status = 7
	// StatusNoSuchCopyset: the chunkserver does not host the copyset (yet, or any more).
	StatusNoSuchCopyset Status = 8
	// StatusNoSpace: the replica's disk is full.
	StatusNoSpace Status = 9
	// StatusReadOnly: a write arrived on a read-only session (epoch 0).
	StatusReadOnly Status = 10
	// StatusDenied: the connection's identity may not make this request (a
	// peer-only op from a client), or the volume has no valid capability
	// attached on this connection (docs/security.md).
	StatusDenied Status = 11
	// StatusStaleRequest: a numbered request (Header.Seq) arrived after the
	// copyset settled it — the writer had given up on it, or it was retried
	// after more than a window of newer requests completed. It was not
	// applied now; whether an earlier copy of it was is unknown.
	StatusStaleRequest Status = 12
	// StatusMiscompare: an OpCompareAndWrite found other data than its
	// compare bytes and wrote nothing. Hint is the byte offset, within the
	// request's range, of the first byte that differs. A final answer.
	StatusMiscompare Status = 13
)

var statusNames = map[Status]string{
	StatusOK:            "OK",
	StatusNotLeader:     "NOT_LEADER",
	StatusFenced:        "FENCED",
	StatusOutOfRange:    "OUT_OF_RANGE",
	StatusNoSuchVolume:  "NO_SUCH_VOLUME",
	StatusBusy:          "BUSY",
	StatusIOError:       "IO_ERROR",
	StatusBadRequest:    "BAD_REQUEST",
	StatusNoSuchCopyset: "NO_SUCH_COPYSET",
	StatusNoSpace:       "NO_SPACE",
	StatusReadOnly:      "READ_ONLY",
	StatusDenied:        "DENIED",
	StatusStaleRequest:  "STALE_REQUEST",
	StatusMiscompare:    "MISCOMPARE",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("STATUS_%d", uint32(s))
}

// Error is a non-OK Status as a Go error. Compare with errors.Is against the
// sentinel values below.
type Error struct {
	Status Status
	Hint   uint64 // leader hint for NOT_LEADER; MISCOMPARE: offset of the first differing byte
}

func (e *Error) Error() string { return "basalt: " + e.Status.String() }

// Is makes errors.Is(err, api.ErrFenced) match any *Error with the same status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status
}

// Sentinel errors, one per status, for errors.Is.
var (
	ErrNotLeader     = &Error{Status: StatusNotLeader}
	ErrFenced        = &Error{Status: StatusFenced}
	ErrOutOfRange    = &Error{Status: StatusOutOfRange}
	ErrNoSuchVolume  = &Error{Status: StatusNoSuchVolume}
	ErrBusy          = &Error{Status: StatusBusy}
	ErrIO            = &Error{Status: StatusIOError}
	ErrBadRequest    = &Error{Status: StatusBadRequest}
	ErrNoSuchCopyset = &Error{Status: StatusNoSuchCopyset}
	ErrNoSpace       = &Error{Status: StatusNoSpace}
	ErrReadOnly      = &Error{Status: StatusReadOnly}
	ErrDenied        = &Error{Status: StatusDenied}
	ErrStaleRequest  = &Error{Status: StatusStaleRequest}
	ErrMiscompare    = &Error{Status: StatusMiscompare}
)

// StatusError returns nil for StatusOK and an *Error otherwise.
func StatusError(s Status, hint uint64) error {
	if s == StatusOK {
		return nil
	}
	return &Error{Status: s, Hint: hint}
}
