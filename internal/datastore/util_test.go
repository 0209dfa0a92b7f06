package datastore

import (
	"hash/crc32"
	"log/slog"
	"os"
	"syscall"
	"testing"
)

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// quietLog keeps test output readable.
var quietLog = slog.New(slog.DiscardHandler)
