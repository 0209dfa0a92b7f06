package nbd

import (
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawWriter makes one non-blocking writev on a socket. A backend callback that
// finishes a request while the connection's writer is idle uses it to send the
// reply itself, saving the wake-up and context switch of the writer goroutine;
// since it never waits for the socket, a client that stops reading cannot stall
// the backend's goroutine. Only the current owner of the write side uses it.
// (internal/transport has the same helper; neither package imports the other.)
type rawWriter struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) bool // w.writev, bound once: no allocation per write
	iov []unix.Iovec
	n   int
}

// maxIovec is Linux's IOV_MAX; what does not fit is left for the writer goroutine.
const maxIovec = 1024

// newRawWriter returns nil when nc is not a socket (net.Pipe in tests): then every
// reply goes through the writer goroutine.
func newRawWriter(nc net.Conn) *rawWriter {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &rawWriter{rc: rc}
	w.fn = w.writev
	return w
}

// tryWrite writes what the socket takes right now of bufs and returns the byte
// count. Errors (EAGAIN, a closed or broken socket, an expired deadline) count as
// nothing written: the writer goroutine's blocking write of the rest meets a real
// error again and handles it the usual way.
func (w *rawWriter) tryWrite(bufs [][]byte) int {
	w.iov = w.iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if len(w.iov) == maxIovec {
			break
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		w.iov = append(w.iov, v)
	}
	w.n = 0
	if len(w.iov) > 0 {
		if err := w.rc.Write(w.fn); err != nil {
			w.n = 0
		}
	}
	clear(w.iov) // keep no payload reachable
	return w.n
}

// writev runs inside RawConn.Write: returning true means "do not wait for the
// socket to become writable", whatever the outcome.
func (w *rawWriter) writev(fd uintptr) bool {
	n, _, errno := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(len(w.iov)))
	if errno == 0 {
		w.n = int(n)
	}
	return true
}

// advance returns bufs without its first n bytes, reusing bufs' backing array.
func advance(bufs net.Buffers, n int) net.Buffers {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if n > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

// sumLen is the byte count of bufs.
func sumLen(bufs net.Buffers) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}
