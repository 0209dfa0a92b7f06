package wal

import (
	"errors"

	"golang.org/x/sys/unix"
)

// directMinBytes: batches at least this large are written with O_DIRECT.
// Through the page cache a 256 KiB batch costs a page allocation and a copy
// per page and the writeback in fdatasync, which made the WAL write the
// largest single cost of sequential writes; small batches stay buffered, where
// a write is a short copy and commit-index updates need no device round trip.
const directMinBytes = 64 << 10

// directWriter writes whole pages to the active segment with O_DIRECT. A
// direct write makes the kernel write back and drop the cached pages it
// covers, so buffered and direct writes to a segment can alternate. It is the
// committer's alone.
type directWriter struct {
	seq     uint64 // segment fd is open on
	fd      int    // -1: none open
	refused bool   // the file system refused O_DIRECT: never try again
	buf     []byte // page-aligned (an anonymous mapping), grown as needed
}

func newDirectWriter() *directWriter { return &directWriter{fd: -1} }

// write writes the concatenation of iov, whole pages, at the page-aligned
// off of s. It returns false, having written nothing, if O_DIRECT cannot be
// used; the caller then writes through the page cache.
func (d *directWriter) write(s *segment, off int64, iov [][]byte) (bool, error) {
	if d.refused {
		return false, nil
	}
	if d.fd < 0 || d.seq != s.seq {
		d.closeFd()
		fd, err := unix.Open(s.path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err != nil {
			d.refused = true
			return false, nil
		}
		d.fd, d.seq = fd, s.seq
	}
	n := 0
	for _, b := range iov {
		n += len(b)
	}
	if err := d.grow(n); err != nil {
		d.refused = true
		return false, nil
	}
	b := d.buf[:0]
	for _, v := range iov {
		b = append(b, v...)
	}
	for len(b) > 0 {
		w, err := unix.Pwrite(d.fd, b, off)
		if errors.Is(err, unix.EINVAL) && len(b) == n {
			d.refused = true // alignment the file system does not take
			d.closeFd()
			return false, nil
		}
		if err != nil {
			return true, err
		}
		if w == 0 {
			return true, unix.EIO
		}
		b, off = b[w:], off+int64(w)
	}
	if len(d.buf) > maxKeptBuffer {
		d.release() // a huge batch: do not keep its buffer for ever
	}
	return true, nil
}

func (d *directWriter) grow(n int) error {
	if n <= len(d.buf) {
		return nil
	}
	size := max(int(roundUp(int64(n))), 2*len(d.buf), 1<<20)
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	d.release()
	d.buf = b
	return nil
}

func (d *directWriter) release() {
	if d.buf != nil {
		unix.Munmap(d.buf)
		d.buf = nil
	}
}

func (d *directWriter) closeFd() {
	if d.fd >= 0 {
		unix.Close(d.fd)
		d.fd = -1
	}
}

// close releases the descriptor and the buffer.
func (d *directWriter) close() {
	d.closeFd()
	d.release()
}
