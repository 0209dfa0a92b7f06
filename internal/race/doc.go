// Package race tells the race detector about memory the kernel reads or writes
// in raw system calls (unix.RawSyscall), which it cannot see: the syscall
// package annotates its own calls the same way. Without the race build tag the
// functions are empty and inlined away.
package race
