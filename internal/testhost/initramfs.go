package testhost

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// guestInit is the guest's /init: it mounts the kernel file systems, loads the
// modules, brings up the network and runs the agent; when the agent exits it
// syncs, unmounts and powers off.
//
//go:embed init.sh
var guestInit []byte

// baseModules are loaded in every guest: the PCI transport of the virtio
// devices, the command channel's port and the network card.
var baseModules = []string{"virtio_pci", "virtio_console", "virtio_net"}

// toolFiles are files or directories a tool reads that its Debian package
// installs beside it; they go into the guest with the tool.
var toolFiles = map[string][]string{
	"mkfs.ext4":  {"/etc/mke2fs.conf"},
	"mke2fs":     {"/etc/mke2fs.conf"},
	"iscsiadm":   {"/etc/iscsi/iscsid.conf", "/etc/iscsi/initiatorname.iscsi"},
	"iscsid":     {"/etc/iscsi/iscsid.conf", "/etc/iscsi/initiatorname.iscsi"},
	"nvme":       {"/etc/nvme/hostnqn", "/etc/nvme/hostid"},
	"multipath":  {"/lib/multipath"},
	"multipathd": {"/lib/multipath"},
}

// toolPackages names the Debian package of each tool, for the message that
// says what to install.
var toolPackages = map[string]string{
	"busybox": "busybox-static", "kmod": "kmod", "nbd-client": "nbd-client",
	"mkfs.ext4": "e2fsprogs", "mke2fs": "e2fsprogs", "e2fsck": "e2fsprogs", "fio": "fio",
	"nvme": "nvme-cli", "iscsiadm": "open-iscsi", "iscsid": "open-iscsi",
	"multipath": "multipath-tools", "multipathd": "multipath-tools", "dmsetup": "dmsetup",
	"qemu-system-x86_64": "qemu-system-x86",
}

// image is an initramfs being assembled, by guest path (no leading slash).
type image struct {
	entries map[string]entry
	// merged maps the host's top-level symlinks of a merged /usr ("bin" →
	// "usr/bin"); the guest gets the same links, and files go to the real paths.
	merged map[string]string
}

type entry struct {
	mode   uint32 // cpio type bits and permissions
	target string // of a symlink
	src    string // host file with the content of a regular file, or
	data   []byte // the content itself
}

func newImage() *image {
	im := &image{entries: map[string]entry{}, merged: map[string]string{}}
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		if t, err := os.Readlink("/" + d); err == nil && !filepath.IsAbs(t) {
			im.merged[d] = filepath.Clean(t)
			im.link(d, t)
		}
	}
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp", "root", "mnt", "etc/testhost", "var/tmp", "var/lib", "usr/bin", "usr/sbin"} {
		im.dir(d)
	}
	return im
}

// guestPath maps a host path to where it lives in the guest.
func (im *image) guestPath(hostPath string) string {
	p := strings.TrimPrefix(filepath.Clean(hostPath), "/")
	first, rest, _ := strings.Cut(p, "/")
	if t, ok := im.merged[first]; ok {
		return filepath.Join(t, rest)
	}
	return p
}

func (im *image) dir(p string) {
	for d := p; d != "." && d != "/"; d = filepath.Dir(d) {
		if _, ok := im.entries[d]; ok {
			return
		}
		im.entries[d] = entry{mode: cpioModeDir | 0o755}
	}
}

func (im *image) put(p string, e entry) {
	im.dir(filepath.Dir(p))
	im.entries[p] = e
}

func (im *image) link(p, target string) {
	im.put(p, entry{mode: cpioModeSymlink | 0o777, target: target})
}

func (im *image) data(p string, perm uint32, b []byte) {
	im.put(p, entry{mode: cpioModeFile | perm, data: b})
}

// hostFile adds a host file (following symlinks) under its own name.
func (im *image) hostFile(hostPath string) error {
	real, err := filepath.EvalSymlinks(hostPath)
	if err != nil {
		return err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(hostPath))
	if err != nil {
		return err
	}
	im.put(im.guestPath(filepath.Join(dir, filepath.Base(hostPath))), entry{mode: cpioModeFile | uint32(fi.Mode().Perm()), src: real})
	return nil
}

// program adds an executable or shared library with every library ldd says
// it loads.
func (im *image) program(hostPath string) error {
	if err := im.hostFile(hostPath); err != nil {
		return err
	}
	libs, err := ldd(hostPath)
	if err != nil {
		return err
	}
	for _, l := range libs {
		if err := im.hostFile(l); err != nil {
			return fmt.Errorf("library %s of %s: %w", l, hostPath, err)
		}
	}
	return nil
}

// tree adds a file, or a directory with everything in it; shared libraries in
// it bring their own libraries.
func (im *image) tree(hostPath string) error {
	return filepath.WalkDir(hostPath, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			return nil
		case strings.HasSuffix(p, ".so") || strings.Contains(p, ".so."):
			return im.program(p)
		default:
			return im.hostFile(p)
		}
	})
}

// ldd lists the shared libraries a dynamic executable or library loads,
// including the loader itself; a static one loads none.
func ldd(p string) ([]string, error) {
	out, err := exec.Command("ldd", p).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", p, err, out)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && filepath.IsAbs(f[2]):
			libs = append(libs, f[2])
		case len(f) >= 1 && filepath.IsAbs(f[0]):
			libs = append(libs, f[0])
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			return nil, fmt.Errorf("ldd %s: %s is not found on this machine", p, f[0])
		}
	}
	return libs, nil
}

// lookTool finds a program on PATH or in the sbin directories, which PATH
// often lacks for a user who is not root.
func lookTool(name string) string {
	dirs := append(filepath.SplitList(os.Getenv("PATH")), "/usr/local/sbin", "/usr/sbin", "/sbin")
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// assemble lays out the guest: the named tools with their libraries and files,
// kmod for modprobe, busybox for everything else, the modules with their
// dependencies and depmod's index, the agent and /init. It returns the parts
// missing on this machine instead of failing, so tests can skip naming them.
func assemble(cfg Config, k *kernel, agent string) (im *image, missing []string, err error) {
	im = newImage()
	found := map[string]string{}
	for _, t := range append([]string{"kmod", "busybox"}, cfg.Tools...) {
		if filepath.IsAbs(t) {
			if fi, err := os.Stat(t); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				found[t] = t
			} else {
				missing = append(missing, t)
			}
			continue
		}
		if p := lookTool(t); p != "" {
			found[t] = p
			continue
		}
		if pkg := toolPackages[t]; pkg != "" {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", t, pkg))
		} else {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return nil, missing, nil
	}
	for _, t := range cfg.Tools {
		if err := im.program(found[t]); err != nil {
			return nil, nil, err
		}
		for _, f := range toolFiles[t] {
			if _, err := os.Stat(f); err != nil {
				continue // optional: e.g. /etc/nvme/hostid exists only where nvme-cli made one
			}
			if err := im.tree(f); err != nil {
				return nil, nil, err
			}
		}
	}
	if err := im.program(found["kmod"]); err != nil {
		return nil, nil, err
	}
	kmod := "/" + im.guestPath(found["kmod"])
	for _, name := range []string{"modprobe", "insmod", "rmmod", "lsmod", "modinfo", "depmod"} {
		im.link(im.guestPath("/sbin/"+name), kmod)
	}
	// busybox last: its applets fill only the names nothing else took.
	if err := im.program(found["busybox"]); err != nil {
		return nil, nil, err
	}
	applets, err := exec.Command(found["busybox"], "--list-full").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("busybox --list-full: %v", err)
	}
	bb := "/" + im.guestPath(found["busybox"])
	for _, a := range strings.Fields(string(applets)) {
		if p := im.guestPath("/" + a); im.entries[p].mode == 0 {
			im.link(p, bb)
		}
	}

	ix, err := loadModuleIndex(k.modDir)
	if err != nil {
		return nil, nil, fmt.Errorf("testhost: reading the modules of kernel %s: %w", k.release, err)
	}
	modules := append(slices.Clone(baseModules), cfg.Modules...)
	files, err := ix.closure(modules)
	if err != nil {
		return nil, nil, err
	}
	guestModDir := im.guestPath("/lib/modules/" + k.release)
	index, _ := filepath.Glob(filepath.Join(k.modDir, "modules.*"))
	for _, f := range index {
		files = append(files, filepath.Base(f))
	}
	for _, f := range files {
		im.put(filepath.Join(guestModDir, f), entry{mode: cpioModeFile | 0o644, src: filepath.Join(k.modDir, f)})
	}
	im.data("etc/testhost/modules", 0o644, []byte(strings.Join(modules, "\n")+"\n"))

	im.put(im.guestPath("/sbin/testhost-agent"), entry{mode: cpioModeFile | 0o755, src: agent})
	im.data("init", 0o755, guestInit)
	im.data("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	im.data("etc/group", 0o644, []byte("root:x:0:\n"))
	im.link("etc/mtab", "/proc/self/mounts")
	return im, nil, nil
}

// key hashes every entry, content included: the same guest gives the same key.
func (im *image) key() (string, error) {
	h := sha256.New()
	for _, p := range slices.Sorted(maps.Keys(im.entries)) {
		e := im.entries[p]
		fmt.Fprintf(h, "%s\x00%o\x00%s\x00", p, e.mode, e.target)
		switch {
		case e.src != "":
			f, err := os.Open(e.src)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		default:
			h.Write(e.data)
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

// write writes the image as a newc cpio archive, parents before children.
func (im *image) write(w io.Writer) error {
	c := newCpioWriter(w)
	for _, p := range slices.Sorted(maps.Keys(im.entries)) {
		e := im.entries[p]
		var err error
		switch {
		case e.mode&0o170000 == cpioModeDir:
			err = c.dir(p, e.mode&0o7777)
		case e.mode&0o170000 == cpioModeSymlink:
			err = c.symlink(p, e.target)
		case e.src != "":
			err = c.hostFile(p, e.mode&0o7777, e.src)
		default:
			err = c.file(p, e.mode&0o7777, bytes.NewReader(e.data), int64(len(e.data)))
		}
		if err != nil {
			return fmt.Errorf("initramfs entry %s: %w", p, err)
		}
	}
	return c.close()
}

// cached returns the path of the image's archive in dir, writing it first if
// no archive with the same key is there, and whether it was there.
func (im *image) cached(dir string) (path string, hit bool, err error) {
	key, err := im.key()
	if err != nil {
		return "", false, err
	}
	path = filepath.Join(dir, "initramfs-"+key+".cpio")
	now := time.Now()
	if err := os.Chtimes(path, now, now); err == nil { // mark it used, for pruning
		return path, true, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	tmp, err := os.CreateTemp(dir, ".initramfs-*.tmp")
	if err != nil {
		return "", false, err
	}
	defer os.Remove(tmp.Name())
	if err := im.write(tmp); err != nil {
		tmp.Close()
		return "", false, err
	}
	if err := tmp.Close(); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", false, err
	}
	pruneCache(dir, keepImages)
	return path, false, nil
}

// keepImages is how many initramfs archives the cache keeps (the most recently used).
const keepImages = 6

func pruneCache(dir string, keep int) {
	files, _ := filepath.Glob(filepath.Join(dir, "initramfs-*.cpio"))
	type aged struct {
		path string
		mod  time.Time
	}
	var all []aged
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			all = append(all, aged{f, fi.ModTime()})
		}
	}
	slices.SortFunc(all, func(a, b aged) int { return b.mod.Compare(a.mod) })
	for i := keep; i < len(all); i++ {
		os.Remove(all[i].path)
	}
}
