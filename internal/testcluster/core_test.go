package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// model is what a volume must contain: every acknowledged write, in order.
type model struct {
	mu     sync.Mutex
	data   []byte
	chunks []int64 // acknowledged writes per 4 MiB chunk
}

func (m *model) apply(off int64, p []byte) {
	m.mu.Lock()
	copy(m.data[off:], p)
	if m.chunks == nil {
		m.chunks = make([]int64, (len(m.data)+modelChunk-1)/modelChunk)
	}
	for c := off / modelChunk; c <= (off+int64(len(p))-1)/modelChunk; c++ {
		m.chunks[c]++
	}
	m.mu.Unlock()
}

// modelChunk is the chunk size of the clusters the model's volumes live in
// (the testcluster default).
const modelChunk = 4 << 20

// perCopyset returns the acknowledged writes so far into each copyset of
// volume vol in a pool of count copysets.
func (m *model) perCopyset(vol uint64, count uint32) []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int64, count)
	for c, n := range m.chunks {
		out[api.CopysetOf(vol, uint64(c), count)] += n
	}
	return out
}

// verify reads the whole volume and compares it with the model, naming the first
// differing offset.
func (m *model) verify(t *testing.T, v *client.Volume) {
	t.Helper()
	got := make([]byte, len(m.data))
	const step = 4 << 20
	for off := 0; off < len(got); off += step {
		end := min(off+step, len(got))
		if _, err := v.ReadAt(got[off:end], int64(off)); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !bytes.Equal(got, m.data) {
		for i := range got {
			if got[i] != m.data[i] {
				t.Fatalf("volume differs from acknowledged writes at offset %d (chunk %d): got %#x want %#x",
					i, i/(4<<20), got[i], m.data[i])
			}
		}
	}
}

// writer keeps writing random blocks into its own region [lo, hi) until stop is
// closed, recording each acknowledged write in the model. Writers own disjoint
// regions, so the model is exact. Failed writes are counted, not recorded: their
// blocks are rewritten later, so the model stays exact.
func writer(t *testing.T, v *client.Volume, m *model, seed int64, lo, hi int64, stop <-chan struct{}, acked, failed *atomic.Int64) {
	rng := rand.New(rand.NewSource(seed))
	var pending []int64 // blocks whose last write failed: content unknown until rewritten
	for {
		select {
		case <-stop:
			// Rewrite blocks whose state is unknown so the model is exact again.
			for _, off := range pending {
				buf := make([]byte, 4096)
				rng.Read(buf)
				if _, err := v.WriteAt(buf, off); err != nil {
					t.Errorf("rewrite at %d after fault: %v", off, err)
					return
				}
				m.apply(off, buf)
			}
			return
		default:
		}
		size := int64(4096 * (1 + rng.Intn(16)))
		off := lo + rng.Int63n((hi-lo-size)/4096+1)*4096
		buf := make([]byte, size)
		rng.Read(buf)
		if _, err := v.WriteAt(buf, off); err != nil {
			failed.Add(1)
			for b := off; b < off+size; b += 4096 {
				pending = append(pending, b)
			}
			continue
		}
		acked.Add(1)
		m.apply(off, buf)
	}
}

func TestWriteReadManyChunks(t *testing.T) {
	c := Start(t, Options{})
	const size = 64 << 20 // 16 chunks of 4 MiB over 8 copysets
	c.CreateVolume("many", size)
	v := c.Open("many", false)
	m := &model{data: make([]byte, size)}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 300; i++ {
		n := 512 * (1 + rng.Intn(512)) // up to 256 KiB, crossing chunk boundaries now and then
		off := rng.Int63n(size-int64(n)) &^ 511
		buf := make([]byte, n)
		rng.Read(buf)
		if _, err := v.WriteAt(buf, off); err != nil {
			t.Fatalf("write %d bytes at %d: %v", n, off, err)
		}
		m.apply(off, buf)
	}
	// A write spanning a chunk boundary exactly.
	buf := bytes.Repeat([]byte{0xab}, 8192)
	if _, err := v.WriteAt(buf, 4<<20-4096); err != nil {
		t.Fatal(err)
	}
	m.apply(4<<20-4096, buf)
	m.verify(t, v)
	c.CompareReplicas(60 * time.Second)
}

// testKillChunkserverDuringWrites kills one of three chunkservers while four
// writers keep writing, keeps it down until every copyset has acknowledged at
// least downWrites writes without it, restarts it and checks that the volume
// holds every acknowledged write and the replicas converge. Every step waits
// for a condition, not for a time: on a loaded machine writes are slow.
func testKillChunkserverDuringWrites(t *testing.T, flags []string, downWrites int64) *Cluster {
	c := Start(t, Options{ChunkserverFlags: flags})
	const size = 64 << 20
	vol := c.CreateVolume("faulty", size)
	v := c.Open("faulty", false)
	m := &model{data: make([]byte, size)}

	stop := make(chan struct{})
	var acked, failed atomic.Int64
	var wg sync.WaitGroup
	const writers = 4
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			region := int64(size / writers)
			writer(t, v, m, int64(w+10), int64(w)*region, int64(w+1)*region, stop, &acked, &failed)
		}(w)
	}
	stopped := false
	stopWriters := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopWriters() // on a failed wait, before the cluster stops
	c.Eventually(120*time.Second, "writes before the fault", func(context.Context) error {
		if n := acked.Load(); n < 100 {
			return fmt.Errorf("%d writes acknowledged", n)
		}
		return nil
	})
	victim := c.CS[1]
	c.Kill(victim)
	before := acked.Load()
	base := m.perCopyset(vol.Id, c.Pool.CopysetCount) // counted from the moment the victim is gone
	t.Logf("killed %s after %d acknowledged writes", victim.Name, before)
	// Two of three replicas are a majority: writes go on without the victim.
	c.Eventually(5*time.Minute, fmt.Sprintf("%d writes into every copyset while %s is down", downWrites, victim.Name),
		func(context.Context) error {
			for cs, n := range m.perCopyset(vol.Id, c.Pool.CopysetCount) {
				if d := n - base[cs]; d < downWrites {
					return fmt.Errorf("copyset %d: %d writes acknowledged since the kill (%d in all)", cs, d, acked.Load()-before)
				}
			}
			return nil
		})
	t.Logf("%d writes acknowledged while %s was down", acked.Load()-before, victim.Name)
	stopWriters()
	t.Logf("writes: %d acknowledged, %d failed (retried later)", acked.Load(), failed.Load())
	m.verify(t, v)

	c.Start(victim)
	c.WaitHealthy(120 * time.Second)
	m.verify(t, v)
	c.CompareReplicas(180 * time.Second)
	return c
}

// The restarted chunkserver catches up from the leaders' logs.
func TestKillChunkserverCatchUpThroughLog(t *testing.T) {
	testKillChunkserverDuringWrites(t, nil, 1)
}

// With tiny snapshot thresholds the leaders compact their logs while the victim is
// down, so it can only catch up through InstallSnapshot: each copyset takes
// 450 writes without the victim, enough for two snapshots (every 200 entries)
// past the victim's last entry, the second of which drops it from the log
// (20 entries kept below a snapshot).
func TestKillChunkserverCatchUpThroughSnapshot(t *testing.T) {
	c := testKillChunkserverDuringWrites(t, []string{"--snapshot-entries=200", "--catchup-entries=20"}, 450)
	if n := c.CountLog(c.CS[1], "snapshot installed"); n == 0 {
		t.Errorf("the restarted chunkserver never installed a snapshot; the test did not exercise InstallSnapshot")
	} else {
		t.Logf("%s installed %d snapshots", c.CS[1].Name, n)
	}
}

func TestFencing(t *testing.T) {
	c := Start(t, Options{})
	c.CreateVolume("fenced", 16<<20)
	a := c.Open("fenced", false)
	old := bytes.Repeat([]byte("A"), 64<<10)
	for off := int64(0); off < 16<<20; off += 4 << 20 {
		if _, err := a.WriteAt(old, off); err != nil {
			t.Fatalf("first writer: %v", err)
		}
	}
	b := c.Open("fenced", false) // a new writer: a newer epoch
	fresh := bytes.Repeat([]byte("B"), 64<<10)
	for off := int64(0); off < 16<<20; off += 4 << 20 {
		if _, err := b.WriteAt(fresh, off); err != nil {
			t.Fatalf("second writer: %v", err)
		}
	}
	for off := int64(0); off < 16<<20; off += 4 << 20 {
		_, err := a.WriteAt(old, off)
		if !errors.Is(err, api.ErrFenced) {
			t.Fatalf("stale writer's write at %d: got %v, want FENCED", off, err)
		}
	}
	// A reader sees the second writer's data everywhere it wrote.
	r := c.Open("fenced", true)
	got := make([]byte, len(fresh))
	for off := int64(0); off < 16<<20; off += 4 << 20 {
		if _, err := r.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, fresh) {
			t.Fatalf("at %d the stale writer's data overwrote the new writer's", off)
		}
	}
	// A read-only open cannot write.
	if _, err := r.WriteAt(fresh, 0); err == nil {
		t.Fatalf("a read-only session wrote")
	}
}
