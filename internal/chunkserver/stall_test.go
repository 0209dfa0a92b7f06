package chunkserver

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestClusterWALStall: a leader whose WAL's fdatasync hangs hands its
// leadership to a peer (the stall watchdog), so a write is answered; once the
// disk answers again its WAL catches up and the write reads back everywhere.
// Without the watchdog the write is never answered (the hung leader keeps
// its leadership: its heartbeats go on).
func TestClusterWALStall(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	var hang [3]atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	n := 0
	tc := newTestCluster(t, clusterPool(1), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}}, func(c *Config) {
		i := n
		n++
		c.WALStallTimeout = 200 * time.Millisecond
		c.Knobs.WAL.BeforeSync = func() error {
			if hang[i].Load() {
				<-release
			}
			return nil
		}
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the nodes stop
	if st := tc.write(ctVolume, 1, 0, []byte("before")); st != api.StatusOK {
		t.Fatal(st)
	}
	leader := -1
	tc.waitFor("a leader", func() bool {
		for i := range tc.nodes {
			if st, ok := tc.groupStatus(i, 0); ok && st.IsLeader {
				leader = i
				return true
			}
		}
		return false
	})
	hang[leader].Store(true)
	start := time.Now()
	if st := tc.write(ctVolume, 1, 0, []byte("during")); st != api.StatusOK {
		t.Fatal(st)
	}
	t.Logf("a write with the leader's WAL hung answered after %s", time.Since(start).Round(time.Millisecond))
	if st, ok := tc.groupStatus(leader, 0); ok && st.IsLeader {
		t.Fatalf("node %d still leads with its WAL hung", leader)
	}
	once.Do(func() { close(release) })
	hang[leader].Store(false)
	tc.waitFor("the stalled WAL to catch up", func() bool { return tc.nodes[leader].cs.wal.Stalled() == 0 })
	if got := tc.read(ctVolume, 0, 6); string(got) != "during" {
		t.Fatalf("read %q, want %q", got, "during")
	}
	tc.converged()
}
