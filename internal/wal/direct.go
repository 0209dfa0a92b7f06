package wal

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directMinBytes: batches at least this large are written with O_DIRECT.
// Through the page cache a 256 KiB batch costs a page allocation and a copy
// per page and the writeback in fdatasync, which made the WAL write the
// largest single cost of sequential writes; small batches stay buffered, where
// a write is a short copy and commit-index updates need no device round trip.
const directMinBytes = 64 << 10

// pageWrite is what writePages writes, whole pages from a page boundary:
// head (the start of the first page, written before), pre (the batch
// record and a pad record if any), buf with the entry data of refs in its gaps, zeros zero bytes.
type pageWrite struct {
	head, pre, buf []byte
	refs           []dataRef
	zeros          int
}

func (p *pageWrite) size() int { return len(p.head) + len(p.pre) + batchSize(p.buf, p.refs) + p.zeros }

// directWriter writes whole pages to the active segment with O_DIRECT. A
// direct write makes the kernel write back and drop the cached pages it
// covers, so buffered and direct writes to a segment can alternate. It is the
// committer's alone.
//
// The bytes of a write are gathered in a page-aligned buffer, except entry
// data whose address agrees with its place in the file modulo dioAlign (the
// padding of appendEntries makes it so): its dioAlign-aligned middle goes to
// the disk from the entry itself, as a piece of one pwritev, and only its
// ends (less than dioAlign bytes each) are copied. Every piece then starts
// and ends on a dioAlign boundary, as O_DIRECT requires; should the kernel
// refuse them anyway (EINVAL), the data is copied as well from then on.
type directWriter struct {
	seq      uint64 // segment fd is open on
	fd       int    // -1: none open
	refused  bool   // the file system refused O_DIRECT: never try again
	copyRefs bool   // the kernel refused data pieces in place: copy them too
	buf      []byte // page-aligned (an anonymous mapping), grown as needed
	iov      [][]byte

	// inPlace counts the entry data pieces written from the entries (tests).
	inPlace uint64
}

func newDirectWriter() *directWriter { return &directWriter{fd: -1} }

// write writes p at the page-aligned off of s. It returns false, having
// written nothing, if O_DIRECT cannot be used; the caller then writes through
// the page cache.
func (d *directWriter) write(s *segment, off int64, p pageWrite) (bool, error) {
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
	n := p.size()
	if err := d.grow(n); err != nil {
		d.refused = true
		return false, nil
	}
	inPlace := d.gather(&p, d.copyRefs)
	err := d.pwritev(off)
	if errors.Is(err, unix.EINVAL) && inPlace > 0 {

		d.copyRefs = true // this kernel wants every piece aligned
		d.gather(&p, true)
		inPlace = 0
		err = d.pwritev(off)
	}
	if errors.Is(err, unix.EINVAL) {
		d.refused = true // alignment the file system does not take
		d.closeFd()
		return false, nil
	}
	if err != nil {
		return true, err
	}
	d.inPlace += uint64(inPlace)
	if len(d.buf) > maxKeptBuffer {
		d.release() // a huge batch: do not keep its buffer for ever
	}
	return true, nil
}

// gather lays p out in d.buf at its offsets within the write and lists the
// pieces to write in d.iov: spans of d.buf, and the entry data that can go
// in place (unless copyAll). It returns how many went in place.
func (d *directWriter) gather(p *pageWrite, copyAll bool) int {
	b := d.buf
	at := copy(b, p.head)
	at += copy(b[at:], p.pre)
	base := at // the batch starts at b[base]
	d.iov = d.iov[:0]
	span := 0 // start of the d.buf span not yet listed
	inPlace := 0
	pos := 0   // next byte of p.buf to place
	shift := 0 // the batch's bytes before p.buf[pos] that are not in p.buf
	for _, r := range p.refs {
		copy(b[base+pos+shift:], p.buf[pos:r.at])
		dst := base + r.off
		pos, shift = r.at, shift+len(r.data)
		// r.data[k:k+m] is the whole dioAlign blocks of the data.
		k := -dst & (dioAlign - 1)
		m := (len(r.data) - k) &^ (dioAlign - 1)
		aligned := int(uintptr(unsafe.Pointer(unsafe.SliceData(r.data)))-uintptr(dst))&(dioAlign-1) == 0
		if copyAll || !aligned || m <= 0 || len(d.iov) >= maxIOV-3 {
			copy(b[dst:], r.data)
			continue
		}
		copy(b[dst:], r.data[:k])
		copy(b[dst+k+m:], r.data[k+m:])
		d.iov = append(d.iov, b[span:dst+k], r.data[k:k+m])
		span = dst + k + m
		inPlace++
	}
	copy(b[base+pos+shift:], p.buf[pos:])
	end := base + len(p.buf) + shift
	clear(b[end : end+p.zeros])
	d.iov = append(d.iov, b[span:end+p.zeros])
	return inPlace
}

// pwritev writes d.iov at off, all of it.
func (d *directWriter) pwritev(off int64) error {
	defer clear(d.iov) // keep no references to the entries
	iov := d.iov
	first := true
	for len(iov) > 0 {
		w, err := unix.Pwritev(d.fd, iov, off)
		if err != nil {
			if !first && errors.Is(err, unix.EINVAL) {
				return unix.EIO // part written: not a matter of alignment
			}
			return err
		}
		if w == 0 {
			return unix.EIO
		}
		first = false
		off += int64(w)
		for len(iov) > 0 && w >= len(iov[0]) {
			w -= len(iov[0])
			iov = iov[1:]
		}
		if len(iov) > 0 {
			iov[0] = iov[0][w:]
		}
	}
	return nil
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
