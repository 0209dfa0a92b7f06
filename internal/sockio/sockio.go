// Package sockio reads and writes sockets with raw system calls that the Go
// runtime does not track.
//
// Why: a goroutine entering an ordinary system call (syscall.Syscall) wakes the
// runtime's sysmon thread if sysmon is in its deep sleep, which it enters each
// time it finds every P idle; once woken, sysmon polls every 20 µs for the next
// millisecond. A daemon serving one request at a time is idle between
// requests, so each request's socket reads and writes woke sysmon again: on
// the test VMs that cost the chunkservers and the NBD front end about 40 % of
// their CPU and 30 % of a 4 KiB read's latency at queue depth 1. The runtime
// tracks a system call so that it can hand the P to another thread should the
// call block; a read or write on a non-blocking socket never waits for the
// peer, so here it need not be tracked (unix.RawSyscall). Waiting for the socket still goes
// through the netpoller (syscall.RawConn), with deadlines and Close as usual.
// The race detector does not see what raw calls read and write, nor the
// happens-before edge that a write and a later read through package syscall
// draw between goroutines (a test's client on net.Conn and a server on
// sockio); package race tells it both.
package sockio

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/race"
)

// Reader reads a socket with raw read(2) calls.
type Reader struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) bool // r.read, bound once: no allocation per Read
	buf []byte
	n   int
	err error
}

// NewReader returns a Reader of nc, or nc itself when nc is not a socket
// (net.Pipe in tests).
func NewReader(nc net.Conn) io.Reader {
	rc := rawConn(nc)
	if rc == nil {
		return nc
	}
	r := &Reader{rc: rc}
	r.fn = r.read
	return r
}

// Read reads what the socket holds into p, waiting until it holds something.
// At the end of the stream it returns io.EOF.
func (r *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.buf, r.n, r.err = p, 0, nil
	err := r.rc.Read(r.fn)
	r.buf = nil
	switch {
	case err != nil:
		return 0, err
	case r.err != nil:
		return 0, r.err
	case r.n == 0:
		return 0, io.EOF
	}
	race.WriteRange(p[:r.n])
	return r.n, nil
}

// read runs inside RawConn.Read: false means "wait until readable, then call
// again".
func (r *Reader) read(fd uintptr) bool {
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)))
		switch errno {
		case 0:
			r.n = int(n)
			if n > 0 {
				race.AfterRead(fd)
			}
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			r.err = os.NewSyscallError("read", errno)
			return true
		}
	}
}

// Writer writes byte slices to a socket with raw writev(2) calls. Its methods
// must not be called concurrently.
type Writer struct {
	nc    net.Conn
	rc    syscall.RawConn       // nil: nc is not a socket
	fn    func(fd uintptr) bool // w.writev, bound once
	iov   []unix.Iovec
	n     int
	err   error
	block bool // fn waits for the socket on EAGAIN (Write) or not (TryWrite)
	// gather collects small pieces when nc is not a socket (gatherWrite).
	gather []byte
}

// NewWriter returns a Writer of nc. When nc is not a socket (net.Pipe in
// tests), Write goes through nc and TryWrite writes nothing.
func NewWriter(nc net.Conn) *Writer {
	w := &Writer{nc: nc, rc: rawConn(nc)}
	w.fn = w.writev
	return w
}

// CanTry reports whether TryWrite can write (nc is a socket).
func (w *Writer) CanTry() bool { return w.rc != nil }

// maxIovec is Linux's IOV_MAX: one writev takes at most this many pieces.
const maxIovec = 1024

// TryWrite writes what the socket takes right now of bufs, in one writev, and
// returns the byte count. It never waits: errors (EAGAIN, a closed or broken
// socket, an expired deadline) count as nothing written, and a later blocking
// write of the rest meets a real error again.
func (w *Writer) TryWrite(bufs [][]byte) int {
	if w.rc == nil {
		return 0
	}
	w.block = false
	n, err := w.write(bufs)
	if err != nil {
		return 0
	}
	return n
}

// Write writes all of bufs, waiting for the socket as needed, and returns the
// bytes written; an error (a broken socket, the write deadline, Close) ends it.
func (w *Writer) Write(bufs [][]byte) (int, error) {
	if w.rc == nil {
		return w.gatherWrite(bufs)
	}
	w.block = true
	total := 0
	for len(bufs) > 0 {
		n, err := w.write(bufs)
		total += n
		if err != nil {
			return total, err
		}
		bufs = Advance(bufs, n)
	}
	return total, nil
}

// gatherMax: a connection that is not a socket (a TLS one) is written in
// writes of up to this many bytes, small pieces gathered, so that a frame's
// header and payload go in one TLS record rather than one each.
const gatherMax = 16 << 10

// gatherWrite writes bufs to w.nc, gathering small pieces.
func (w *Writer) gatherWrite(bufs [][]byte) (int, error) {
	total := 0
	for _, b := range bufs {
		if len(w.gather)+len(b) <= gatherMax {
			w.gather = append(w.gather, b...)
			continue
		}
		if len(w.gather) > 0 {
			n, err := w.nc.Write(w.gather)
			total += n
			w.gather = w.gather[:0]
			if err != nil {
				return total, err
			}
		}
		if len(b) >= gatherMax {
			n, err := w.nc.Write(b)
			total += n
			if err != nil {
				return total, err
			}
			continue
		}
		w.gather = append(w.gather, b...)
	}
	if len(w.gather) > 0 {
		n, err := w.nc.Write(w.gather)
		total += n
		w.gather = w.gather[:0]
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// write makes one writev of up to maxIovec pieces of bufs (waiting for the
// socket first when w.block and it is full).
func (w *Writer) write(bufs [][]byte) (int, error) {
	w.iov = w.iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if len(w.iov) == maxIovec {
			break
		}
		race.ReadRange(b)
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		w.iov = append(w.iov, v)
	}
	w.n, w.err = 0, nil
	var err error
	if len(w.iov) > 0 {
		err = w.rc.Write(w.fn)
	}
	clear(w.iov) // keep no payload reachable
	if err == nil {
		err = w.err
	}
	return w.n, err
}

// writev runs inside RawConn.Write: false means "wait until writable, then
// call again".
func (w *Writer) writev(fd uintptr) bool {
	race.BeforeWrite(fd)
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(len(w.iov)))
		switch errno {
		case 0:
			w.n = int(n)
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if w.block {
				return false
			}
			w.err = errno
			return true
		default:
			w.err = os.NewSyscallError("writev", errno)
			return true
		}
	}
}

// Advance returns bufs without its first n bytes, reusing bufs' backing array.
func Advance(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if n > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

func rawConn(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// Len is the byte count of bufs.
func Len(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}
