package datastore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Snapshot stream format (version 1). All integers big-endian.
const (
	snapMagic      = 0x42534e50 // "BSNP"
	snapVersion    = 1
	snapHeaderSize = 24 // magic u32, version u32, chunk size u64, group u64

	recChunk = 'C' // volume u64, index u64, chunk size u64
	recData  = 'D' // offset u64, length u32, then length bytes
	recEnd   = 'E' // chunk count u64, then crc32c u32 of every earlier byte

	maxExtent = 1 << 20 // largest data record payload
)

const (
	stagingDirName = "staging"    // a snapshot being received; removed at Open
	stagedPrefix   = "staged."    // staged.<index>: a complete, fsynced received snapshot of that index
	legacyStaged   = "staged"     // a staged snapshot of an earlier version, index unknown
	oldDirName     = "chunks.old" // the replaced chunks during InstallStaged
	installName    = "install"    // the index of the last InstallStaged begun (writeAtomic)
	installMagic   = 0x42494e53   // "BINS"
)

// stagedName is the directory name of the staged snapshot of index.
func stagedName(index uint64) string { return fmt.Sprintf("%s%016x", stagedPrefix, index) }

// parseStagedName returns the index of a staged snapshot's directory name.
func parseStagedName(name string) (uint64, bool) {
	var index uint64
	if len(name) != len(stagedPrefix)+16 || name[:len(stagedPrefix)] != stagedPrefix {
		return 0, false
	}
	if _, err := fmt.Sscanf(name[len(stagedPrefix):], "%016x", &index); err != nil {
		return 0, false
	}
	return index, true
}

// crcWriter writes to w and keeps the crc32c of everything written.
type crcWriter struct {
	w   io.Writer
	crc uint32
}

func (cw *crcWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.crc = crc32.Update(cw.crc, castagnoli, p[:n])
	return n, err
}

// WriteSnapshot streams every chunk of the copyset to w in the format of
// doc.go. Writes may continue meanwhile: each chunk is read as it is at the
// moment its extents are read (docs/design.md §5 explains why that converges).
// Holes are skipped, so sparse chunks stream small.
func (c *Copyset) WriteSnapshot(w io.Writer) error {
	ids, err := c.Chunks()
	if err != nil {
		return err
	}
	cw := &crcWriter{w: w}
	var hdr [snapHeaderSize]byte
	binary.BigEndian.PutUint32(hdr[0:], snapMagic)
	binary.BigEndian.PutUint32(hdr[4:], snapVersion)
	binary.BigEndian.PutUint64(hdr[8:], uint64(c.chunkSize))
	binary.BigEndian.PutUint64(hdr[16:], c.group)
	if _, err := cw.Write(hdr[:]); err != nil {
		return fmt.Errorf("datastore: snapshot write: %w", err)
	}
	buf := make([]byte, maxExtent)
	var rec [25]byte
	count := uint64(0)
	for _, id := range ids {
		ch, fd, err := c.openChunk(id)
		if err != nil {
			return err
		}
		if ch == nil {
			continue // deleted since we listed it
		}
		count++
		rec[0] = recChunk
		binary.BigEndian.PutUint64(rec[1:], id.Volume)
		binary.BigEndian.PutUint64(rec[9:], id.Index)
		binary.BigEndian.PutUint64(rec[17:], uint64(c.chunkSize))
		_, err = cw.Write(rec[:25])
		if err == nil {
			err = dataExtents(fd, c.chunkSize, func(off, n int64) error {
				for n > 0 {
					k := min(n, maxExtent)
					if err := preadFull(fd, buf[:k], off); err != nil {
						return err
					}
					rec[0] = recData
					binary.BigEndian.PutUint64(rec[1:], uint64(off))
					binary.BigEndian.PutUint32(rec[9:], uint32(k))
					if _, err := cw.Write(rec[:13]); err != nil {
						return err
					}
					if _, err := cw.Write(buf[:k]); err != nil {
						return err
					}
					off, n = off+k, n-k
				}
				return nil
			})
		}
		c.s.fds.release(ch)
		if err != nil {
			return fmt.Errorf("datastore: snapshot of chunk %v: %w", id, err)
		}
	}
	rec[0] = recEnd
	binary.BigEndian.PutUint64(rec[1:], count)
	if _, err := cw.Write(rec[:9]); err != nil {
		return fmt.Errorf("datastore: snapshot write: %w", err)
	}
	binary.BigEndian.PutUint32(rec[:4], cw.crc)
	if _, err := w.Write(rec[:4]); err != nil {
		return fmt.Errorf("datastore: snapshot write: %w", err)
	}
	return nil
}

// crcReader reads from r and keeps the crc32c of everything read.
type crcReader struct {
	r   io.Reader
	crc uint32
}

func (cr *crcReader) readFull(p []byte) error {
	n, err := io.ReadFull(cr.r, p)
	cr.crc = crc32.Update(cr.crc, castagnoli, p[:n])
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: snapshot stream truncated", ErrCorrupt)
	}
	if err != nil {
		return fmt.Errorf("datastore: snapshot read: %w", err)
	}
	return nil
}

// ReceiveSnapshot reads a stream written by WriteSnapshot, the data of the
// snapshot of raft index index, into the staging area and makes it durable.
// The live chunks are not touched: on any error (truncated stream, bad record,
// CRC mismatch, disk error) the staging area is removed and the error
// returned. On success the data waits in staged.<index>/ for
// InstallStaged(index), replacing an earlier staged snapshot of the same index
// only: snapshots of other indexes stay staged (a follower may get a newer
// snapshot before raft installed the older one; each install must use its own
// data). Receives are serialized. The stream is consumed exactly up to its
// trailer.
func (c *Copyset) ReceiveSnapshot(index uint64, r io.Reader) error {
	return c.ReceiveSnapshotChecked(index, r, nil)
}

// ReceiveSnapshotChecked is ReceiveSnapshot that also refuses (ErrCorrupt,
// nothing staged) a stream holding a chunk belongs rejects: one of another
// copyset (belongs nil: no such check).
func (c *Copyset) ReceiveSnapshotChecked(index uint64, r io.Reader, belongs func(ChunkID) bool) error {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	if c.isRemoved() {
		return ErrClosed
	}
	staging := filepath.Join(c.dir, stagingDirName)
	if err := os.RemoveAll(staging); err != nil {
		return ioError("remove "+staging, err)
	}
	if err := os.Mkdir(staging, 0o755); err != nil {
		return ioError("mkdir "+staging, err)
	}
	if err := c.receive(r, staging, belongs); err != nil {
		os.RemoveAll(staging)
		return err
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	staged := filepath.Join(c.dir, stagedName(index))
	if err := os.RemoveAll(staged); err != nil {
		os.RemoveAll(staging)
		return ioError("remove "+staged, err)
	}
	if err := os.Rename(staging, staged); err != nil {
		os.RemoveAll(staging)
		return ioError("rename "+staging, err)
	}
	return syncDir(c.dir)
}

// DropStaged removes every staged snapshot of an index up to through (raft
// refuses a snapshot at or below its commit index, so these are never
// installed). Their removal need not be durable: Open keeps them until the
// next DropStaged.
func (c *Copyset) DropStaged(through uint64) error {
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	return c.dropStaged(func(i uint64) bool { return i <= through })
}

// dropStaged removes the staged snapshots whose index drop selects. Caller holds snapMu.
func (c *Copyset) dropStaged(drop func(uint64) bool) error {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return ioError("readdir "+c.dir, err)
	}
	for _, e := range ents {
		if i, ok := parseStagedName(e.Name()); ok && drop(i) {
			if err := os.RemoveAll(filepath.Join(c.dir, e.Name())); err != nil {
				return ioError("remove "+e.Name(), err)
			}
		}
	}
	return nil
}

func (c *Copyset) receive(r io.Reader, staging string, belongs func(ChunkID) bool) error {
	cr := &crcReader{r: r}
	var hdr [snapHeaderSize]byte
	if err := cr.readFull(hdr[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint32(hdr[0:]) != snapMagic {
		return fmt.Errorf("%w: not a snapshot stream", ErrCorrupt)
	}
	if v := binary.BigEndian.Uint32(hdr[4:]); v != snapVersion {
		return fmt.Errorf("%w: snapshot version %d", ErrCorrupt, v)
	}
	if cs := int64(binary.BigEndian.Uint64(hdr[8:])); cs != c.chunkSize {
		return fmt.Errorf("%w: snapshot chunk size %d, copyset has %d", ErrChunkSize, cs, c.chunkSize)
	}
	if g := binary.BigEndian.Uint64(hdr[16:]); g != c.group {
		return fmt.Errorf("%w: a snapshot of copyset %016x, this is %016x", ErrCorrupt, g, c.group)
	}
	var (
		rec   [24]byte
		buf   = make([]byte, maxExtent)
		fd    = -1
		name  string
		next  int64 // lowest offset the next data record may start at
		count uint64
		seen  = make(map[ChunkID]bool)
	)
	finish := func() error { // make the current chunk file durable and close it
		if fd < 0 {
			return nil
		}
		err := unix.Fsync(fd)
		unix.Close(fd)
		fd = -1
		if err != nil {
			return ioError("fsync "+name, err)
		}
		return nil
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	for {
		if err := cr.readFull(rec[:1]); err != nil {
			return err
		}
		switch rec[0] {
		case recChunk:
			if err := cr.readFull(rec[:24]); err != nil {
				return err
			}
			id := ChunkID{binary.BigEndian.Uint64(rec[0:]), binary.BigEndian.Uint64(rec[8:])}
			if cs := int64(binary.BigEndian.Uint64(rec[16:])); cs != c.chunkSize {
				return fmt.Errorf("%w: chunk %v has size %d", ErrCorrupt, id, cs)
			}
			if seen[id] {
				return fmt.Errorf("%w: chunk %v twice", ErrCorrupt, id)
			}
			if belongs != nil && !belongs(id) {
				return fmt.Errorf("%w: chunk %v belongs to another copyset", ErrCorrupt, id)
			}
			seen[id] = true
			if err := finish(); err != nil {
				return err
			}
			name = filepath.Join(staging, id.fileName())
			var err error
			fd, err = unix.Open(name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return ioError("create "+name, err)
			}
			if err := preallocate(fd, c.chunkSize); err != nil {
				return err
			}
			next = 0
			count++
		case recData:
			if err := cr.readFull(rec[:12]); err != nil {
				return err
			}
			off := int64(binary.BigEndian.Uint64(rec[0:]))
			n := int64(binary.BigEndian.Uint32(rec[8:]))
			if fd < 0 || off < next || n == 0 || n > maxExtent || off > c.chunkSize-n {
				return fmt.Errorf("%w: bad data record [%d, +%d)", ErrCorrupt, off, n)
			}
			if err := cr.readFull(buf[:n]); err != nil {
				return err
			}
			if err := pwriteFull(fd, buf[:n], off); err != nil {
				return err
			}
			next = off + n
		case recEnd:
			if err := cr.readFull(rec[:8]); err != nil {
				return err
			}
			want := cr.crc
			if n := binary.BigEndian.Uint64(rec[0:]); n != count {
				return fmt.Errorf("%w: trailer counts %d chunks, stream had %d", ErrCorrupt, n, count)
			}
			if _, err := io.ReadFull(r, rec[:4]); err != nil {
				return fmt.Errorf("%w: snapshot trailer truncated", ErrCorrupt)
			}
			if got := binary.BigEndian.Uint32(rec[:4]); got != want {
				return fmt.Errorf("%w: snapshot crc %08x, computed %08x", ErrCorrupt, got, want)
			}
			if err := finish(); err != nil {
				return err
			}
			return syncDir(staging)
		default:
			return fmt.Errorf("%w: unknown record type %#x", ErrCorrupt, rec[0])
		}
	}
}

// HasStaged reports whether the snapshot of index is staged (received, not
// yet installed).
func (c *Copyset) HasStaged(index uint64) bool {
	_, err := os.Stat(filepath.Join(c.dir, stagedName(index)))
	return err == nil
}

// Installed returns the index of the last InstallStaged begun (0: none). Once
// it returned, or after a crash inside it and Open's repair, the chunks are
// that snapshot's data (plus what was written since): a caller that finds the
// snapshot no longer staged after a restart checks this before recording the
// index as installed.
func (c *Copyset) Installed() (uint64, error) {
	b, err := readAtomic(c.dir, installName, installMagic)
	if err != nil || b == nil {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: copyset %016x: bad install record", ErrCorrupt, c.group)
	}
	return binary.BigEndian.Uint64(b), nil
}

// InstallStaged replaces the copyset's chunks with the staged snapshot of
// index (ErrNoStaged when there is none; the data staged for another index is
// never used):
//
//  0. record index in the install file (durable)
//  1. rename chunks → chunks.old
//  2. rename staged.<index> → chunks
//  3. fsync the copyset directory
//  4. remove chunks.old
//
// Writes wait while it runs. A crash at any point is finished or rolled back
// by Open (see doc.go). The dirty set is emptied: the old chunks are gone and
// the staged ones were fsynced when received. Staged snapshots of lower
// indexes are removed afterwards: raft never installs them now.
func (c *Copyset) InstallStaged(index uint64) error {
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return ErrClosed
	}
	staged := filepath.Join(c.dir, stagedName(index))
	old := filepath.Join(c.dir, oldDirName)
	if _, err := os.Stat(staged); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: snapshot %d", ErrNoStaged, index)
	}
	step := func(n int) error {
		if f := c.s.cfg.Knobs.BeforeInstallStep; f != nil {
			return f(n)
		}
		return nil
	}
	var rec [8]byte
	binary.BigEndian.PutUint64(rec[:], index)
	if err := writeAtomic(c.dir, installName, installMagic, rec[:]); err != nil {
		return err
	}
	for _, ch := range c.chunks {
		c.s.fds.kill(ch)
	}
	c.chunks = map[ChunkID]*chunk{}
	c.dirtyMu.Lock()
	clear(c.dirty)
	c.dirDirty = false
	c.dirtyMu.Unlock()

	if err := step(1); err != nil {
		return err
	}
	if err := os.RemoveAll(old); err != nil {
		return ioError("remove "+old, err)
	}
	if err := os.Rename(c.chunksDir, old); err != nil {
		c.scanChunks()
		return ioError("rename chunks", err)
	}
	if err := step(2); err != nil {
		return err
	}
	if err := os.Rename(staged, c.chunksDir); err != nil {
		os.Rename(old, c.chunksDir) // roll back
		c.scanChunks()
		return ioError("rename staged", err)
	}
	// The new chunks are live from here on, whatever happens next.
	if err := c.scanChunks(); err != nil {
		return err
	}
	if err := step(3); err != nil {
		return err
	}
	if err := syncDir(c.dir); err != nil {
		return err
	}
	if err := step(4); err != nil {
		return err
	}
	if err := os.RemoveAll(old); err != nil {
		c.log.Warn("removing replaced chunks failed", "err", err)
	}
	if err := c.dropStaged(func(i uint64) bool { return i < index }); err != nil {
		c.log.Warn("removing older staged snapshots failed", "err", err)
	}
	c.log.Info("snapshot installed", "index", index, "chunks", len(c.chunks))
	return nil
}

// recoverInstall repairs a copyset directory after a crash inside
// InstallStaged (see doc.go): with chunks.old present, the swap is finished
// if the new chunks/ or the staged snapshot the install file names exist,
// else rolled back. A staged/ of an earlier version (its index unknown) is
// removed.
func (c *Copyset) recoverInstall() error {
	old := filepath.Join(c.dir, oldDirName)
	legacy := filepath.Join(c.dir, legacyStaged)
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	if exists(old) {
		staged := legacy // an earlier version's install
		if idx, err := c.Installed(); err != nil {
			return err
		} else if idx > 0 && exists(filepath.Join(c.dir, stagedName(idx))) {
			staged = filepath.Join(c.dir, stagedName(idx))
		}
		switch {
		case exists(c.chunksDir):
			// Crashed after step 2: the new chunks are in place.
		case exists(staged):
			// Crashed between steps 1 and 2: roll forward.
			if err := os.Rename(staged, c.chunksDir); err != nil {
				return ioError("rename staged", err)
			}
			c.log.Info("finished an interrupted snapshot install")
		default:
			// Staged data is gone (cannot happen with the order above):
			// keep the old chunks.
			if err := os.Rename(old, c.chunksDir); err != nil {
				return ioError("rename chunks.old", err)
			}
			c.log.Warn("rolled back an interrupted snapshot install")
		}
		if err := syncDir(c.dir); err != nil {
			return err
		}
		if err := os.RemoveAll(old); err != nil {
			return ioError("remove "+old, err)
		}
	}
	if exists(legacy) {
		c.log.Warn("removing a staged snapshot of an earlier version (its index is unknown)")
		if err := os.RemoveAll(legacy); err != nil {
			return ioError("remove "+legacy, err)
		}
	}
	if !exists(c.chunksDir) {
		return fmt.Errorf("%w: copyset %016x has no chunks dir", ErrCorrupt, c.group)
	}
	return nil
}
