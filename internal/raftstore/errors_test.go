package raftstore

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

// DiskFailure tells a full disk (ENOSPC, EDQUOT, however deeply wrapped)
// from any other disk error, keeps the cause, and leaves a classified error
// as it is.
func TestDiskFailure(t *testing.T) {
	full := &fs.PathError{Op: "write", Path: "chunk", Err: syscall.ENOSPC}
	for _, tc := range []struct {
		cause error
		want  error
	}{
		{fmt.Errorf("apply 7: %w", full), ErrDiskFull},
		{fmt.Errorf("wal: %w", syscall.EDQUOT), ErrDiskFull},
		{fmt.Errorf("wal: %w", syscall.EIO), ErrIO},
		{errors.New("checksum mismatch"), ErrIO},
	} {
		got := DiskFailure(tc.cause)
		if !errors.Is(got, tc.want) || !errors.Is(got, tc.cause) {
			t.Errorf("DiskFailure(%v) = %v, want it to wrap %v and the cause", tc.cause, got, tc.want)
		}
		if other := map[error]error{ErrDiskFull: ErrIO, ErrIO: ErrDiskFull}[tc.want]; errors.Is(got, other) {
			t.Errorf("DiskFailure(%v) = %v wraps %v as well", tc.cause, got, other)
		}
		if again := DiskFailure(got); again != got {
			t.Errorf("DiskFailure of a classified error wrapped it again: %v", again)
		}
	}
}
