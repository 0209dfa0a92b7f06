package chunkserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/internal/raftnet"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

func TestIDFile(t *testing.T) {
	dir := t.TempDir()
	if id, err := readID(dir); id != 0 || err != nil {
		t.Fatalf("empty dir: %d %v", id, err)
	}
	if err := writeID(dir, 12345); err != nil {
		t.Fatal(err)
	}
	if id, err := readID(dir); id != 12345 || err != nil {
		t.Fatalf("read back: %d %v", id, err)
	}
	if _, err := os.Stat(filepath.Join(dir, idFileName+".tmp")); !os.IsNotExist(err) {
		t.Fatal("temp file left behind")
	}
	for _, bad := range []string{"", "0\n", "abc\n", "-1"} {
		os.WriteFile(filepath.Join(dir, idFileName), []byte(bad), 0o644)
		if _, err := readID(dir); !errors.Is(err, ErrIdentity) {
			t.Errorf("id file %q: %v", bad, err)
		}
		if _, err := New(Config{DataDir: dir, MDS: []string{"127.0.0.1:1"}}); !errors.Is(err, ErrIdentity) {
			t.Errorf("New with id file %q: %v", bad, err)
		}
	}
}

func TestNewConfig(t *testing.T) {
	if _, err := New(Config{MDS: []string{"x"}}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no data dir: %v", err)
	}
	if _, err := New(Config{DataDir: t.TempDir()}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no MDS: %v", err)
	}
}

// Run waits for an unreachable MDS and still stops cleanly (and releases the
// data directory: a second chunkserver can open it afterwards).
func TestRunStopsWithoutMDS(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, MDS: []string{testutil.FreeAddr(t)}, Logger: testLogger(t), PreallocChunks: -1}
	cs, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := cs.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := time.Since(start); d > 60*time.Second {
		t.Fatalf("Run took %v to stop", d)
	}
	if err := cs.Run(context.Background()); !errors.Is(err, ErrAlreadyRan) {
		t.Fatalf("second Run: %v", err)
	}
	cs2, err := New(cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := cs2.Run(ctx2); err != nil {
		t.Fatal(err)
	}
}

// The heartbeat's disk state and the wire status of every kind of outcome:
// the mapping of raftstore's typed errors happens in statusOf alone.
func TestDiskStateAndStatus(t *testing.T) {
	full := raftstore.DiskFailure(fmt.Errorf("apply: %w: write: %w", datastore.ErrNoSpace, unix.ENOSPC))
	broken := raftstore.DiskFailure(fmt.Errorf("apply: %w: write: %w", datastore.ErrIO, unix.EIO))
	walFull := raftstore.DiskFailure(fmt.Errorf("wal: write failed: %w", unix.EDQUOT))
	for err, want := range map[error]api.DiskState{
		nil: api.DiskState_DISK_STATE_OK, full: api.DiskState_DISK_STATE_FULL,
		walFull: api.DiskState_DISK_STATE_FULL, broken: api.DiskState_DISK_STATE_IO_ERROR,
	} {
		if got := diskStateOf(err); got != want {
			t.Errorf("diskStateOf(%v) = %v, want %v", err, got, want)
		}
	}
	c := &ChunkServer{log: testLogger(t), replicas: map[uint64]*replica{}}
	if got := c.diskState(); got != api.DiskState_DISK_STATE_OK {
		t.Fatalf("fresh disk state %v", got)
	}
	c.replicaFailed(5, full)
	c.replicaFailed(6, broken)
	if got := c.diskState(); got != api.DiskState_DISK_STATE_FULL {
		t.Fatalf("disk state %v, want the first error's", got)
	}
	for _, tc := range []struct {
		err  error
		st   api.Status
		hint uint64
	}{
		{nil, api.StatusOK, 0},
		{&api.Error{Status: api.StatusFenced}, api.StatusFenced, 0},
		{&raftstore.NotLeaderError{Leader: 7}, api.StatusNotLeader, 7},
		{raftstore.ErrStopped, api.StatusNotLeader, 0},
		{fmt.Errorf("%w: 3", raftstore.ErrNoGroup), api.StatusNoSuchCopyset, 0},
		{full, api.StatusNoSpace, 0},
		{walFull, api.StatusNoSpace, 0},
		{broken, api.StatusIOError, 0},
		{fmt.Errorf("read: %w", datastore.ErrIO), api.StatusIOError, 0},
	} {
		if st, hint := statusOf(tc.err); st != tc.st || hint != tc.hint {
			t.Errorf("statusOf(%v) = %v hint %d, want %v hint %d", tc.err, st, hint, tc.st, tc.hint)
		}
	}
}

// A running chunkserver survives garbage on its raft and snapshot ops, and
// serves its metrics.
func TestClusterGarbageAndMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	metricsAddr := ""
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}},
		func(c *Config) {
			if metricsAddr == "" {
				metricsAddr = testutil.FreeAddr(t)
				c.MetricsListen = metricsAddr
			}
		})
	if st := tc.write(ctVolume, 1, 0, []byte("hello")); st != api.StatusOK {
		t.Fatal(st)
	}
	for _, n := range tc.nodes {
		c := tc.conn(n.cs.Addr())
		for _, p := range [][]byte{{1, 2, 3}, make([]byte, 100), {0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}, make([]byte, 100<<10)} {
			for _, version := range []uint32{0, raftnet.BatchVersion} {
				if err := c.Send(api.Header{Op: api.OpRaft, Length: version, Hint: 99}, p); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A snapshot data frame (kind 2) of a transfer that never began.
		call := &transport.Call{Header: api.Header{Op: api.OpSnapshot, Length: 2, Offset: 3}, Payload: []byte("x")}
		if err := c.Do(context.Background(), call); err != nil || call.Reply.Status != api.StatusBadRequest {
			t.Fatalf("snapshot garbage: %v %v", call.Reply.Status, err)
		}
	}
	if got := tc.read(ctVolume, 0, 5); string(got) != "hello" {
		t.Fatalf("read %q", got)
	}
	tc.converged()

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"basalt_chunkserver_io_ops_total",
		"basalt_chunkserver_copyset_applied_index",
		"basalt_chunkserver_raft_propose_commit_seconds_bucket",
		"basalt_chunkserver_wal_syncs_total",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Every stage histogram counts into the same buckets (internal/latency),
	// so the stages read on one scale.
	bounds := map[string][]string{} // histogram name{labels} → its le bounds
	for _, m := range regexp.MustCompile(`(?m)^(basalt_\w+_seconds)_bucket\{([^}]*,)?le="([^"]+)"\}`).FindAllStringSubmatch(string(body), -1) {
		bounds[m[1]+"{"+m[2]+"}"] = append(bounds[m[1]+"{"+m[2]+"}"], m[3])
	}
	want := bounds["basalt_chunkserver_raft_propose_commit_seconds{}"]
	if len(want) != 25 {
		t.Fatalf("propose-commit histogram has %d buckets, want latency.Bounds() and +Inf: %v", len(want), want)
	}
	// (io_latency_seconds{op} appears once this node served IO as a leader; if
	// it did, the loop below checks it.)
	for _, name := range []string{"basalt_chunkserver_wal_write_seconds{}",
		"basalt_chunkserver_wal_fsync_seconds{}", "basalt_chunkserver_raft_apply_seconds{}", "basalt_chunkserver_raft_log_save_seconds{}"} {
		if !slices.Equal(bounds[name], want) {
			t.Errorf("%s buckets %v, want those of propose-commit %v", name, bounds[name], want)
		}
	}
	for name, b := range bounds {
		if !slices.Equal(b, want) {
			t.Errorf("%s buckets %v, want those of propose-commit %v", name, b, want)
		}
	}
}

// A replica whose disk fills up stops (its groups report unhealthy, the
// chunkserver reports "disk full"); the other two keep serving and the data
// stays intact.
func TestClusterDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	var full atomic.Bool
	first := true
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}},
		func(c *Config) {
			c.SnapshotEntries = 10
			if first {
				first = false
				c.Knobs.Datastore.Fdatasync = func(fd int, name string) error {
					if full.Load() {
						return unix.ENOSPC
					}
					return unix.Fdatasync(fd)
				}
			}
		})
	rng := rand.New(rand.NewSource(11))
	model := make([]byte, ctVolSize)
	tc.writeRandom(rng, model, 30, 1)
	full.Store(true)
	for i := 0; i < 80; i++ {
		off := uint64(rng.Intn(ctVolSize/4096)) * 4096
		data := make([]byte, 4096)
		rng.Read(data)
		for attempt := 0; ; attempt++ {
			st := tc.write(ctVolume, 1, off, data)
			if st == api.StatusOK {
				break
			}
			if attempt > 50 || (st != api.StatusIOError && st != api.StatusNoSpace) {
				t.Fatalf("write at %d: %v", off, st)
			}
			time.Sleep(50 * time.Millisecond)
		}
		copy(model[off:], data)
	}
	tc.waitFor("node 1 to report a full disk", func() bool {
		hb := tc.mds.heartbeat(1)
		if hb == nil || hb.GetDiskState() != api.DiskState_DISK_STATE_FULL {
			return false
		}
		for _, cs := range hb.GetCopysets() {
			if cs.GetHealthy() {
				return false
			}
		}
		return true
	})
	tc.verify(model)
}

// With automatic snapshots far away, the WAL would grow without bound; the
// chunkserver makes the groups that pin old segments snapshot instead.
func TestClusterWALCompaction(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	const maxSegs = 3
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}},
		func(c *Config) {
			c.WALSegmentSize = 256 << 10
			c.MaxWALSegments = maxSegs
			c.SnapshotEntries = 1 << 40
			c.CatchUpEntries = 1
		})
	rng := rand.New(rand.NewSource(13))
	model := make([]byte, ctVolSize)
	peak := 0
	for round := 0; round < 20; round++ {
		tc.writeRandom(rng, model, 30, 1) // ~120 KiB of entries per round
		for _, n := range tc.nodes {
			peak = max(peak, n.cs.wal.SegmentCount())
		}
	}
	tc.waitFor("old WAL segments to be removed", func() bool {
		for _, n := range tc.nodes {
			if n.cs.wal.SegmentCount() > maxSegs+1 {
				return false
			}
		}
		return true
	})
	var created uint64
	for _, n := range tc.nodes {
		created += n.cs.HostStats().SnapshotsCreated
	}
	if created == 0 {
		t.Fatal("no snapshot was forced")
	}
	t.Logf("peak WAL segments %d, snapshots forced %d", peak, created)
	tc.verify(model)
	// A restart replays from the forced snapshots.
	tc.stop(0)
	tc.start(0)
	tc.converged()
	tc.verify(model)
}
