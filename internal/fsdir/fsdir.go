// Package fsdir makes directory entries durable.
//
// Creating, renaming or removing a file changes its directory; the change
// survives a power loss only once the directory itself is fsynced (fsync of
// the file does not cover its name, see fsync(2)). The same holds for a new
// directory: its entry is in its parent. Whoever creates a file that must
// survive syncs its directory; whoever creates a directory that must survive
// uses MkdirAll, which syncs the parent of every directory it made.
package fsdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Sync fsyncs the directory dir, making the entries created, renamed or
// removed in it durable.
func Sync(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsdir: sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsdir: sync %s: %w", dir, err)
	}
	return nil
}

// MkdirAll is os.MkdirAll that makes what it created durable: it fsyncs
// each new directory's parent, outermost first, so that once it returns
// every directory on the path survives a power loss. A path that exists
// already costs a stat.
func MkdirAll(path string, perm os.FileMode) error {
	path = filepath.Clean(path)
	// The directories that do not exist yet, innermost first.
	var missing []string
	for p := path; ; {
		_, err := os.Stat(p)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("fsdir: %w", err)
		}
		missing = append(missing, p)
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	if len(missing) == 0 {
		return nil
	}
	if err := os.MkdirAll(path, perm); err != nil {
		return fmt.Errorf("fsdir: %w", err)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := Sync(filepath.Dir(missing[i])); err != nil {
			return err
		}
	}
	return nil
}
