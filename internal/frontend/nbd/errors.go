package nbd

import (
	"errors"

	"github.com/basalt-storage/basalt/internal/frontend"
)

// Errors a Backend (or anything it wraps) may return to pick the NBD error value a
// client sees. The server matches them with errors.Is; see ErrorCoder and
// Config.ErrorCode for mapping errors the backend cannot wrap.
var (
	// ErrPermission maps to NBD_EPERM: the export refuses the operation (read-only,
	// or this writer was fenced by a newer one).
	ErrPermission = errors.New("nbd: operation not permitted")
	// ErrNoSpace maps to NBD_ENOSPC: the backing store is full or the IO lies
	// beyond the end of the device.
	ErrNoSpace = errors.New("nbd: no space left on device")
	// ErrInvalid maps to NBD_EINVAL: the backend judged the request malformed.
	ErrInvalid = errors.New("nbd: invalid argument")
	// ErrNotSupported maps to NBD_ENOTSUP: the backend cannot do this operation.
	ErrNotSupported = errors.New("nbd: operation not supported")
	// ErrShuttingDown maps to NBD_ESHUTDOWN: the backend is closing; the client
	// should disconnect.
	ErrShuttingDown = errors.New("nbd: shutting down")
)

// Errors of the server itself.
var (
	// ErrServerClosed is returned by Serve after Shutdown or Close.
	ErrServerClosed = errors.New("nbd: server closed")
	// ErrBadConfig is returned by NewServer for an invalid Config.
	ErrBadConfig = errors.New("nbd: invalid config")
	// ErrProtocol wraps every client protocol violation that ends a connection
	// (bad magic, unknown client flags, an oversized option or write payload).
	ErrProtocol = errors.New("nbd: protocol violation")
)

// ErrorCoder is an optional Backend method that maps the backend's own errors
// (for basalt: api.ErrFenced, api.ErrNoSpace, ...) to NBD error values (EPERM,
// EIO, ...). Returning 0 falls through to the default mapping.
type ErrorCoder interface {
	ErrorCode(err error) uint32
}

// ReadOnlyBackend is an optional Backend method: a backend that reports true is
// advertised with NBD_FLAG_READ_ONLY and every write, trim and write-zeroes is
// refused with NBD_EPERM before it reaches the backend.
type ReadOnlyBackend interface {
	ReadOnly() bool
}

// Describer is an optional Backend method: its text is sent as
// NBD_INFO_DESCRIPTION when a client asks for it.
type Describer interface {
	Description() string
}

// errorCode turns a backend error into an NBD error value. Order: the
// Config.ErrorCode hook, the backend's ErrorCoder, this package's sentinels, EIO.
func (s *Server) errorCode(b frontend.Backend, err error) uint32 {
	if err == nil {
		return 0
	}
	if s.cfg.ErrorCode != nil {
		if code := s.cfg.ErrorCode(err); code != 0 {
			return code
		}
	}
	if ec, ok := b.(ErrorCoder); ok {
		if code := ec.ErrorCode(err); code != 0 {
			return code
		}
	}
	switch {
	case errors.Is(err, ErrPermission):
		return EPERM
	case errors.Is(err, ErrNoSpace):
		return ENOSPC
	case errors.Is(err, ErrInvalid):
		return EINVAL
	case errors.Is(err, ErrNotSupported):
		return ENOTSUP
	case errors.Is(err, ErrShuttingDown):
		return ESHUTDOWN
	}
	return EIO
}
