package testhost

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as an initramfs
// (Documentation/driver-api/early-userspace/buffer-format.rst): per entry a
// 110-byte ASCII header of 13 eight-digit hex fields, the NUL-terminated name,
// padding to 4 bytes, the data, padding to 4 bytes; a "TRAILER!!!" entry ends it.
// Every entry is owned by root with mtime 0, so the same inputs give the same bytes.
type cpioWriter struct {
	w     *bufio.Writer
	ino   uint32
	total int64
}

const (
	cpioModeDir     = 0o040000
	cpioModeFile    = 0o100000
	cpioModeSymlink = 0o120000
)

func newCpioWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20)}
}

func (c *cpioWriter) header(name string, mode uint32, size int64) error {
	c.ino++
	nlink := 1
	if mode&0o170000 == cpioModeDir {
		nlink = 2
	}
	_, err := fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\x00",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0, name)
	if err != nil {
		return err
	}
	c.total += 110 + int64(len(name)) + 1
	return c.pad()
}

func (c *cpioWriter) pad() error {
	n := (4 - c.total%4) % 4
	c.total += n
	_, err := c.w.Write(make([]byte, n))
	return err
}

func (c *cpioWriter) dir(name string, perm uint32) error {
	return c.header(name, cpioModeDir|perm, 0)
}

func (c *cpioWriter) symlink(name, target string) error {
	if err := c.header(name, cpioModeSymlink|0o777, int64(len(target))); err != nil {
		return err
	}
	return c.data(strings.NewReader(target), int64(len(target)))
}

// file writes a regular file whose content is size bytes read from r.
func (c *cpioWriter) file(name string, perm uint32, r io.Reader, size int64) error {
	if err := c.header(name, cpioModeFile|perm, size); err != nil {
		return err
	}
	return c.data(r, size)
}

// hostFile writes a regular file with the content of a host file.
func (c *cpioWriter) hostFile(name string, perm uint32, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return c.file(name, perm, f, fi.Size())
}

func (c *cpioWriter) data(r io.Reader, size int64) error {
	n, err := io.CopyN(c.w, r, size)
	c.total += n
	if err != nil {
		return fmt.Errorf("copying %d bytes: %w", size, err)
	}
	return c.pad()
}

// close writes the trailer and flushes.
func (c *cpioWriter) close() error {
	if err := c.header("TRAILER!!!", 0, 0); err != nil {
		return err
	}
	return c.w.Flush()
}
