package datastore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// pool keeps preallocated chunk files ready, per chunk size, so that the
// first write to a chunk costs one rename, not an allocation.
//
// Layout: <Dir>/pool/<chunk size in decimal>/<seq %016x> are ready files;
// tmp-<seq> are files being prepared (removed at Open); recycle/<seq> are
// files of deleted chunks still holding old data, zeroed by the filler before
// they become ready again.
//
// Goroutines: one filler goroutine (started by Open when the pool is
// enabled) owns all file creation and recycling in the pool directory. take
// and recycle run on callers' goroutines and only rename files.
//
// INVARIANT: a file named <seq> in a size directory reads as zeros over its
// whole length, which is exactly that chunk size, and was fsynced.
type pool struct {
	s      *Store
	dir    string
	target int

	mu    sync.Mutex         // guards the fields below
	ready map[int64][]string // chunk size → ready file paths
	sizes map[int64]bool     // chunk sizes the filler keeps stocked
	seq   uint64

	kick     chan struct{}
	quit     chan struct{}
	done     chan struct{}
	started  bool
	stopOnce sync.Once
}

func openPool(s *Store, dir string, target int) (*pool, error) {
	p := &pool{
		s: s, dir: dir, target: target,
		ready: make(map[int64][]string),
		sizes: make(map[int64]bool),
		kick:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, ioError("mkdir "+dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, ioError("readdir "+dir, err)
	}
	for _, e := range ents {
		size, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil || !e.IsDir() || size <= 0 {
			continue
		}
		sdir := filepath.Join(dir, e.Name())
		files, err := os.ReadDir(sdir)
		if err != nil {
			return nil, ioError("readdir "+sdir, err)
		}
		for _, f := range files {
			name := f.Name()
			if strings.HasPrefix(name, "tmp-") {
				os.Remove(filepath.Join(sdir, name)) // half-prepared at a crash
				continue
			}
			if seq, err := strconv.ParseUint(name, 16, 64); err == nil && !f.IsDir() {
				p.seq = max(p.seq, seq+1)
				path := filepath.Join(sdir, name)
				if holdsNoData(path) {
					p.ready[size] = append(p.ready[size], path)
					continue
				}
				// A chunk file whose rename out of the pool was lost in a
				// crash after data reached it: zero it again before use.
				rdir := filepath.Join(sdir, "recycle")
				if err := os.MkdirAll(rdir, 0o755); err != nil {
					return nil, ioError("mkdir "+rdir, err)
				}
				if err := os.Rename(path, filepath.Join(rdir, name)); err != nil {
					return nil, ioError("rename "+path, err)
				}
			}
		}
		if rfiles, err := os.ReadDir(filepath.Join(sdir, "recycle")); err == nil {
			for _, f := range rfiles {
				if seq, err := strconv.ParseUint(f.Name(), 16, 64); err == nil {
					p.seq = max(p.seq, seq+1)
				}
			}
		}
		if target > 0 {
			p.sizes[size] = true
		}
	}
	return p, nil
}

func (p *pool) enabled() bool { return p.target > 0 }

func (p *pool) start() {
	if !p.enabled() {
		close(p.done)
		return
	}
	p.started = true
	go p.run()
	p.poke()
}

func (p *pool) stop() {
	p.stopOnce.Do(func() {
		close(p.quit)
		if p.started {
			<-p.done
		}
	})
}

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// want asks the filler to keep files of chunk size size ready.
func (p *pool) want(size int64) {
	if !p.enabled() {
		return
	}
	p.mu.Lock()
	newSize := !p.sizes[size]
	p.sizes[size] = true
	p.mu.Unlock()
	if newSize {
		p.poke()
	}
}

// take moves a ready file of chunk size size to dst. ok is false if no file
// of that size is ready (the caller creates one).
func (p *pool) take(size int64, dst string) (ok bool, err error) {
	for {
		p.mu.Lock()
		files := p.ready[size]
		if len(files) == 0 {
			p.mu.Unlock()
			return false, nil
		}
		src := files[len(files)-1]
		p.ready[size] = files[:len(files)-1]
		p.mu.Unlock()
		p.poke()
		err := os.Rename(src, dst)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed behind our back; try the next one
		}
		if err != nil {
			return false, ioError("rename "+src, err)
		}
		return true, nil
	}
}

// readyCount reports the ready files of a chunk size (tests, metrics).
func (p *pool) readyCount(size int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready[size])
}

// recycle moves the file of a deleted chunk into the pool's recycle area, or
// unlinks it when the pool is disabled. It only renames: the filler zeroes
// the file later, off the caller's path.
func (p *pool) recycle(size int64, path string) error {
	if !p.enabled() {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return ioError("remove "+path, err)
		}
		return nil
	}
	rdir := filepath.Join(p.sizeDir(size), "recycle")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return ioError("mkdir "+rdir, err)
	}
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.mu.Unlock()
	dst := filepath.Join(rdir, fmt.Sprintf("%016x", seq))
	if err := os.Rename(path, dst); err != nil {
		return ioError("rename "+path, err)
	}
	p.poke()
	return nil
}

// syncRecycle makes the renames into recycle/ of chunk size size durable
// (and recycle/ itself, created by the first of them).
func (p *pool) syncRecycle(size int64) error {
	if !p.enabled() {
		return nil
	}
	if err := syncDir(filepath.Join(p.sizeDir(size), "recycle")); err != nil {
		return err
	}
	return syncDir(p.sizeDir(size))
}

func (p *pool) sizeDir(size int64) string {
	return filepath.Join(p.dir, strconv.FormatInt(size, 10))
}

// run is the filler goroutine.
func (p *pool) run() {
	defer close(p.done)
	var lastWarn time.Time
	// A periodic pass retries after a failure (a disk that was full).
	retry := time.NewTicker(10 * time.Second)
	defer retry.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-p.kick:
		case <-retry.C:
		}
		if err := p.fill(); err != nil {
			// At most one warning every 10 s: a full disk fails every kick.
			if now := time.Now(); now.Sub(lastWarn) >= 10*time.Second {
				p.s.log.Warn("chunk pool fill failed", "err", err)
				lastWarn = now
			}
		}
	}
}

// fill recycles deleted chunk files and tops every wanted size up to target.
func (p *pool) fill() error {
	p.mu.Lock()
	sizes := make([]int64, 0, len(p.sizes))
	for sz := range p.sizes {
		sizes = append(sizes, sz)
	}
	p.mu.Unlock()
	for _, size := range sizes {
		sdir := p.sizeDir(size)
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			return ioError("mkdir "+sdir, err)
		}
		added := 0
		// 1. Recycled files: zero them and make them ready, up to twice the
		// target; unlink the rest.
		rdir := filepath.Join(sdir, "recycle")
		rfiles, _ := os.ReadDir(rdir)
		for _, f := range rfiles {
			if p.stopping() {
				return nil
			}
			src := filepath.Join(rdir, f.Name())
			if p.readyCount(size) >= 2*p.target {
				os.Remove(src)
				continue
			}
			if err := p.prepare(src, sdir, size, false); err != nil {
				os.Remove(src)
				return err
			}
			added++
		}
		// 2. New files up to target.
		for p.readyCount(size) < p.target {
			if p.stopping() {
				return nil
			}
			p.mu.Lock()
			seq := p.seq
			p.seq++
			p.mu.Unlock()
			tmp := filepath.Join(sdir, fmt.Sprintf("tmp-%016x", seq))
			if err := p.prepare(tmp, sdir, size, true); err != nil {
				os.Remove(tmp)
				return err
			}
			added++
		}
		if added > 0 {
			if err := syncDir(sdir); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *pool) stopping() bool {
	select {
	case <-p.quit:
		return true
	default:
		return false
	}
}

// prepare makes src a zeroed, preallocated, fsynced file of size bytes and
// renames it to a fresh ready name in sdir, its size directory.
func (p *pool) prepare(src, sdir string, size int64, create bool) error {
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if create {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	fd, err := unix.Open(src, flags, 0o644)
	if err != nil {
		return ioError("open "+src, err)
	}
	defer unix.Close(fd)
	if !create {
		// Drop the old data: punch the whole file, then cut it to size.
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 1<<62); err != nil {
			if err := unix.Ftruncate(fd, 0); err != nil {
				return ioError("truncate "+src, err)
			}
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			return ioError("truncate "+src, err)
		}
	}
	if err := preallocate(fd, size); err != nil {
		return fmt.Errorf("preallocate %s: %w", src, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return ioError("fsync "+src, err)
	}
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.mu.Unlock()
	dst := filepath.Join(sdir, fmt.Sprintf("%016x", seq))
	if err := os.Rename(src, dst); err != nil {
		return ioError("rename "+src, err)
	}
	p.mu.Lock()
	p.ready[size] = append(p.ready[size], dst)
	p.mu.Unlock()
	return nil
}

// holdsNoData reports whether the file at path certainly reads as zeros: it
// has no data extents (SEEK_DATA finds none). Any doubt answers false.
func holdsNoData(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	_, err = unix.Seek(fd, 0, unix.SEEK_DATA)
	return errors.Is(err, unix.ENXIO)
}

// preallocate reserves size bytes for fd (reading as zeros), falling back to
// a sparse ftruncate on file systems without fallocate.
func preallocate(fd int, size int64) error {
	err := unix.Fallocate(fd, 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		err = unix.Ftruncate(fd, size)
	}
	if err != nil {
		return ioError("fallocate", err)
	}
	return nil
}
