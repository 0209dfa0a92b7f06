package datastore

import (
	"sync"

	"golang.org/x/sys/unix"
)

// chunk is one chunk file of a copyset. Its identity fields never change; its
// open file descriptor is managed by the store's fdCache.
type chunk struct {
	id   ChunkID
	path string // absolute path of the file while it is live

	// rw makes a read of the file exclusive with a change of it (write,
	// zero, discard): Linux lets a buffered pread copy a page while a pwrite
	// is copying into it, so a read racing a write of the same block could
	// return half of each (TestBlockReadNeverTorn). Writers Lock, readers
	// RLock; it is a leaf lock, taken last and held only around the call.
	rw sync.RWMutex

	// Guarded by fdCache.mu.
	fd   int // -1 while closed
	dfd  int // the same file opened O_DIRECT (WriteAtUncached), -1 if not open; closed with fd
	refs int // IOs currently using fd (and dfd)
	// dead: the file left the copyset (deleted, or replaced by an install).
	// No new reference may be taken; the fd is closed when refs drops to 0.
	dead       bool
	prev, next *chunk // LRU list of open chunks; nil when not open
}

// fdCache bounds the number of open chunk files of a Store with an LRU list.
//
// INVARIANT: a chunk is on the LRU list iff fd >= 0.
// INVARIANT: fd is closed only when refs == 0, so an IO never uses an fd that
// another goroutine closed (and the kernel may have reused).
// The cache is over its limit only while every open chunk is in use; the
// next release brings it back.
type fdCache struct {
	mu   sync.Mutex
	max  int
	open int
	head chunk // sentinel: head.next is the most recently used
}

func newFDCache(max int) *fdCache {
	c := &fdCache{max: max}
	c.head.next, c.head.prev = &c.head, &c.head
	return c
}

func (c *fdCache) unlink(ch *chunk) {
	ch.prev.next, ch.next.prev = ch.next, ch.prev
	ch.prev, ch.next = nil, nil
}

func (c *fdCache) pushFront(ch *chunk) {
	ch.next, ch.prev = c.head.next, &c.head
	c.head.next.prev = ch
	c.head.next = ch
}

// acquire returns an open fd for ch and takes a reference that release drops.
// ok is false if the chunk is dead (the caller treats it as absent).
func (c *fdCache) acquire(ch *chunk) (fd int, ok bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch.dead {
		return -1, false, nil
	}
	if ch.fd >= 0 {
		c.pinLocked(ch)
		return ch.fd, true, nil
	}
	// No atime updates: with relatime the first read after a write would
	// dirty the inode and start a journal handle, which can wait for a journal
	// commit (and ReadAtCached's raw reads must not wait). O_NOATIME needs the
	// file's owner; anyone else opens it plainly.
	fd, err = unix.Open(ch.path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOATIME, 0)
	if err == unix.EPERM {
		fd, err = unix.Open(ch.path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, false, ioError("open "+ch.path, err)
	}
	// No readahead: chunk reads are random (a volume's sequential reads come
	// as large requests), and readahead fills the page cache with large
	// folios that make every later small write slower (see writePiece).
	_ = unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM)
	ch.fd, ch.refs = fd, 1
	c.pushFront(ch)
	c.open++
	c.evictLocked()
	return fd, true, nil
}

// direct returns ch's O_DIRECT descriptor, opening it if needed. The caller
// holds a reference (acquire), which covers it: it is closed with fd.
func (c *fdCache) direct(ch *chunk) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch.dfd >= 0 {
		return ch.dfd, nil
	}
	fd, err := unix.Open(ch.path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC|unix.O_NOATIME, 0)
	if err == unix.EPERM {
		fd, err = unix.Open(ch.path, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, err
	}
	ch.dfd = fd
	return fd, nil
}

// acquireOpen is acquire for a file that is open already: it never opens
// one (ok false), so it never waits for the disk.
func (c *fdCache) acquireOpen(ch *chunk) (fd int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch.dead || ch.fd < 0 {
		return -1, false
	}
	c.pinLocked(ch)
	return ch.fd, true
}

// pinLocked takes a reference to ch's open descriptor and makes it the most
// recently used.
func (c *fdCache) pinLocked(ch *chunk) {
	ch.refs++
	if c.head.next != ch {
		c.unlink(ch)
		c.pushFront(ch)
	}
}

// release drops a reference taken by acquire.
func (c *fdCache) release(ch *chunk) {
	c.mu.Lock()
	ch.refs--
	if ch.dead && ch.refs == 0 {
		c.closeLocked(ch)
	}
	if c.open > c.max { // went over while every open file was pinned
		c.evictLocked()
	}
	c.mu.Unlock()
}

// kill marks ch dead and closes its fd now or when its last user releases it.
func (c *fdCache) kill(ch *chunk) {
	c.mu.Lock()
	ch.dead = true
	if ch.refs == 0 {
		c.closeLocked(ch)
	}
	c.mu.Unlock()
}

func (c *fdCache) closeLocked(ch *chunk) {
	if ch.fd < 0 {
		return
	}
	unix.Close(ch.fd)
	ch.fd = -1
	if ch.dfd >= 0 {
		unix.Close(ch.dfd)
		ch.dfd = -1
	}
	c.unlink(ch)
	c.open--
}

func (c *fdCache) evictLocked() {
	for ch := c.head.prev; c.open > c.max && ch != &c.head; {
		prev := ch.prev
		if ch.refs == 0 {
			c.closeLocked(ch)
		}
		ch = prev
	}
}

// closeAll closes every open fd that is not in use (Store.Close).
func (c *fdCache) closeAll() {
	c.mu.Lock()
	for ch := c.head.prev; ch != &c.head; {
		prev := ch.prev
		if ch.refs == 0 {
			c.closeLocked(ch)
		}
		ch = prev
	}
	c.mu.Unlock()
}

// openCount reports how many chunk files are open (tests).
func (c *fdCache) openCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}
