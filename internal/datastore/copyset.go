package datastore

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/race"
)

// ChunkID names a chunk: chunk Index of volume Volume.
type ChunkID struct{ Volume, Index uint64 }

// fileName is the chunk's file name inside chunks/: "%016x_%016x".
func (id ChunkID) fileName() string { return fmt.Sprintf("%016x_%016x", id.Volume, id.Index) }

func parseChunkName(name string) (ChunkID, bool) {
	var id ChunkID
	if len(name) != 33 || name[16] != '_' {
		return id, false
	}
	if _, err := fmt.Sscanf(name, "%016x_%016x", &id.Volume, &id.Index); err != nil {
		return id, false
	}
	return id, true
}

// Copyset holds the chunk files of one Raft group on this disk. All methods
// are safe for concurrent use.
//
// Lock order: Store.mu → Copyset.mu → Copyset.dirtyMu → fdCache.mu; pool.mu
// is a leaf. syncMu and snapMu are taken before mu; recvMu before snapMu.
type Copyset struct {
	s         *Store
	group     uint64
	chunkSize int64
	dir       string // <Dir>/copysets/<group>
	chunksDir string // dir/chunks
	log       *slog.Logger

	// mu guards the chunk map and removed. Operations that change file
	// contents (write, discard, zero) hold it shared across their syscall, so
	// that DeleteVolume and InstallStaged (exclusive) never move a file that
	// a write is still landing in. Reads hold it only to find the chunk.
	mu      sync.RWMutex
	chunks  map[ChunkID]*chunk
	removed bool

	// dirtyMu guards the dirty set and dirDirty.
	// INVARIANT: every chunk whose file was changed since the last
	// successful Sync that covered it is in dirty, and dirDirty is true if an
	// entry of chunks/ changed since the last successful Sync.
	dirtyMu  sync.Mutex
	dirty    map[*chunk]struct{}
	dirDirty bool

	syncMu sync.Mutex          // serializes Sync; owns spare
	spare  map[*chunk]struct{} // the other dirty set, empty, swapped in by Sync
	metaMu sync.Mutex          // serializes SaveMeta and LoadMeta; guards the meta fields below
	// metaSeq: sequence number of the newest meta record (0: none in the
	// slots); metaLoaded: metaSeq was read from disk; legacyMeta: the single
	// meta file of older versions is still there.
	metaSeq                uint64
	metaLoaded, legacyMeta bool
	recvMu                 sync.Mutex // serializes ReceiveSnapshot (owns staging/)
	snapMu                 sync.Mutex // guards the staged.<index> dirs: ReceiveSnapshot's rename, InstallStaged, DropStaged

	zeroCRC atomic.Uint64 // crc32c of a chunk of zeros, +1<<32 once computed
}

// loadCopyset opens an existing copyset directory: it first repairs an
// interrupted install (see doc.go), then reads info and scans chunks/.
func loadCopyset(s *Store, group uint64) (*Copyset, error) {
	dir := filepath.Join(s.csDir, fmt.Sprintf("%016x", group))
	c := &Copyset{
		s: s, group: group, dir: dir,
		chunksDir: filepath.Join(dir, chunksDirName),
		log:       s.log.With("group", group),
		chunks:    make(map[ChunkID]*chunk),
		dirty:     make(map[*chunk]struct{}),
		spare:     make(map[*chunk]struct{}),
	}
	if err := c.recoverInstall(); err != nil {
		return nil, err
	}
	info, err := readAtomic(dir, infoFileName, infoMagic)
	if err != nil {
		return nil, err
	}
	if len(info) != 8 {
		return nil, fmt.Errorf("%w: copyset %016x: missing or bad info file", ErrCorrupt, group)
	}
	c.chunkSize = int64(binary.BigEndian.Uint64(info))
	for _, tmp := range []string{infoFileName + ".tmp", metaFileName + ".tmp", installName + ".tmp"} {
		os.Remove(filepath.Join(dir, tmp))
	}
	if err := os.RemoveAll(filepath.Join(dir, stagingDirName)); err != nil {
		return nil, ioError("remove staging", err)
	}
	if err := c.scanChunks(); err != nil {
		return nil, err
	}
	return c, nil
}

// scanChunks rebuilds the chunk map from chunks/. Caller holds mu or owns c.
func (c *Copyset) scanChunks() error {
	ents, err := os.ReadDir(c.chunksDir)
	if err != nil {
		return ioError("readdir "+c.chunksDir, err)
	}
	chunks := make(map[ChunkID]*chunk, len(ents))
	for _, e := range ents {
		id, ok := parseChunkName(e.Name())
		if !ok {
			c.log.Warn("ignoring unknown file in chunks dir", "name", e.Name())
			continue
		}
		chunks[id] = &chunk{id: id, path: filepath.Join(c.chunksDir, e.Name()), fd: -1, dfd: -1}
	}
	c.chunks = chunks
	return nil
}

// Group returns the copyset's Raft group id.
func (c *Copyset) Group() uint64 { return c.group }

// ChunkSize returns the size of every chunk of the copyset.
func (c *Copyset) ChunkSize() int64 { return c.chunkSize }

func (c *Copyset) checkRange(off, n int64) error {
	if off < 0 || n < 0 || off+n > c.chunkSize {
		return fmt.Errorf("%w: [%d, %d) in a chunk of %d", ErrOutOfRange, off, off+n, c.chunkSize)
	}
	return nil
}

// create makes the file of chunk id exist: a ready pool file renamed into
// chunks/, or a new preallocated file when the pool has none.
func (c *Copyset) create(id ChunkID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return ErrClosed
	}
	if c.chunks[id] != nil {
		return nil
	}
	path := filepath.Join(c.chunksDir, id.fileName())
	ok, err := c.s.pool.take(c.chunkSize, path)
	if err != nil {
		return err
	}
	if !ok {
		if err := createChunkFile(path, c.chunkSize); err != nil {
			return err
		}
	}
	c.chunks[id] = &chunk{id: id, path: path, fd: -1, dfd: -1}
	c.dirtyMu.Lock()
	c.dirDirty = true
	c.dirtyMu.Unlock()
	return nil
}

func createChunkFile(path string, size int64) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return ioError("create "+path, err)
	}
	err = preallocate(fd, size)
	unix.Close(fd)
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

func (c *Copyset) markDirtyLocked(ch *chunk) {
	c.dirtyMu.Lock()
	c.dirty[ch] = struct{}{}
	c.dirtyMu.Unlock()
}

// WriteAt writes p at off in chunk id with a plain pwrite (no O_DSYNC, no
// fsync) and adds the chunk to the dirty set. The chunk file is created on
// first write. [off, off+len(p)) must lie inside the chunk.
func (c *Copyset) WriteAt(id ChunkID, p []byte, off int64) error {
	return c.writeAt(id, p, off, false)
}

// WriteAtUncached is WriteAt for data nobody is expected to read soon (a
// replica that does not serve reads): a large write whose offset, length and
// memory are aligned to 512 bytes goes around the page cache (O_DIRECT),
// from p itself. That saves the page-cache copy, its bookkeeping and the
// later write-back; the chunk still joins the dirty set, since a direct
// write lands in the disk's volatile cache and only Sync's fdatasync makes
// it durable. Other writes, or a file system that refuses O_DIRECT, take
// WriteAt's path.
func (c *Copyset) WriteAtUncached(id ChunkID, p []byte, off int64) error {
	return c.writeAt(id, p, off, len(p) >= directMin && (off|int64(len(p)))&(directAlign-1) == 0 && !c.s.noDirect.Load())
}

func (c *Copyset) writeAt(id ChunkID, p []byte, off int64, direct bool) error {
	if err := c.checkRange(off, int64(len(p))); err != nil {
		return err
	}
	for {
		c.mu.RLock()
		if c.removed {
			c.mu.RUnlock()
			return ErrClosed
		}
		ch := c.chunks[id]
		if ch == nil {
			c.mu.RUnlock()
			if err := c.create(id); err != nil {
				return err
			}
			continue
		}
		fd, ok, err := c.s.fds.acquire(ch)
		if err != nil || !ok {
			c.mu.RUnlock()
			if err != nil {
				return err
			}
			continue
		}
		done := false
		ch.rw.Lock()
		if direct {
			done, err = c.writeDirect(ch, p, off)
		}
		if !done && err == nil {
			err = pwriteFull(fd, p, off)
		}
		ch.rw.Unlock()
		c.s.fds.release(ch)
		if err == nil {
			c.markDirtyLocked(ch)
		}
		c.mu.RUnlock()
		return err
	}
}

// Direct writes (WriteAtUncached): at least directMin bytes, offset, length
// and memory aligned to directAlign (the disk's logical block size as
// O_DIRECT wants it; 512 on the disks we run on, and a file system that
// wants more refuses with EINVAL, which turns direct writes off).
const (
	directMin   = 64 << 10
	directAlign = 512
)

// isAligned reports whether p starts on a directAlign boundary in memory.
func isAligned(p []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(p)))&(directAlign-1) == 0
}

// writeDirect writes p at off through ch's O_DIRECT descriptor. done false
// with a nil error: nothing was written, write through the page cache
// instead (p misaligned in memory, or O_DIRECT refused). The caller holds a
// reference to ch's descriptors.
func (c *Copyset) writeDirect(ch *chunk, p []byte, off int64) (done bool, err error) {
	dfd, err := c.s.fds.direct(ch)
	if err != nil {
		c.s.refuseDirect(err)
		return false, nil
	}
	if !isAligned(p) {
		// Misaligned in memory: a copy into an aligned buffer first costs
		// more CPU than the page cache's own copy (BenchmarkLargeWrite).
		return false, nil
	}
	src := p
	first := true
	for len(src) > 0 {
		n, err := unix.Pwrite(dfd, src, off)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EINVAL && first {
			c.s.refuseDirect(err)
			return false, nil
		}
		if err != nil {
			return true, ioError("pwrite (O_DIRECT)", err)
		}
		if n <= 0 || n&(directAlign-1) != 0 {
			// A short write off the block size: finish through the page cache.
			n = max(n, 0)
			return true, pwriteFull(ch.fd, p[len(p)-len(src)+n:], off+int64(n))
		}
		first = false
		src, off = src[n:], off+int64(n)
	}
	c.s.direct.Add(1)
	return true, nil
}

// ReadAt fills p from off in chunk id. Absent chunks and never-written,
// discarded or zeroed ranges read as zeros.
func (c *Copyset) ReadAt(id ChunkID, p []byte, off int64) error {
	if err := c.checkRange(off, int64(len(p))); err != nil {
		return err
	}
	c.mu.RLock()
	if c.removed {
		c.mu.RUnlock()
		return ErrClosed
	}
	ch := c.chunks[id]
	if ch == nil {
		c.mu.RUnlock()
		clear(p)
		return nil
	}
	fd, ok, err := c.s.fds.acquire(ch)
	c.mu.RUnlock()
	if err != nil {
		return err
	}
	if !ok {
		clear(p)
		return nil
	}
	ch.rw.RLock()
	err = preadFull(fd, p, off)
	ch.rw.RUnlock()
	c.s.fds.release(ch)
	return err
}

// ReadAtCached is ReadAt for data that is in the page cache: it never waits
// for the disk. It returns false (and p undefined) when serving the read would
// wait: the chunk file is not open, part of the range is not cached
// (preadv2 RWF_NOWAIT), or the kernel or filesystem lacks RWF_NOWAIT. A caller
// that must not block (a connection's reader) tries it first and hands only
// the reads it refuses to a goroutine that calls ReadAt.
func (c *Copyset) ReadAtCached(id ChunkID, p []byte, off int64) (bool, error) {
	if c.s.noWait.Load() {
		return false, nil
	}
	if err := c.checkRange(off, int64(len(p))); err != nil || len(p) == 0 {
		return true, err
	}
	c.mu.RLock()
	if c.removed {
		c.mu.RUnlock()
		return true, ErrClosed
	}
	ch := c.chunks[id]
	if ch == nil {
		c.mu.RUnlock()
		clear(p)
		return true, nil
	}
	fd, ok := c.s.fds.acquireOpen(ch)
	c.mu.RUnlock()
	if !ok {
		return false, nil
	}
	defer c.s.fds.release(ch)
	if !ch.rw.TryRLock() {
		return false, nil // a write of this chunk is under way: ReadAt waits for it
	}
	defer ch.rw.RUnlock()
	raw := !c.s.noCachestat.Load()
	if raw {
		switch all, err := pagesCached(fd, off, len(p)); {
		case err != nil: // unsupported (ENOSYS), refused by a seccomp profile, ...
			c.s.noCachestat.Store(true)
			c.s.log.Info("datastore: cachestat(2) failed, cached reads are ordinary system calls from now on", "err", err)
			raw = false
		case !all:
			return false, nil
		}
	}
	for len(p) > 0 {
		n, err := preadNoWait(fd, p, off, raw)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false, nil
		case err == unix.EOPNOTSUPP || err == unix.ENOSYS || err == unix.EINVAL:
			c.s.noWait.Store(true) // never again: every read would pay a failed syscall
			c.s.log.Info("datastore: preadv2(RWF_NOWAIT) unsupported, every read goes to a goroutine", "err", err)
			return false, nil
		case err != nil:
			return true, ioError("pread "+ch.path, err)
		case n == 0: // past the end of a short file: zeros
			clear(p)
			return true, nil
		}
		p, off = p[n:], off+int64(n)
	}
	return true, nil
}

// Discard trims [off, off+n) of chunk id (punch hole); it reads as zeros
// afterwards. An absent chunk stays absent.
func (c *Copyset) Discard(id ChunkID, off, n int64) error {
	return c.zero(id, off, n, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE)
}

// WriteZeroes zeroes [off, off+n) of chunk id (FALLOC_FL_ZERO_RANGE, or a
// punched hole where that is unsupported). An absent chunk stays absent.
func (c *Copyset) WriteZeroes(id ChunkID, off, n int64) error {
	return c.zero(id, off, n, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE)
}

func (c *Copyset) zero(id ChunkID, off, n int64, mode uint32) error {
	if err := c.checkRange(off, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.removed {
		return ErrClosed
	}
	ch := c.chunks[id]
	if ch == nil {
		return nil // thin: absent already reads as zeros
	}
	fd, ok, err := c.s.fds.acquire(ch)
	if err != nil || !ok {
		return err
	}
	defer c.s.fds.release(ch)
	ch.rw.Lock()
	defer ch.rw.Unlock()
	err = unix.Fallocate(fd, mode, off, n)
	if mode&unix.FALLOC_FL_ZERO_RANGE != 0 && isUnsupported(err) {
		err = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	}
	if isUnsupported(err) {
		err = writeZeros(fd, off, n)
	}
	if err != nil {
		return ioError("zero "+ch.path, err)
	}
	c.markDirtyLocked(ch)
	return nil
}

func isUnsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL)
}

var zeroBlock [64 << 10]byte

func writeZeros(fd int, off, n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeroBlock)))
		if err := pwriteFull(fd, zeroBlock[:k], off); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// writePiece caps one pwrite into a chunk file. Linux's page cache gives a
// buffered write folios as large as the write, and ext4 walks every block of
// a folio on each later write into it, so small writes get slower the larger
// the folios around them: 4 KiB rewrites took 2 µs after 4 KiB writes, 3 µs
// after 16 KiB ones, 8.5 µs after 1 MiB ones and 16–19 µs in folios made by
// readahead (Linux 6.18, ext4, this machine). Chunk files serve 4 KiB
// database writes; 16 KiB pieces keep big writes nearly as cheap.
const writePiece = 16 << 10

func pwriteFull(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(fd, p[:min(len(p), writePiece)], off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ioError("pwrite", err)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// preadNoWait is preadv2(fd, p, off, RWF_NOWAIT) with one iovec on the stack
// (x/sys's Preadv2 allocates its iovec slice). RWF_NOWAIT never waits for the
// data, but on an uncached range it starts readahead, which takes the file's
// invalidate lock and can wait for a free request in the disk's queue. raw
// makes it a raw system call, which does not wake the Go runtime's sysmon
// thread (see package sockio) but holds the process's P while it runs: only
// for ranges pagesCached found whole. The chunk files are opened FADV_RANDOM
// (no readahead marks on cached pages) and O_NOATIME (no journal handle), so
// such a read only copies from the page cache. What is left: a page evicted or
// punched out (a concurrent trim of the same range) between the two calls
// makes the read wait for the trim's lock, for as long as the trim takes.
func preadNoWait(fd int, p []byte, off int64, raw bool) (int, error) {
	iov := unix.Iovec{Base: &p[0]}
	iov.SetLen(len(p))
	syscall6 := unix.Syscall6
	if raw {
		syscall6 = unix.RawSyscall6
	}
	n, _, errno := syscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(&iov)), 1,
		uintptr(off), 0, unix.RWF_NOWAIT)
	if errno != 0 {
		return 0, errno
	}
	race.WriteRange(p[:n])
	return int(n), nil
}

// pagesCached reports whether every page of [off, off+n) of fd is in the page
// cache: cachestat(2) (Linux 6.5), a raw system call because it only looks.
func pagesCached(fd int, off int64, n int) (bool, error) {
	ps := int64(os.Getpagesize())
	first, last := off/ps, (off+int64(n)-1)/ps
	r := unix.CachestatRange{Off: uint64(first * ps), Len: uint64((last - first + 1) * ps)}
	var st unix.Cachestat_t
	_, _, errno := unix.RawSyscall6(unix.SYS_CACHESTAT, uintptr(fd), uintptr(unsafe.Pointer(&r)),
		uintptr(unsafe.Pointer(&st)), 0, 0, 0)
	if errno != 0 {
		return false, errno
	}
	return st.Cache == uint64(last-first+1), nil
}

func preadFull(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pread(fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ioError("pread", err)
		}
		if n == 0 { // past the end of a short file: zeros
			clear(p)
			return nil
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// syncParallelism is how many fdatasyncs Sync keeps in flight, so the device
// can merge their flushes.
const syncParallelism = 4

// Sync makes every write, discard and zeroing done before Sync was called
// durable: it fdatasyncs each dirty chunk once, then fsyncs chunks/ if
// chunks were created or removed. Chunks dirtied while Sync runs stay dirty
// for the next Sync. On error everything it took stays dirty.
func (c *Copyset) Sync() error {
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	if c.isRemoved() {
		return ErrClosed
	}
	c.dirtyMu.Lock()
	batch := c.dirty
	c.dirty = c.spare
	dirDirty := c.dirDirty
	c.dirDirty = false
	c.dirtyMu.Unlock()
	c.spare = nil

	err := c.syncChunks(batch)
	if err == nil && dirDirty {
		err = syncDir(c.chunksDir)
	}
	if err != nil {
		c.dirtyMu.Lock()
		for ch := range batch {
			c.dirty[ch] = struct{}{}
		}
		c.dirDirty = c.dirDirty || dirDirty
		c.dirtyMu.Unlock()
		clear(batch)
		c.spare = batch
		return err
	}
	clear(batch)
	c.spare = batch
	return nil
}

func (c *Copyset) syncChunks(batch map[*chunk]struct{}) error {
	if len(batch) == 0 {
		return nil
	}
	list := make([]*chunk, 0, len(batch))
	for ch := range batch {
		list = append(list, ch)
	}
	// Start write-back of every chunk first, so the device sees all of the
	// batch at once; the fdatasyncs below then mostly wait.
	for _, ch := range list {
		c.startWriteback(ch)
	}
	var (
		next  atomic.Int64
		errMu sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	work := func() {
		for {
			i := next.Add(1) - 1
			if i >= int64(len(list)) {
				return
			}
			if err := c.syncChunk(list[i]); err != nil {
				errMu.Lock()
				if first == nil {
					first = err
				}
				errMu.Unlock()
			}
		}
	}
	for range min(syncParallelism, len(list)) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	return first
}

// startWriteback asks the kernel to begin writing ch's dirty pages without
// waiting (sync_file_range WRITE). It is only a hint: errors are ignored and
// fdatasync still provides the guarantee.
func (c *Copyset) startWriteback(ch *chunk) {
	fd, ok, err := c.s.fds.acquire(ch)
	if err != nil || !ok {
		return
	}
	unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
	c.s.fds.release(ch)
}

func (c *Copyset) syncChunk(ch *chunk) error {
	fd, ok, err := c.s.fds.acquire(ch)
	if err != nil {
		return err
	}
	if !ok {
		return nil // deleted or replaced since it was written
	}
	defer c.s.fds.release(ch)
	if f := c.s.cfg.Knobs.Fdatasync; f != nil {
		err = f(fd, filepath.Base(ch.path))
	} else {
		err = unix.Fdatasync(fd)
	}
	if err != nil {
		return ioError("fdatasync "+ch.path, err)
	}
	return nil
}

// DirtyCount reports how many chunks wait for the next Sync.
func (c *Copyset) DirtyCount() int {
	c.dirtyMu.Lock()
	defer c.dirtyMu.Unlock()
	return len(c.dirty)
}

// SaveMeta durably replaces the copyset's meta blob. After a crash LoadMeta
// returns the old or the new blob, never a mix.
//
// It writes the older of two slot files (meta.0, meta.1) in place and
// fdatasyncs it: each record carries a sequence number and a CRC, so a write
// torn by a crash leaves the other slot's record, the previous one, intact.
// One pwrite and one fdatasync per save, where replacing a file by rename
// (writeAtomic) cost a new inode, a rename and two more fsyncs: with large
// writes the WAL asks for snapshots, each ending in a SaveMeta, every second
// or so, and creating the file alone was 2 % of all CPU in a 256 KiB write
// benchmark (ext4 looks for a free inode past the recently deleted ones).
func (c *Copyset) SaveMeta(b []byte) error {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	if c.isRemoved() {
		return ErrClosed
	}
	if !c.metaLoaded {
		if _, err := c.loadMetaLocked(); err != nil && !errors.Is(err, ErrCorrupt) {
			return err
		}
	}
	seq := c.metaSeq + 1
	name := metaSlotName(seq)
	path := filepath.Join(c.dir, name)
	rec := make([]byte, slotHdrSize+len(b))
	binary.BigEndian.PutUint32(rec[0:], metaSlotMagic)
	binary.BigEndian.PutUint64(rec[4:], seq)
	binary.BigEndian.PutUint32(rec[12:], uint32(len(b)))
	copy(rec[slotHdrSize:], b)
	binary.BigEndian.PutUint32(rec[16:], metaCRC(rec))
	created := false
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		fd, err = unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		created = true
	}
	if err != nil {
		return ioError("open "+path, err)
	}
	err = pwriteFull(fd, rec, 0)
	if err == nil {
		if err = unix.Fdatasync(fd); err != nil {
			err = ioError("fdatasync "+path, err)
		}
	}
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = ioError("close "+path, cerr)
	}
	if err == nil && created {
		err = syncDir(c.dir)
	}
	if err != nil {
		return err
	}
	c.metaSeq = seq
	if c.legacyMeta {
		// The slots hold the newest record now; the old single file goes.
		c.legacyMeta = false
		os.Remove(filepath.Join(c.dir, metaFileName))
	}
	return nil
}

// LoadMeta returns the blob of the last SaveMeta, nil if there was none, or
// an error wrapping ErrCorrupt if no slot holds a whole record although one
// was written (a slot torn by a crash, with the other one intact, is not
// corruption: the other one is the newest saved record).
func (c *Copyset) LoadMeta() ([]byte, error) {
	c.metaMu.Lock()
	defer c.metaMu.Unlock()
	if c.isRemoved() {
		return nil, ErrClosed
	}
	return c.loadMetaLocked()
}

func (c *Copyset) loadMetaLocked() ([]byte, error) {
	var (
		best    []byte
		bestSeq uint64
		found   bool
		present int
	)
	for slot := range 2 {
		path := filepath.Join(c.dir, metaSlotName(uint64(slot)))
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, ioError("read "+path, err)
		}
		present++
		seq, payload, ok := parseMetaSlot(raw)
		if ok && uint64(slot) == seq%2 && (!found || seq > bestSeq) {
			best, bestSeq, found = payload, seq, true
		}
	}
	switch {
	case found:
		c.metaSeq, c.metaLoaded = bestSeq, true
		c.legacyMeta = fileExists(filepath.Join(c.dir, metaFileName))
		return best, nil
	case present == 2:
		return nil, fmt.Errorf("%w: copyset %016x: neither meta slot holds a whole record", ErrCorrupt, c.group)
	}
	// No slot written yet, or only the first write, torn: the record before
	// it is the single file of older versions, if any.
	b, err := readAtomic(c.dir, metaFileName, metaMagic)
	if err != nil {
		return nil, err
	}
	c.metaSeq, c.metaLoaded, c.legacyMeta = 0, true, b != nil
	return b, nil
}

// Meta slot records: magic u32, seq u64, payload length u32, crc32c u32 of
// seq, length and payload, then the payload; big-endian. Record seq lives in
// slot seq%2.
const (
	metaSlotMagic = 0x424d5332 // "BMS2"
	slotHdrSize   = 20
)

func metaSlotName(seq uint64) string { return fmt.Sprintf("%s.%d", metaFileName, seq%2) }

// parseMetaSlot checks a slot file's record; the file may be longer than
// its record (an older, longer record written before it).
func parseMetaSlot(raw []byte) (seq uint64, payload []byte, ok bool) {
	if len(raw) < slotHdrSize || binary.BigEndian.Uint32(raw) != metaSlotMagic {
		return 0, nil, false
	}
	n := uint64(binary.BigEndian.Uint32(raw[12:]))
	if n > uint64(len(raw)-slotHdrSize) {
		return 0, nil, false
	}
	rec := raw[:slotHdrSize+n]
	if metaCRC(rec) != binary.BigEndian.Uint32(rec[16:]) {
		return 0, nil, false
	}
	seq = binary.BigEndian.Uint64(rec[4:])
	if seq == 0 {
		return 0, nil, false
	}
	return seq, slices.Clip(rec[slotHdrSize:]), true
}

// metaCRC is the crc32c of a slot record's seq, length and payload.
func metaCRC(rec []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, rec[4:16]), castagnoli, rec[slotHdrSize:])
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (c *Copyset) isRemoved() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.removed
}

// DeleteVolume removes every chunk of volume from the copyset. The files go
// back to the pool (zeroed there, in the background) or are unlinked. The
// removal is durable when DeleteVolume returns: chunks/ and the pool's
// recycle directory are fsynced, so a crash cannot bring a chunk back.
func (c *Copyset) DeleteVolume(volume uint64) error {
	n, err := c.deleteVolume(volume)
	if err != nil || n == 0 {
		return err
	}
	if err := syncDir(c.chunksDir); err != nil {
		return err
	}
	return c.s.pool.syncRecycle(c.chunkSize)
}

// deleteVolume moves the volume's chunk files out and returns how many.
func (c *Copyset) deleteVolume(volume uint64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return 0, ErrClosed
	}
	n := 0
	for id, ch := range c.chunks {
		if id.Volume != volume {
			continue
		}
		c.s.fds.kill(ch)
		if err := c.s.pool.recycle(c.chunkSize, ch.path); err != nil {
			return n, err
		}
		n++
		delete(c.chunks, id)
		c.dirtyMu.Lock()
		delete(c.dirty, ch)
		c.dirDirty = true
		c.dirtyMu.Unlock()
	}
	return n, nil
}

// Volumes returns the ids of the volumes that have a chunk file here, in no
// particular order.
func (c *Copyset) Volumes() ([]uint64, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.removed {
		return nil, ErrClosed
	}
	seen := make(map[uint64]bool)
	var out []uint64
	for id := range c.chunks {
		if !seen[id.Volume] {
			seen[id.Volume] = true
			out = append(out, id.Volume)
		}
	}
	return out, nil
}

// Chunks lists the chunks that have a file, sorted by volume then index.
func (c *Copyset) Chunks() ([]ChunkID, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.removed {
		return nil, ErrClosed
	}
	out := make([]ChunkID, 0, len(c.chunks))
	for id := range c.chunks {
		out = append(out, id)
	}
	slices.SortFunc(out, compareIDs)
	return out, nil
}

func compareIDs(a, b ChunkID) int {
	return cmp.Or(cmp.Compare(a.Volume, b.Volume), cmp.Compare(a.Index, b.Index))
}

// openChunk finds chunk id and takes an fd reference to it; ch is nil if the
// chunk has no file.
func (c *Copyset) openChunk(id ChunkID) (ch *chunk, fd int, err error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.removed {
		return nil, -1, ErrClosed
	}
	ch = c.chunks[id]
	if ch == nil {
		return nil, -1, nil
	}
	fd, ok, err := c.s.fds.acquire(ch)
	if err != nil || !ok {
		return nil, -1, err
	}
	return ch, fd, nil
}

// DataExtents calls fn for each extent of [off, off+n) of chunk id that
// holds data in its file, in order (SEEK_DATA / SEEK_HOLE): an absent chunk
// has none, a discarded range none at the file system's block size. Where
// the file system cannot report holes, the whole range is data. A write or
// discard of the chunk does not run meanwhile (the chunk's lock).
func (c *Copyset) DataExtents(id ChunkID, off, n int64, fn func(off, n int64)) error {
	if err := c.checkRange(off, n); err != nil {
		return err
	}
	ch, fd, err := c.openChunk(id)
	if err != nil || ch == nil {
		return err
	}
	defer c.s.fds.release(ch)
	ch.rw.RLock()
	defer ch.rw.RUnlock()
	end := off + n
	for off < end {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil
		}
		if isUnsupported(err) {
			fn(off, end-off)
			return nil
		}
		if err != nil {
			return ioError("seek data", err)
		}
		if d >= end {
			return nil
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return ioError("seek hole", err)
		}
		h = min(h, end)
		fn(d, h-d)
		off = h
	}
	return nil
}

// Checksum returns the crc32c (Castagnoli) of the whole chunk, holes and
// absent chunks counted as zeros, so that replicas can be compared whatever
// their allocation.
func (c *Copyset) Checksum(id ChunkID) (uint32, error) {
	ch, fd, err := c.openChunk(id)
	if err != nil {
		return 0, err
	}
	if ch == nil {
		return c.zeroChecksum(), nil
	}
	defer c.s.fds.release(ch)
	var crc uint32
	buf := make([]byte, 256<<10)
	pos := int64(0)
	err = dataExtents(fd, c.chunkSize, func(off, n int64) error {
		crc = crcZeros(crc, off-pos)
		for n > 0 {
			k := min(n, int64(len(buf)))
			if err := preadFull(fd, buf[:k], off); err != nil {
				return err
			}
			crc = crc32.Update(crc, castagnoli, buf[:k])
			off, n = off+k, n-k
		}
		pos = off
		return nil
	})
	if err != nil {
		return 0, err
	}
	return crcZeros(crc, c.chunkSize-pos), nil
}

func (c *Copyset) zeroChecksum() uint32 {
	if v := c.zeroCRC.Load(); v != 0 {
		return uint32(v)
	}
	crc := crcZeros(0, c.chunkSize)
	c.zeroCRC.Store(1<<32 | uint64(crc))
	return crc
}

func crcZeros(crc uint32, n int64) uint32 {
	for n > 0 {
		k := min(n, int64(len(zeroBlock)))
		crc = crc32.Update(crc, castagnoli, zeroBlock[:k])
		n -= k
	}
	return crc
}

// dataExtents calls fn for each data extent of fd inside [0, size), in
// order, skipping holes (SEEK_DATA / SEEK_HOLE). Where the file system cannot
// report holes, the rest of the file is one extent.
func dataExtents(fd int, size int64, fn func(off, n int64) error) error {
	off := int64(0)
	for off < size {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil
		}
		if isUnsupported(err) {
			return fn(off, size-off)
		}
		if err != nil {
			return ioError("seek data", err)
		}
		if d >= size {
			return nil
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return ioError("seek hole", err)
		}
		h = min(h, size)
		if err := fn(d, h-d); err != nil {
			return err
		}
		off = h
	}
	return nil
}
