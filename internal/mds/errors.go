package mds

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Errors of the MDS. Handlers wrap them with the details an operator needs
// ("%w: volume \"db1\" does not exist"); the gRPC layer turns each into its
// status code (codeOf) with the full message.
var (
	// ErrNotActive: this MDS is a standby (or lost its leadership while
	// handling the request). gRPC Unavailable; the message names the
	// active MDS.
	ErrNotActive = errors.New("mds: not the active MDS")
	// ErrInvalidArgument: a malformed request (bad name, size, chunk size,
	// replica count, or a shrinking resize). gRPC InvalidArgument.
	ErrInvalidArgument = errors.New("mds: invalid argument")
	// ErrNotFound: an unknown volume, pool, chunkserver or session.
	// gRPC NotFound.
	ErrNotFound = errors.New("mds: not found")
	// ErrAlreadyExists: a pool or volume with that name exists.
	// gRPC AlreadyExists.
	ErrAlreadyExists = errors.New("mds: already exists")
	// ErrFailedPrecondition: the cluster is not in a state that allows the
	// request (too few chunkservers or failure domains for a pool, no
	// pool for a volume, a volume open for writing cannot be deleted).
	// gRPC FailedPrecondition.
	ErrFailedPrecondition = errors.New("mds: failed precondition")
	// ErrSuperseded: a writer session was replaced by a newer writer's
	// OpenVolume; its epoch is stale and it must stop writing.
	// gRPC FailedPrecondition.
	ErrSuperseded = errors.New("mds: session superseded by a newer writer")
	// ErrPermissionDenied: the caller's identity may not make this call
	// (wrong role, another chunkserver's id, another client's session).
	// gRPC PermissionDenied.
	ErrPermissionDenied = errors.New("mds: permission denied")
	// ErrUnauthenticated: the caller presented no verified identity.
	// gRPC Unauthenticated.
	ErrUnauthenticated = errors.New("mds: unauthenticated")
	// ErrTooManySessions: the caller has MaxSessionsPerClient sessions open.
	// gRPC ResourceExhausted.
	ErrTooManySessions = errors.New("mds: too many open sessions for this client")
	// ErrAttachLimit: the node has as many volumes attached as its limit.
	// gRPC ResourceExhausted.
	ErrAttachLimit = errors.New("mds: the node's attach limit is reached")
	// ErrNoTLS: Config has neither TLS nor Insecure.
	ErrNoTLS = errors.New("mds: no TLS configuration")
)

// codeOf maps an error to its gRPC status code.
func codeOf(err error) codes.Code {
	switch {
	case err == nil:
		return codes.OK
	case errors.Is(err, ErrNotActive):
		return codes.Unavailable
	case errors.Is(err, ErrInvalidArgument):
		return codes.InvalidArgument
	case errors.Is(err, ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, ErrFailedPrecondition), errors.Is(err, ErrSuperseded):
		return codes.FailedPrecondition
	case errors.Is(err, ErrPermissionDenied):
		return codes.PermissionDenied
	case errors.Is(err, ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, ErrTooManySessions), errors.Is(err, ErrAttachLimit):
		return codes.ResourceExhausted
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Internal
}

// toStatus converts a handler error to a gRPC status error.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}
