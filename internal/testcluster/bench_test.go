package testcluster

import (
	crand "crypto/rand"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// The figures of issue 2: 4 KiB IO through the client library against a real
// 3-chunkserver cluster (separate processes on loopback), at one request in flight
// (latency) and at 32 (IOPS), beside the same writes to a local file with
// fdatasync. Run:
//
//	go build -o bin/basalt ./cmd/basalt
//	BASALT_BIN=$PWD/bin/basalt go test -run '^$' -bench . -benchtime 3000x ./internal/testcluster/
//
// ns/op is the mean latency at QD1; at QD32 ns/op is the inverse throughput, and
// the IOPS metric is reported.

const benchVolume = 1 << 30

func benchCluster(b *testing.B) *client.Volume {
	c := Start(b, Options{Copysets: 12})
	c.CreateVolume("bench", benchVolume)
	v := c.Open("bench", false)
	// Write the region reads will use, so reads hit data.
	buf := make([]byte, 1<<20)
	crand.Read(buf)
	for off := int64(0); off < 64<<20; off += int64(len(buf)) {
		if _, err := v.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
	}
	return v
}

func randomOffset(rng *rand.Rand, span int64) int64 { return rng.Int63n(span/4096) * 4096 }

func BenchmarkClusterIO(b *testing.B) {
	v := benchCluster(b)
	for _, tc := range []struct {
		name  string
		op    api.Op
		depth int
	}{
		{"write-4k-qd1", api.OpWrite, 1},
		{"read-4k-qd1", api.OpRead, 1},
		{"write-4k-qd32", api.OpWrite, 32},
		{"read-4k-qd32", api.OpRead, 32},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(4096)
			runDepth(b, v, tc.op, tc.depth)
		})
	}
}

// runDepth keeps depth IOs in flight through Submit until b.N completed.
func runDepth(b *testing.B, v *client.Volume, op api.Op, depth int) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		started int
		failed  error
	)
	next := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if started >= b.N || failed != nil {
			return false
		}
		started++
		return true
	}
	b.ResetTimer()
	t0 := time.Now()
	for w := 0; w < depth; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			buf := make([]byte, 4096)
			rng.Read(buf)
			done := make(chan error, 1)
			for next() {
				v.Submit(op, buf, randomOffset(rng, 64<<20), 4096, func(err error) { done <- err })
				if err := <-done; err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		}(int64(w))
	}
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "IOPS")
}

// The floor: the same 4 KiB writes to a local file, each followed by fdatasync.
func BenchmarkLocalFileFdatasync4K(b *testing.B) {
	path := filepath.Join(b.TempDir(), "file")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, 64<<20); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	rng := rand.New(rand.NewSource(1))
	rng.Read(buf)
	b.SetBytes(4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.WriteAt(buf, randomOffset(rng, 64<<20)); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
}
