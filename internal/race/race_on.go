//go:build race

package race

import (
	"runtime"
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
