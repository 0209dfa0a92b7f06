package nbd

import (
	"errors"

	"github.com/basalt-storage/basalt/internal/frontend"
)

// Errors of the server itself.
var (
	// ErrServerClosed is returned by Serve after Shutdown or Close.
	ErrServerClosed = frontend.ErrServerClosed
	// ErrBadConfig is returned by NewServer for an invalid Config.
	ErrBadConfig = errors.New("nbd: invalid config")
	// ErrProtocol wraps every client protocol violation that ends a connection
	// (bad magic, unknown client flags, an oversized option or write payload).
	ErrProtocol = errors.New("nbd: protocol violation")
	// ErrTLSRequired ends a plaintext NBD_OPT_EXPORT_NAME on a listener whose
	// policy is TLSRequire.
	ErrTLSRequired = errors.New("nbd: TLS required")
)

// errnoOf maps a failed IO's error, classified by the export's Opener, to the
// NBD error value the client sees (the frontend error classes; see
// frontend/doc.go). An unclassified error is EIO.
func errnoOf(err error) uint32 {
	switch {
	case errors.Is(err, frontend.ErrReadOnly), errors.Is(err, frontend.ErrFenced):
		// A fenced writer gets EPERM: the database sees "read-only file
		// system", not silent corruption.
		return EPERM
	case errors.Is(err, frontend.ErrNoSpace):
		return ENOSPC
	case errors.Is(err, frontend.ErrOutOfRange), errors.Is(err, frontend.ErrInvalid):
		return EINVAL
	case errors.Is(err, frontend.ErrNotSupported):
		return ENOTSUP
	case errors.Is(err, frontend.ErrShuttingDown):
		return ESHUTDOWN
	}
	return EIO // ErrIO, ErrUnavailable and anything unclassified
}
