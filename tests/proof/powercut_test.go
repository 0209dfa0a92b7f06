package proof

import (
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/lazyfs"
	"github.com/basalt-storage/basalt/internal/testcluster"
)

// TestPowerCut runs every chunkserver on a lazyfs (internal/lazyfs: data
// not fsynced, and directory entries not made durable by an fsync of their
// directory, are lost at a cut) under a verified workload, and cuts the
// power of all three at once at random (seeded) moments: kill -9 of every
// chunkserver, then lazyfs drops what was not durable, then they restart.
// Every acknowledged write must read back, and the replicas must agree.
// BASALT_PROOF_CUTS sets the number of cuts (default 3).
func TestPowerCut(t *testing.T) {
	if testing.Short() {
		t.Skip("power cuts of a real cluster: -short")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("needs FUSE for lazyfs: /dev/fuse is missing (Debian: apt-get install fuse3)")
	}
	s0 := seed(t)
	rng := rand.New(rand.NewSource(s0))
	cuts := 3
	if e := os.Getenv("BASALT_PROOF_CUTS"); e != "" {
		n, err := strconv.Atoi(e)
		if err != nil {
			t.Fatalf("BASALT_PROOF_CUTS: %v", err)
		}
		cuts = n
	}

	// The test's temporary directory is removed by a cleanup registered at
	// its first use: use it first, so the unmounts below run before that.
	_ = t.TempDir()
	var mu sync.Mutex
	fss := map[int]*lazyfs.FS{}
	// Registered before the cluster's own cleanup, so it runs after it:
	// the chunkservers are stopped before their file systems go.
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, z := range fss {
			if err := z.Unmount(); err != nil {
				t.Log(err)
			}
		}
	})
	skip := ""
	c := testcluster.Start(t, testcluster.Options{ChunkSize: chunkSize, PrepareChunkserver: func(i int, dir string) {
		z, err := lazyfs.New(dir + ".lazyfs")
		if err == nil {
			err = z.Mount(dir)
		}
		if err != nil {
			skip = err.Error()
			return
		}
		mu.Lock()
		fss[i] = z
		mu.Unlock()
	}})
	if skip != "" {
		t.Skipf("cannot mount lazyfs (FUSE needs root or fusermount3): %s", skip)
	}
	c.CreateVolume("vol", volSize)
	v := c.Open("vol", false)
	w := testcluster.StartWorkload(t, v, testcluster.WorkloadOptions{Seed: s0, Writers: 4})
	t.Cleanup(w.Stop)

	for n := 1; n <= cuts; n++ {
		time.Sleep(time.Duration(500+rng.Intn(3000)) * time.Millisecond)
		acked := w.Acked()
		var wg sync.WaitGroup
		for _, p := range c.CS {
			wg.Add(1)
			go func() { defer wg.Done(); c.Kill(p) }()
		}
		wg.Wait()
		files, entries := 0, 0
		for i, p := range c.CS {
			z := fss[i]
			if err := z.Unmount(); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			f, e, err := z.Cut()
			if err != nil {
				t.Errorf("%s: %v", p, err)
			}
			files, entries = files+f, entries+e
			if err := z.Mount(p.DataDir); err != nil {
				t.Fatalf("%s: remount: %v", p, err)
			}
		}
		t.Logf("CUT %d: power cut to all three chunkservers after %d acknowledged IOs; lost unsynced data of %d files and %d directory changes",
			n, acked, files, entries)
		for _, p := range c.CS {
			c.Start(p)
		}
		c.WaitHealthy(90 * time.Second)
		w.AwaitProgress(c, "after the power came back")
	}
	time.Sleep(time.Second)
	w.Stop()
	t.Logf("workload: %d acknowledged IOs; errors %v", w.Acked(), w.Errors())
	w.Verify(v)
	c.CompareReplicas(90 * time.Second)
	if t.Failed() {
		keepArtifacts(t, c, func(dir string) {
			_ = os.WriteFile(filepath.Join(dir, "seed"), []byte(strconv.FormatInt(s0, 10)), 0o644)
		})
	}
}
