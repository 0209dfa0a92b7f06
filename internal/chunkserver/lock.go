package chunkserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrDataDirInUse: another process holds the data directory's lock. Two
// chunkservers on one directory would corrupt each other (each opening the WAL
// cuts what it takes for a torn tail and removes the other's temp files).
var ErrDataDirInUse = errors.New("chunkserver: data directory in use")

// lockDataDir takes an exclusive flock on DataDir/LOCK, held until the returned
// file is closed (or the process dies: the kernel drops it, so kill -9 never
// leaves a stale lock). The holder's pid is written into the file for the error
// message of the next one.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		holder := strings.TrimSpace(string(b))
		if _, perr := strconv.Atoi(holder); perr != nil || holder == "" {
			holder = "unknown"
		}
		return nil, fmt.Errorf("%w: %s is locked by pid %s; stop that chunkserver first", ErrDataDirInUse, dir, holder)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}
