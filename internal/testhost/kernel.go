package testhost

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// kernel is Debian's kernel package as scripts/fetch-test-kernel leaves it:
// extracted with dpkg-deb -x into DIR/kernel/<package>_<version>, with
// modules.dep made by depmod -b, and DIR/kernel/current pointing at it.
type kernel struct {
	root    string // the extracted package
	vmlinuz string
	release string // e.g. 6.1.0-56-amd64
	modDir  string // root/lib/modules/<release>
}

// findKernel locates the current kernel under cacheDir. A missing kernel is
// reported as a missing part (so tests skip), a broken one as an error.
func findKernel(cacheDir string) (*kernel, []string, error) {
	root := filepath.Join(cacheDir, "kernel", "current")
	images, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return nil, []string{fmt.Sprintf("the test kernel (Debian's linux-image-amd64, extracted in %s)", root)}, nil
	}
	k := &kernel{root: root, vmlinuz: images[0], release: strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")}
	k.modDir = filepath.Join(root, "lib", "modules", k.release)
	if _, err := os.Stat(filepath.Join(k.modDir, "modules.dep")); err != nil {
		return nil, nil, fmt.Errorf("testhost: kernel %s has no modules.dep (run scripts/install-deps again, which runs depmod -b): %w", k.release, err)
	}
	return k, nil, nil
}

// moduleIndex answers which files a set of modules needs, from depmod's output.
type moduleIndex struct {
	path    map[string]string   // module name → path relative to modDir
	deps    map[string][]string // module name → names of the modules it needs
	softdep map[string][]string // module name → names or aliases to load with it
	builtin map[string]bool     // built into the kernel image
	aliases [][2]string         // pattern, module name
}

// moduleName turns "kernel/drivers/block/nbd.ko" or "crc32c-intel" into the
// name the kernel uses ("nbd", "crc32c_intel").
func moduleName(s string) string {
	s = path.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz", ".ko"} {
		s = strings.TrimSuffix(s, ext)
	}
	return strings.ReplaceAll(s, "-", "_")
}

func loadModuleIndex(modDir string) (*moduleIndex, error) {
	ix := &moduleIndex{path: map[string]string{}, deps: map[string][]string{}, softdep: map[string][]string{}, builtin: map[string]bool{}}
	err := eachLine(filepath.Join(modDir, "modules.dep"), func(line string) {
		file, deps, ok := strings.Cut(line, ":")
		if !ok {
			return
		}
		name := moduleName(file)
		ix.path[name] = file
		for _, d := range strings.Fields(deps) {
			ix.deps[name] = append(ix.deps[name], moduleName(d))
		}
	})
	if err != nil {
		return nil, err
	}
	err = eachLine(filepath.Join(modDir, "modules.builtin"), func(line string) { ix.builtin[moduleName(line)] = true })
	if err != nil {
		return nil, err
	}
	// "softdep ext4 pre: crypto-crc32c": ext4 wants crc32c loaded first (the
	// kernel asks for it at mount time, and metadata checksums fail without it).
	err = eachLine(filepath.Join(modDir, "modules.softdep"), func(line string) {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "softdep" {
			return
		}
		name := moduleName(f[1])
		for _, w := range f[2:] {
			if !strings.HasSuffix(w, ":") {
				ix.softdep[name] = append(ix.softdep[name], w)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	err = eachLine(filepath.Join(modDir, "modules.alias"), func(line string) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "alias" {
			ix.aliases = append(ix.aliases, [2]string{f[1], moduleName(f[2])})
		}
	})
	return ix, err
}

// resolve returns the module names a name or alias stands for.
func (ix *moduleIndex) resolve(nameOrAlias string) []string {
	if n := moduleName(nameOrAlias); ix.path[n] != "" || ix.builtin[n] {
		return []string{n}
	}
	var out []string
	for _, a := range ix.aliases {
		if ok, _ := path.Match(a[0], nameOrAlias); ok {
			out = append(out, a[1])
		}
	}
	return out
}

// closure returns the files (relative to modDir) of the named modules and of
// everything they depend on, hard or soft. Built-in modules need no file.
func (ix *moduleIndex) closure(names []string) ([]string, error) {
	seen := map[string]bool{}
	var files []string
	var visit func(name string)
	visit = func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		if ix.builtin[name] {
			return
		}
		files = append(files, ix.path[name])
		for _, d := range ix.deps[name] {
			visit(d)
		}
		for _, s := range ix.softdep[name] {
			for _, m := range ix.resolve(s) {
				visit(m)
			}
		}
	}
	for _, n := range names {
		name := moduleName(n)
		if ix.path[name] == "" && !ix.builtin[name] {
			return nil, fmt.Errorf("testhost: the test kernel has no module %q", n)
		}
		visit(name)
	}
	return files, nil
}

func eachLine(file string, fn func(string)) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fn(s.Text())
	}
	return s.Err()
}
