package frontend

import "errors"

// Op is one kind of block IO.
type Op uint8

const (
	OpRead Op = iota + 1
	OpWrite
	OpFlush
	OpTrim
	OpWriteZeroes
)

// ErrNoSuchExport is returned by Exports.Open for an unknown name.
var ErrNoSuchExport = errors.New("frontend: no such export")

// Backend is one exported block device.
type Backend interface {
	Size() int64
	// Submit starts one IO and calls done exactly once, maybe on another goroutine.
	// buf is the read destination or the write source (len(buf) == length); Flush,
	// Trim and WriteZeroes pass nil. Every completed write is durable.
	Submit(op Op, buf []byte, off, length int64, done func(error))
}

// Exports finds backends by export name.
type Exports interface {
	Open(name string) (Backend, error)
	List() []string
}
