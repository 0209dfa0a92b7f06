package datastore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/fsdir"
)

// DefaultPreallocChunks is the pool depth a chunkserver should use. A zero
// Config.PreallocChunks disables the pool; it does not mean "default".
const DefaultPreallocChunks = 4

// DefaultMaxOpenFiles bounds the chunk-file descriptor cache when
// Config.MaxOpenFiles is 0.
const DefaultMaxOpenFiles = 1024

// Config configures a Store.
type Config struct {
	Dir string // data directory; created if missing
	// PreallocChunks is how many preallocated files the pool keeps ready per
	// chunk size in use. 0 disables the pool: chunk files are created (and
	// preallocated) on first write, and deleted chunks are unlinked.
	PreallocChunks int
	// MaxOpenFiles bounds the open chunk files of the store (LRU); 0 means
	// DefaultMaxOpenFiles.
	MaxOpenFiles int
	Logger       *slog.Logger
	Knobs        Knobs
}

// Knobs are fault-injection and observation points for tests. Nil fields do
// nothing.
type Knobs struct {
	// Fdatasync, if set, replaces fdatasync(2) for chunk files in Copyset.Sync.
	// name is the chunk's file name ("<volume>_<index>", see doc.go).
	Fdatasync func(fd int, name string) error
	// BeforeInstallStep runs before step 1, 2, 3 and 4 of InstallStaged (see
	// doc.go). A non-nil error makes InstallStaged return it at once, leaving
	// the directories as a crash at that point would.
	BeforeInstallStep func(step int) error
}

// Store is the chunk-file store of one chunkserver disk: its copysets and the
// shared pool of preallocated chunk files.
type Store struct {
	cfg         Config
	log         *slog.Logger
	fds         *fdCache
	pool        *pool
	closed      atomic.Bool
	noWait      atomic.Bool   // preadv2(RWF_NOWAIT) is unsupported here (ReadAtCached)
	noCachestat atomic.Bool   // cachestat(2) is unsupported: ReadAtCached's preads stay ordinary calls
	noDirect    atomic.Bool   // O_DIRECT was refused: WriteAtUncached writes through the page cache
	direct      atomic.Uint64 // writes WriteAtUncached made with O_DIRECT (tests)

	mu       sync.Mutex // guards copysets
	copysets map[uint64]*Copyset
	csDir    string // <Dir>/copysets
}

// refuseDirect turns WriteAtUncached's direct writes off for good, once.
func (s *Store) refuseDirect(err error) {
	if !s.noDirect.Swap(true) {
		s.log.Warn("datastore: O_DIRECT chunk writes refused; writing through the page cache", "err", err)
	}
}

// Open opens (or creates) the store in cfg.Dir. It finishes or rolls back any
// interrupted snapshot install, removes half-created files left by a crash,
// loads every copyset and starts the pool filler.
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errors.New("datastore: Config.Dir is empty")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxOpenFiles <= 0 {
		cfg.MaxOpenFiles = DefaultMaxOpenFiles
	}
	if cfg.PreallocChunks < 0 {
		cfg.PreallocChunks = 0
	}
	s := &Store{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "datastore", "dir", cfg.Dir),
		fds:      newFDCache(cfg.MaxOpenFiles),
		copysets: make(map[uint64]*Copyset),
		csDir:    filepath.Join(cfg.Dir, "copysets"),
	}
	// The directories must survive a power cut as soon as anything in them
	// does: a copyset's meta, its chunks, and what the WAL compacted away
	// because they were synced (fsdir.MkdirAll syncs each new one's parent).
	for _, d := range []string{cfg.Dir, s.csDir} {
		if err := fsdir.MkdirAll(d, 0o755); err != nil {
			return nil, ioError("mkdir "+d, err)
		}
	}
	p, err := openPool(s, filepath.Join(cfg.Dir, "pool"), cfg.PreallocChunks)
	if err != nil {
		return nil, err
	}
	s.pool = p
	ents, err := os.ReadDir(s.csDir)
	if err != nil {
		return nil, ioError("readdir "+s.csDir, err)
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") || strings.HasSuffix(name, ".removed") {
			// A copyset that was being created or removed when we crashed.
			if err := os.RemoveAll(filepath.Join(s.csDir, name)); err != nil {
				return nil, ioError("remove "+name, err)
			}
			continue
		}
		group, err := strconv.ParseUint(name, 16, 64)
		if err != nil || !e.IsDir() {
			s.log.Warn("ignoring unknown entry in copysets dir", "name", name)
			continue
		}
		cs, err := loadCopyset(s, group)
		if err != nil {
			p.stop()
			return nil, err
		}
		s.copysets[group] = cs
		p.want(cs.chunkSize)
	}
	p.start()
	s.log.Info("datastore opened", "copysets", len(s.copysets), "pool", cfg.PreallocChunks)
	return s, nil
}

// Copyset opens the copyset of Raft group group, creating it (durably) with
// chunkSize if it does not exist. An existing copyset must have been created
// with the same chunk size, else ErrChunkSize.
func (s *Store) Copyset(group uint64, chunkSize int64) (*Copyset, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if chunkSize <= 0 || chunkSize%512 != 0 {
		return nil, fmt.Errorf("datastore: chunk size %d is not a positive multiple of 512", chunkSize)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cs, ok := s.copysets[group]; ok {
		if cs.chunkSize != chunkSize {
			return nil, fmt.Errorf("%w: copyset %016x has %d, asked %d", ErrChunkSize, group, cs.chunkSize, chunkSize)
		}
		return cs, nil
	}
	// Build it under a .tmp name, then rename: a crash leaves either no
	// copyset or a complete one.
	name := fmt.Sprintf("%016x", group)
	tmp := filepath.Join(s.csDir, name+".tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return nil, ioError("remove "+tmp, err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, chunksDirName), 0o755); err != nil {
		return nil, ioError("mkdir "+tmp, err)
	}
	var info [8]byte
	binary.BigEndian.PutUint64(info[:], uint64(chunkSize))
	if err := writeAtomic(tmp, infoFileName, infoMagic, info[:]); err != nil {
		return nil, err
	}
	if err := syncDir(filepath.Join(tmp, chunksDirName)); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(s.csDir, name)); err != nil {
		return nil, ioError("rename "+tmp, err)
	}
	if err := syncDir(s.csDir); err != nil {
		return nil, err
	}
	cs, err := loadCopyset(s, group)
	if err != nil {
		return nil, err
	}
	s.copysets[group] = cs
	s.pool.want(chunkSize)
	s.log.Info("copyset created", "group", group, "chunk_size", chunkSize)
	return cs, nil
}

// RemoveCopyset deletes a copyset and all its files. Removing an unknown
// copyset is not an error. The *Copyset returns ErrClosed afterwards.
func (s *Store) RemoveCopyset(group uint64) error {
	if s.closed.Load() {
		return ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := s.copysets[group]
	if !ok {
		return nil
	}
	cs.mu.Lock()
	cs.removed = true
	for _, ch := range cs.chunks {
		s.fds.kill(ch)
	}
	cs.chunks = nil
	cs.mu.Unlock()
	delete(s.copysets, group)
	gone := cs.dir + ".removed"
	if err := os.Rename(cs.dir, gone); err != nil {
		return ioError("rename "+cs.dir, err)
	}
	if err := syncDir(s.csDir); err != nil {
		return err
	}
	if err := os.RemoveAll(gone); err != nil {
		return ioError("remove "+gone, err)
	}
	s.log.Info("copyset removed", "group", group)
	return nil
}

// Copysets lists the groups of every copyset in the store, sorted.
func (s *Store) Copysets() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint64, 0, len(s.copysets))
	for g := range s.copysets {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// Usage reports the capacity and the used bytes of the file system that
// holds the store (statfs: used = total - free blocks).
func (s *Store) Usage() (capacity, used uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.cfg.Dir, &st); err != nil {
		return 0, 0, ioError("statfs "+s.cfg.Dir, err)
	}
	bs := uint64(st.Bsize)
	return st.Blocks * bs, (st.Blocks - st.Bfree) * bs, nil
}

// Close stops the pool filler and closes every file. Dirty chunks are not
// synced: Close behaves like a crash for data not yet Synced. Call it after
// every other use of the store has returned.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.pool.stop()
	s.mu.Lock()
	for _, cs := range s.copysets {
		cs.mu.Lock()
		cs.removed = true
		cs.mu.Unlock()
	}
	s.mu.Unlock()
	s.fds.closeAll()
	return nil
}

// ---- small durable-file helpers ----

const (
	infoFileName  = "info"
	metaFileName  = "meta"
	chunksDirName = "chunks"
	infoMagic     = 0x42494e46 // "BINF"
	metaMagic     = 0x424d5441 // "BMTA"
	fileHdrSize   = 12
)

// writeAtomic replaces dir/name with a framed copy of payload (magic, length,
// crc32c, payload — see doc.go): write name.tmp, fsync it, rename, fsync dir.
func writeAtomic(dir, name string, magic uint32, payload []byte) error {
	buf := make([]byte, fileHdrSize+len(payload))
	binary.BigEndian.PutUint32(buf[0:], magic)
	binary.BigEndian.PutUint32(buf[4:], uint32(len(payload)))
	binary.BigEndian.PutUint32(buf[8:], crc32.Checksum(payload, castagnoli))
	copy(buf[fileHdrSize:], payload)
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return ioError("create "+tmp, err)
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return ioError("write "+tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return ioError("fsync "+tmp, err)
	}
	if err := f.Close(); err != nil {
		return ioError("close "+tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return ioError("rename "+tmp, err)
	}
	return syncDir(dir)
}

// readAtomic reads a file written by writeAtomic. A missing file is (nil,
// nil); any framing or CRC failure is ErrCorrupt.
func readAtomic(dir, name string, magic uint32) ([]byte, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, ioError("read "+p, err)
	}
	if len(b) < fileHdrSize || binary.BigEndian.Uint32(b) != magic {
		return nil, fmt.Errorf("%w: %s: bad header", ErrCorrupt, p)
	}
	n := binary.BigEndian.Uint32(b[4:])
	if uint64(n) != uint64(len(b)-fileHdrSize) {
		return nil, fmt.Errorf("%w: %s: length %d, file holds %d", ErrCorrupt, p, n, len(b)-fileHdrSize)
	}
	payload := b[fileHdrSize:]
	if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(b[8:]) {
		return nil, fmt.Errorf("%w: %s: crc mismatch", ErrCorrupt, p)
	}
	if payload == nil {
		payload = []byte{}
	}
	return payload, nil
}

// syncDir fsyncs a directory so that entries created, renamed or removed in
// it are durable.
func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ioError("open dir "+dir, err)
	}
	err = unix.Fsync(fd)
	unix.Close(fd)
	if err != nil {
		return ioError("fsync dir "+dir, err)
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)
