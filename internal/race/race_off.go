//go:build !race

package race

// ReadRange records that p was read (by a system call writing it somewhere).
func ReadRange(p []byte) {}

// WriteRange records that p was written (by a system call reading into it).
func WriteRange(p []byte) {}

// AfterRead draws the happens-before edge a read through package syscall
// draws (race builds only).
func AfterRead(fd uintptr) {}

// BeforeWrite draws the edge a write through package syscall draws (race
// builds only).
func BeforeWrite(fd uintptr) {}
