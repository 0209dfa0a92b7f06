package faults

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/api"
)

// 11. A chunkserver's WAL damaged where it had been fdatasynced (bit rot,
// a bad sector): a byte flipped in the middle of an acknowledged record,
// with later batches after it. On restart the chunkserver must refuse to
// start (exit 1, saying why and what to do), not cut the log there and vote
// with a log that lost acknowledged entries; the cluster keeps serving and
// re-replicates the victim's copysets on the spare.
func TestCorruptWAL(t *testing.T) {
	f := start(t, testcluster.Options{Chunkservers: 4,
		MDSFlags: []string{"--recovery-grace=3s", "--schedule-interval=1s"}})
	f.run(testcluster.WorkloadOptions{Seed: 11})
	victim := f.c.FewestLeaders()
	id := f.c.IDOf(victim)
	f.fault("stop %s, flip a byte of a synced record of its WAL, restart it", victim)
	f.c.Stop(victim)
	seg, off := damageSyncedRecord(t, filepath.Join(victim.DataDir, "wal"))
	t.Logf("flipped the byte at offset %d of %s", off, seg)
	damaged, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	f.c.Start(victim)

	deadline := time.Now().Add(60 * time.Second)
	code, exited := victim.ExitCode()
	for ; !exited; code, exited = victim.ExitCode() {
		if time.Now().After(deadline) {
			t.Fatalf("%s still runs 60 s after it was restarted on a corrupt WAL; log tail:\n%s", victim, logTail(victim, 100))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != 1 {
		t.Fatalf("%s exited with %d, want 1; log tail:\n%s", victim, code, logTail(victim, 100))
	}
	for _, want := range []string{"refusing to start: the WAL at " + filepath.Join(victim.DataDir, "wal") + " cannot be trusted",
		"the MDS will re-replicate its copysets", "aside to rejoin empty"} {
		if f.c.CountLog(victim, want) == 0 {
			t.Fatalf("%s's log does not say %q; tail:\n%s", victim, want, logTail(victim, 100))
		}
	}
	if after, _ := os.ReadFile(seg); !bytes.Equal(after, damaged) {
		t.Fatalf("the refused chunkserver changed %s", seg)
	}

	f.progress(30*time.Second, "after a chunkserver refused to start")
	f.c.Eventually(240*time.Second, "every copyset re-replicated without the refused chunkserver", func(ctx context.Context) error {
		st, err := f.c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		left := 0
		for _, cs := range st.Copysets {
			if containsID(cs.Members, id) {
				left++
			}
		}
		if left > 0 || st.CopysetsHealthy != uint32(len(st.Copysets)) {
			return fmt.Errorf("%d copysets still list chunkserver %d; %d/%d healthy", left, id, st.CopysetsHealthy, len(st.Copysets))
		}
		return nil
	})
	f.healed()
	fig := f.finish("the victim refused to start on its corrupt WAL; its copysets re-replicated on the spare")
	if fig.Failed != 0 {
		t.Fatalf("%d IOs failed", fig.Failed)
	}
}

// damageSyncedRecord flips a byte in the middle of an entries record of the
// newest WAL segment in dir that has one followed by a batch whose durable
// mark lies beyond it (so the record was fdatasynced: see internal/wal's
// doc.go for the format). It returns the segment's path and the offset.
func damageSyncedRecord(t *testing.T, dir string) (string, int) {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no WAL segments in %s: %v", dir, err)
	}
	slices.Sort(names)
	le := binary.LittleEndian
	for i := len(names) - 1; i >= 0; i-- {
		b, err := os.ReadFile(names[i])
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 16 || string(b[:4]) != "BWAL" || le.Uint32(b[4:]) != 4 {
			t.Fatalf("%s: not a version 4 segment", names[i])
		}
		seq, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(names[i]), ".wal"), 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		tag := uint32(seq) | 1<<31
		var entries []int // offsets of the bytes to flip, one per entries record
		var marks []int   // the durable marks of the batch records, in order
		var markAt []int  // where those batch records are
		for off := 16; off+13 <= len(b); {
			n := int(le.Uint32(b[off:]))
			if n == 0 || le.Uint32(b[off+8:]) != tag || off+12+n > len(b) {
				break
			}
			switch b[off+12] {
			case 1: // entries
				if n >= 256 {
					entries = append(entries, off+12+n/2)
				}
			case 6: // batch: mark u64
				marks = append(marks, int(le.Uint64(b[off+13:])))
				markAt = append(markAt, off)
			}
			off += 12 + n
		}
		for _, at := range entries {
			for j, m := range marks {
				if markAt[j] > at && m > at {
					b[at] ^= 0x40
					if err := os.WriteFile(names[i], b, 0o644); err != nil {
						t.Fatal(err)
					}
					return names[i], at
				}
			}
		}
	}
	t.Fatalf("no synced entries record with a later batch in %s", dir)
	return "", 0
}

// logTail returns the last n lines of p's log.
func logTail(p *testcluster.Proc, n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
