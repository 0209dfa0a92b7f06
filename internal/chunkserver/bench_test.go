package chunkserver

import (
	"fmt"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/pkg/api"
)

// BenchmarkCluster measures 4 KiB IO through raw frames against three
// in-process chunkservers (real WAL with fdatasync, real chunk files) at one
// request in flight and at 32. Run with:
//
//	go test -run XXX -bench Cluster -benchtime 2000x ./internal/chunkserver
func BenchmarkCluster(b *testing.B) {
	for _, tc := range []struct {
		op    string
		depth int
	}{{"write", 1}, {"write", 32}, {"read", 1}, {"read", 32}} {
		b.Run(fmt.Sprintf("%s4k/qd%d", tc.op, tc.depth), func(b *testing.B) {
			benchCluster(b, tc.op, tc.depth)
		})
	}
}

func benchCluster(b *testing.B, op string, depth int) {
	tc := newTestCluster(b, clusterPool(4), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}}, nil)
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i)
	}
	blocks := ctVolSize / 4096
	if op == "read" {
		for off := 0; off < ctVolSize; off += 4096 {
			if st := tc.write(ctVolume, 1, uint64(off), data); st != api.StatusOK {
				b.Fatal(st)
			}
		}
	}
	b.SetBytes(4096)
	b.ResetTimer()
	var wg sync.WaitGroup
	next := make(chan int, depth)
	for w := 0; w < depth; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				off := uint64(i*7919%blocks) * 4096
				if op == "write" {
					if st := tc.write(ctVolume, 1, off, data); st != api.StatusOK {
						b.Error(st)
						return
					}
				} else {
					tc.read(ctVolume, off, 4096)
				}
			}
		}()
	}
	for i := 0; i < b.N; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	b.StopTimer()
}

// BenchmarkWriteGate measures what the write gate adds to every write: an
// enter and a leave with depth-1 other writes of the replica in flight, no
// compare-and-write around.
//
//	go test -run XXX -bench WriteGate ./internal/chunkserver
func BenchmarkWriteGate(b *testing.B) {
	for _, depth := range []int{1, 32, 128} {
		b.Run(fmt.Sprintf("qd%d", depth), func(b *testing.B) {
			var g writeGate
			ids := make([]uint64, depth)
			for i := range ids {
				ids[i], _ = g.enter(gateSpan{1, uint64(i) * 4096, uint64(i+1) * 4096}, false)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := i % depth
				g.leave(ids[k])
				ids[k], _ = g.enter(gateSpan{1, uint64(k) * 4096, uint64(k+1) * 4096}, false)
			}
		})
	}
}
