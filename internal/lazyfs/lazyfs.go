// Package lazyfs is a FUSE file system for power-loss tests (the approach of
// Jepsen's lazyfs): it passes every operation through to a backing directory,
// and remembers what a power cut would lose — everything not made durable by
// an fsync — so that Cut can take it back.
//
// What it models (stricter than ext4, as POSIX allows):
//   - File data: a write, truncate or fallocate is durable once the file is
//     fsynced (fsync or fdatasync, through any descriptor). Before that, Cut
//     restores the bytes the file held at its last fsync and its size then.
//     The old bytes are kept in memory (an undo log) when a range is first
//     changed after a sync.
//   - Directory entries: a create, mkdir, unlink, rmdir or rename is durable
//     once a directory it changed is fsynced. Before that, Cut undoes it, in
//     reverse order: created names are removed, unlinked files come back (they
//     are kept aside until then), renames are reversed. An fsync of a file
//     does not make its name durable. A durable rmdir makes the changes
//     inside that directory durable too (it had to be empty).
//   - A full disk (SetFull): while it is set, every write, fallocate and
//     truncate that grows a file, and every create and mkdir, fails with
//     ENOSPC and changes nothing; reads, fsyncs, hole punches, unlinks and
//     renames go on.
//   - Not modelled: reordering among unsynced writes (a cut keeps none of
//     them, never a subset), torn sectors, metadata other than size (modes,
//     times, xattrs), hard links and symlinks (passed through, never undone).
//
// Cut must be called with the file system unmounted (the processes using it
// killed first): it edits the backing directory directly, and the kernel's
// cache of the mount would otherwise hide the change.
package lazyfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FS is one lazyfs instance over a backing directory.
type FS struct {
	backing string // the directory passed through
	trash   string // unlinked files kept until a cut or their directory's sync

	full atomic.Bool // SetFull: writes fail with ENOSPC

	mu     sync.Mutex
	files  map[uint64]*fileUndo // by backing inode number
	ns     []nsOp               // directory changes not yet durable, in order
	nTrash int
	server *fuse.Server
	mnt    string
}

type fileUndo struct {
	size int64 // the size at the last sync
	undo []span
}

type span struct {
	off  int64
	data []byte
}

type nsKind int

const (
	nsCreate nsKind = iota // path created (file or directory)
	nsUnlink               // path's file moved to trash
	nsRmdir                // empty directory path removed
	nsRename               // path → path2; if trash != "", path2's old file kept there
)

type nsOp struct {
	kind        nsKind
	path, path2 string // relative to backing
	trash       string
	dirs        []uint64 // the inodes of the directories it changed
}

// New makes a lazyfs over backing (created if missing); unlinked files wait
// in backing+".trash".
func New(backing string) (*FS, error) {
	for _, d := range []string{backing, backing + ".trash"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return &FS{backing: backing, trash: backing + ".trash", files: map[uint64]*fileUndo{}}, nil
}

// Mount mounts the file system at dir (which must exist).
func (z *FS) Mount(dir string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(z.backing, &st); err != nil {
		return err
	}
	root := &fs.LoopbackRoot{Path: z.backing, Dev: uint64(st.Dev)}
	//lint:ignore SA1019 NewNode is the simplest way to make every node ours; it still works
	root.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, z: z}
	}
	//lint:ignore SA1019 as above
	rn := root.NewNode(root, nil, "", &st)
	root.RootNode = rn
	sec := time.Second
	srv, err := fs.Mount(dir, rn, &fs.Options{EntryTimeout: &sec, AttrTimeout: &sec,
		MountOptions: fuse.MountOptions{FsName: "lazyfs", Name: "lazyfs", DirectMount: true, AllowOther: os.Geteuid() == 0}})
	if err != nil {
		return err
	}
	z.server, z.mnt = srv, dir
	return nil
}

// Unmount unmounts it, retrying while the mount is busy (up to 30 s), then
// detaching it lazily.
func (z *FS) Unmount() error {
	if z.server == nil {
		return nil
	}
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = z.server.Unmount(); err == nil {
			z.server.Wait()
			z.server = nil
			return nil
		}
	}
	_ = syscall.Unmount(z.mnt, syscall.MNT_DETACH)
	z.server = nil
	return fmt.Errorf("lazyfs: unmount %s: %w (detached)", z.mnt, err)
}

// SetFull makes the file system full (or no longer full): while it is,
// every write, fallocate and growing truncate, and every create and mkdir,
// fails with ENOSPC and changes nothing, as on a disk with no free block.
// It may be called while mounted.
func (z *FS) SetFull(full bool) { z.full.Store(full) }

// noSpace is ENOSPC while the file system is full.
func (z *FS) noSpace() syscall.Errno {
	if z.full.Load() {
		return syscall.ENOSPC
	}
	return 0
}

// Sync makes everything durable (as a sync(2) would): the undo state is
// dropped and the trash emptied.
func (z *FS) Sync() {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.files = map[uint64]*fileUndo{}
	z.ns = nil
	os.RemoveAll(z.trash)
	os.MkdirAll(z.trash, 0o755)
}

// Cut is the power cut: every change not made durable is taken back. The
// file system must be unmounted. It returns how many files had their data
// rolled back and how many directory changes were undone.
func (z *FS) Cut() (files, entries int, err error) {
	if z.server != nil {
		return 0, 0, fmt.Errorf("lazyfs: Cut while mounted")
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	var errs []error
	// Directory changes first, newest first.
	for i := len(z.ns) - 1; i >= 0; i-- {
		op := z.ns[i]
		p, p2 := filepath.Join(z.backing, op.path), filepath.Join(z.backing, op.path2)
		var e error
		switch op.kind {
		case nsCreate:
			e = os.RemoveAll(p)
		case nsUnlink:
			e = os.Rename(op.trash, p)
		case nsRmdir:
			e = os.Mkdir(p, 0o755)
		case nsRename:
			if e = os.Rename(p2, p); e == nil && op.trash != "" {
				e = os.Rename(op.trash, p2)
			}
		}
		if e != nil {
			errs = append(errs, e)
		}
		entries++
	}
	z.ns = nil
	// Then file data, found by inode number.
	paths := map[uint64]string{}
	filepath.Walk(z.backing, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			paths[info.Sys().(*syscall.Stat_t).Ino] = p
		}
		return nil
	})
	for ino, fu := range z.files {
		p, ok := paths[ino]
		if !ok {
			continue // its name was not durable: gone with it
		}
		f, e := os.OpenFile(p, os.O_WRONLY, 0)
		if e != nil {
			errs = append(errs, e)
			continue
		}
		for i := len(fu.undo) - 1; i >= 0; i-- {
			if _, e := f.WriteAt(fu.undo[i].data, fu.undo[i].off); e != nil {
				errs = append(errs, e)
			}
		}
		if e := f.Truncate(fu.size); e != nil {
			errs = append(errs, e)
		}
		f.Close()
		files++
	}
	z.files = map[uint64]*fileUndo{}
	os.RemoveAll(z.trash)
	os.MkdirAll(z.trash, 0o755)
	if len(errs) > 0 {
		return files, entries, fmt.Errorf("lazyfs: cut: %d errors, first %w", len(errs), errs[0])
	}
	return files, entries, nil
}

// Pending returns how many files have unsynced data and how many directory
// changes are not durable.
func (z *FS) Pending() (files, entries int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	return len(z.files), len(z.ns)
}

// saveRange records, before fd's bytes [off, off+n) change, what they were
// (if the file was not changed since its last sync, also its size).
func (z *FS) saveRange(fd int, off, n int64) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	fu := z.files[st.Ino]
	if fu == nil {
		fu = &fileUndo{size: st.Size}
		z.files[st.Ino] = fu
	}
	end := min(off+n, st.Size)
	if off >= end || off >= fu.size {
		return 0 // beyond the synced size: the truncate to it takes it back
	}
	end = min(end, fu.size)
	buf := make([]byte, end-off)
	// Read through a descriptor of our own: fd may be write-only or O_DIRECT.
	rfd, err := syscall.Open(fmt.Sprintf("/proc/self/fd/%d", fd), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fs.ToErrno(err)
	}
	m, err := syscall.Pread(rfd, buf, off)
	syscall.Close(rfd)
	if err != nil {
		return fs.ToErrno(err)
	}
	fu.undo = append(fu.undo, span{off: off, data: buf[:m]})
	return 0
}

// growNoSpace is ENOSPC while the file system is full and a truncate of the
// file at p to size would grow it.
func (z *FS) growNoSpace(p string, size int64) syscall.Errno {
	if !z.full.Load() {
		return 0
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return fs.ToErrno(err)
	}
	if size > st.Size {
		return syscall.ENOSPC
	}
	return 0
}

func (z *FS) synced(fd int) {
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil {
		return
	}
	z.mu.Lock()
	delete(z.files, st.Ino)
	z.mu.Unlock()
}

func (z *FS) dirSynced(ino uint64) {
	z.mu.Lock()
	defer z.mu.Unlock()
	durable := make([]bool, len(z.ns))
	var gone []string // directories whose removal is now durable
	for i, op := range z.ns {
		for _, d := range op.dirs {
			durable[i] = durable[i] || d == ino
		}
		if durable[i] && op.kind == nsRmdir {
			gone = append(gone, op.path+string(filepath.Separator))
		}
	}
	// A directory durably removed durably lost what it held: the changes
	// made inside it (before its rmdir, which needs it empty) are durable
	// too, or a cut would try to put back a file into a directory that is no
	// longer there.
	for i, op := range z.ns {
		for _, g := range gone {
			durable[i] = durable[i] || strings.HasPrefix(op.path, g)
		}
	}
	kept := z.ns[:0]
	for i, op := range z.ns {
		switch {
		case !durable[i]:
			kept = append(kept, op)
		case op.trash != "":
			os.RemoveAll(op.trash)
		}
	}
	z.ns = kept
}

func (z *FS) rel(p string) string {
	r, err := filepath.Rel(z.backing, p)
	if err != nil {
		return p
	}
	return r
}

func (z *FS) addNS(op nsOp) {
	z.mu.Lock()
	z.ns = append(z.ns, op)
	z.mu.Unlock()
}

// toTrash moves p aside, returning where.
func (z *FS) toTrash(p string) (string, error) {
	z.mu.Lock()
	z.nTrash++
	t := filepath.Join(z.trash, fmt.Sprint(z.nTrash))
	z.mu.Unlock()
	return t, os.Rename(p, t)
}

func ino(p string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(p, &st) != nil {
		return 0
	}
	return st.Ino
}

// node is a loopback node that records directory changes and hands out
// recording file handles.
type node struct {
	fs.LoopbackNode
	z *FS
}

func (n *node) dir() string {
	return filepath.Join(n.RootData.Path, n.Path(n.Root()))
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p := filepath.Join(n.dir(), name)
	_, existed := os.Lstat(p)
	if existed != nil {
		if errno := n.z.noSpace(); errno != 0 {
			return nil, nil, 0, errno
		}
	}
	in, fh, ff, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return in, fh, ff, errno
	}
	if existed != nil {
		n.z.addNS(nsOp{kind: nsCreate, path: n.z.rel(p), dirs: []uint64{ino(n.dir())}})
	}
	return in, n.z.wrap(fh), ff, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		fd, err := syscall.Open(n.dir(), syscall.O_RDONLY, 0)
		if err != nil {
			return nil, 0, fs.ToErrno(err)
		}
		errno := n.z.saveRange(fd, 0, 1<<62)
		syscall.Close(fd)
		if errno != 0 {
			return nil, 0, errno
		}
	}
	fh, ff, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return fh, ff, errno
	}
	return n.z.wrap(fh), ff, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.z.noSpace(); errno != 0 {
		return nil, errno
	}
	in, errno := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	if errno == 0 {
		n.z.addNS(nsOp{kind: nsCreate, path: n.z.rel(filepath.Join(n.dir(), name)), dirs: []uint64{ino(n.dir())}})
	}
	return in, errno
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	errno := n.LoopbackNode.Rmdir(ctx, name)
	if errno == 0 {
		n.z.addNS(nsOp{kind: nsRmdir, path: n.z.rel(filepath.Join(n.dir(), name)), dirs: []uint64{ino(n.dir())}})
	}
	return errno
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	p := filepath.Join(n.dir(), name)
	t, err := n.z.toTrash(p)
	if err != nil {
		return fs.ToErrno(err)
	}
	n.z.addNS(nsOp{kind: nsUnlink, path: n.z.rel(p), trash: t, dirs: []uint64{ino(n.dir())}})
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok || flags != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE/NOREPLACE: not modelled
	}
	p1, p2 := filepath.Join(n.dir(), name), filepath.Join(np.dir(), newName)
	if _, err := os.Lstat(p1); err != nil {
		return fs.ToErrno(err)
	}
	op := nsOp{kind: nsRename, path: n.z.rel(p1), path2: n.z.rel(p2), dirs: []uint64{ino(n.dir()), ino(np.dir())}}
	if st, err := os.Lstat(p2); err == nil {
		if st.IsDir() {
			if err := syscall.Rename(p1, p2); err != nil { // must be empty: nothing to keep
				return fs.ToErrno(err)
			}
			n.z.addNS(op)
			return 0
		}
		t, err := n.z.toTrash(p2)
		if err != nil {
			return fs.ToErrno(err)
		}
		op.trash = t
	}
	if err := syscall.Rename(p1, p2); err != nil {
		if op.trash != "" {
			os.Rename(op.trash, p2)
		}
		return fs.ToErrno(err)
	}
	n.z.addNS(op)
	return 0
}

// OpendirHandle wraps the loopback's directory stream so that its fsync
// makes the directory's changes durable.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, ff, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return fh, ff, errno
	}
	return &dirHandle{ds: fh, n: n}, ff, 0
}

type dirStream interface {
	fs.FileReaddirenter
	fs.FileReleasedirer
	fs.FileSeekdirer
	fs.FileFsyncdirer
}

type dirHandle struct {
	ds fs.FileHandle
	n  *node
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.ds.(dirStream).Readdirent(ctx)
}
func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.ds.(dirStream).Releasedir(ctx, flags)
}
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.ds.(dirStream).Seekdir(ctx, off)
}
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	if errno := d.ds.(dirStream).Fsyncdir(ctx, flags); errno != 0 {
		return errno
	}
	d.n.z.dirSynced(ino(d.n.dir()))
	return 0
}

// Fsync of a file, or of a directory without a handle.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if lf, ok := f.(*file); ok {
		return lf.Fsync(ctx, flags)
	}
	n.z.dirSynced(ino(n.dir()))
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if errno := n.z.growNoSpace(n.dir(), int64(sz)); errno != 0 {
			return errno
		}
		fd, err := syscall.Open(n.dir(), syscall.O_RDONLY, 0)
		if err != nil {
			return fs.ToErrno(err)
		}
		errno := n.z.saveRange(fd, int64(sz), 1<<62)
		syscall.Close(fd)
		if errno != 0 {
			return errno
		}
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

// file is a file handle that records what its writes change.
type file struct {
	fs.FileHandle
	z  *FS
	fd int
}

type fder interface{ PassthroughFd() (int, bool) }

func (z *FS) wrap(fh fs.FileHandle) fs.FileHandle {
	fd, _ := fh.(fder).PassthroughFd()
	return &file{FileHandle: fh, z: z, fd: fd}
}

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return f.FileHandle.(fs.FileReader).Read(ctx, buf, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.z.noSpace(); errno != 0 {
		return 0, errno
	}
	if errno := f.z.saveRange(f.fd, off, int64(len(data))); errno != 0 {
		return 0, errno
	}
	return f.FileHandle.(fs.FileWriter).Write(ctx, data, off)
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if errno := f.FileHandle.(fs.FileFsyncer).Fsync(ctx, flags); errno != 0 {
		return errno
	}
	f.z.synced(f.fd)
	return 0
}

func (f *file) Flush(ctx context.Context) syscall.Errno {
	return f.FileHandle.(fs.FileFlusher).Flush(ctx)
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	return f.FileHandle.(fs.FileReleaser).Release(ctx)
}

func (f *file) Getattr(ctx context.Context, a *fuse.AttrOut) syscall.Errno {
	return f.FileHandle.(fs.FileGetattrer).Getattr(ctx, a)
}

func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return f.FileHandle.(fs.FileLseeker).Lseek(ctx, off, whence)
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if errno := f.z.growNoSpace(fmt.Sprintf("/proc/self/fd/%d", f.fd), int64(sz)); errno != 0 {
			return errno
		}
		if errno := f.z.saveRange(f.fd, int64(sz), 1<<62); errno != 0 {
			return errno
		}
	}
	return f.FileHandle.(fs.FileSetattrer).Setattr(ctx, in, out)
}

func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode&unix.FALLOC_FL_PUNCH_HOLE == 0 { // punching a hole frees space
		if errno := f.z.noSpace(); errno != 0 {
			return errno
		}
	}
	if errno := f.z.saveRange(f.fd, int64(off), int64(size)); errno != 0 {
		return errno
	}
	return f.FileHandle.(fs.FileAllocater).Allocate(ctx, off, size, mode)
}
