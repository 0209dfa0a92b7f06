//go:build race

package race

import (
	"runtime"
	"syscall"
	"unsafe"
)

// ReadRange records that p was read (by a system call writing it somewhere).
func ReadRange(p []byte) {
	if len(p) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(&p[0]), len(p))
	}
}

// WriteRange records that p was written (by a system call reading into it).
func WriteRange(p []byte) {
	if len(p) > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&p[0]), len(p))
	}
}

// AfterRead draws the edge a read through package syscall draws: every
// write to any file descriptor before it happens before what follows (the
// syscall package's ioSync). A zero-length read of fd through package
// syscall draws exactly that edge and reads nothing; only in race builds.
func AfterRead(fd uintptr) { syscall.Read(int(fd), nil) }

// BeforeWrite draws the other half: what preceded it happens before any
// later read through package syscall (a zero-length write sends nothing on
// a stream socket).
func BeforeWrite(fd uintptr) { syscall.Write(int(fd), nil) }
