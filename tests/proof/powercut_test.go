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

	c, fss := startOnLazyfs(t, testcluster.Options{ChunkSize: chunkSize})
	if fss == nil {
		t.Skip("cannot mount lazyfs (FUSE needs root or fusermount3)")
	}
	c.CreateVolume("vol", volSize)
	v := c.Open("vol", false)
	w := testcluster.StartWorkload(t, v, testcluster.WorkloadOptions{Seed: s0, Writers: 4})
	t.Cleanup(w.Stop)

	for n := 1; n <= cuts; n++ {
		time.Sleep(time.Duration(500+rng.Intn(3000)) * time.Millisecond)
		acked := w.Acked()
		files, entries := fss.cut(t, c)
		t.Logf("CUT %d: power cut to all three chunkservers after %d acknowledged IOs; lost unsynced data of %d files and %d directory changes",
			n, acked, files, entries)
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

// lazySet is the lazyfs of each chunkserver of a cluster, by its index in c.CS.
type lazySet struct {
	mu  sync.Mutex
	fss map[int]*lazyfs.FS
}

func (l *lazySet) fs(i int) *lazyfs.FS {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fss[i]
}

// startOnLazyfs starts a cluster whose chunkservers (also any added later)
// each run on a lazyfs of their own. It returns a nil lazySet, with the
// reason logged, when lazyfs cannot be mounted here. Every file system is
// unmounted once the cluster stopped, and made not full.
func startOnLazyfs(t *testing.T, opts testcluster.Options) (*testcluster.Cluster, *lazySet) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Logf("lazyfs: /dev/fuse is missing (Debian: apt-get install fuse3)")
		return testcluster.Start(t, opts), nil
	}
	// The test's temporary directory is removed by a cleanup registered at
	// its first use: use it first, so the unmounts below run before that.
	_ = t.TempDir()
	l := &lazySet{fss: map[int]*lazyfs.FS{}}
	// Registered before the cluster's own cleanup, so it runs after it:
	// the chunkservers are stopped before their file systems go.
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, z := range l.fss {
			z.SetFull(false)
			if err := z.Unmount(); err != nil {
				t.Log(err)
			}
		}
	})
	failed := ""
	opts.PrepareChunkserver = func(i int, dir string) {
		z, err := lazyfs.New(dir + ".lazyfs")
		if err == nil {
			err = z.Mount(dir)
		}
		if err != nil {
			failed = err.Error()
			return
		}
		l.mu.Lock()
		l.fss[i] = z
		l.mu.Unlock()
	}
	c := testcluster.Start(t, opts)
	if failed != "" {
		t.Logf("lazyfs: cannot mount (FUSE needs root or fusermount3): %s", failed)
		return c, nil
	}
	return c, l
}

// cut cuts the power of every chunkserver of c at once: kill -9 of each,
// then each lazyfs forgets what was not durable; then they restart. It
// returns how many files' data and directory changes were taken back.
func (l *lazySet) cut(t *testing.T, c *testcluster.Cluster) (files, entries int) {
	t.Helper()
	var wg sync.WaitGroup
	for _, p := range c.CS {
		wg.Add(1)
		go func() { defer wg.Done(); c.Kill(p) }()
	}
	wg.Wait()
	for i, p := range c.CS {
		z := l.fs(i)
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
	for _, p := range c.CS {
		c.Start(p)
	}
	return files, entries
}
