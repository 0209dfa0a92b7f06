package volumes

import (
	"errors"

	"github.com/basalt-storage/basalt/internal/frontend/nbd"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// NBDErrorCode maps the client library's errors to NBD error values, for
// nbd.Config.ErrorCode: a fenced or read-only writer gets EPERM (the database sees
// "read-only file system", not silent corruption), a full disk ENOSPC, anything the
// request itself got wrong EINVAL, and the rest EIO.
func NBDErrorCode(err error) uint32 {
	switch {
	case errors.Is(err, api.ErrFenced), errors.Is(err, api.ErrReadOnly), errors.Is(err, client.ErrLeaseExpired):
		return nbd.EPERM
	case errors.Is(err, api.ErrNoSpace):
		return nbd.ENOSPC
	case errors.Is(err, api.ErrOutOfRange), errors.Is(err, api.ErrBadRequest):
		return nbd.EINVAL
	}
	return nbd.EIO
}
