package client

import (
	"fmt"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/pkg/api"
)

// BenchmarkSplitRoute: the cost of cutting one IO into per-chunk pieces and routing
// each to its copyset (16 MiB chunks, 100 copysets), without any network.
func BenchmarkSplitRoute(b *testing.B) {
	const chunk = 16 << 20
	v := &Volume{id: 12345, chunkSize: chunk, maxPiece: chunk, csCount: 100}
	buf := make([]byte, 64<<20)
	for _, size := range []int64{4 << 10, 128 << 10, 1 << 20, 4 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			o := &ioOp{v: v}
			off := int64(chunk - 2048) // straddles a boundary
			for b.Loop() {
				ps := v.split(o, buf[:size], off, size)
				if len(ps) == 0 {
					b.Fatal("no pieces")
				}
			}
		})
	}
}

// BenchmarkIO: whole IOs through the library against in-process fake chunkservers
// on loopback (memory copies, no disk), at 1 and 32 in flight: the library's and
// the transport's overhead per IO.
func BenchmarkIO(b *testing.B) {
	c := newFakeCluster(b)
	v := c.open(b, nil)
	for _, op := range []api.Op{api.OpWrite, api.OpRead} {
		for _, depth := range []int{1, 32} {
			b.Run(fmt.Sprintf("op=%s/size=4KiB/inflight=%d", op, depth), func(b *testing.B) {
				bufs := make(chan []byte, depth)
				for range depth {
					bufs <- make([]byte, 4096)
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				var failed error
				b.SetBytes(4096)
				b.ResetTimer()
				for i := range b.N {
					buf := <-bufs
					wg.Add(1)
					off := int64(i%(tSize/4096)) * 4096
					v.Submit(op, buf, off, 4096, func(err error) {
						if err != nil {
							mu.Lock()
							failed = err
							mu.Unlock()
						}
						bufs <- buf
						wg.Done()
					})
				}
				wg.Wait()
				if failed != nil {
					b.Fatal(failed)
				}
			})
		}
	}
}
