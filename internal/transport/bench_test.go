package transport

import (
	"fmt"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/pkg/api"
)

// benchHandler answers reads with a shared buffer and writes with an empty reply,
// at once, like a chunkserver serving from page cache.
func benchHandler() Handler {
	data := make([]byte, 1<<20)
	return handlerFunc(func(rw ReplyWriter, h api.Header, _ []byte) {
		if h.Op == api.OpRead {
			rw.Reply(h, data[:h.Length], nil)
			return
		}
		rw.Reply(h, nil, nil)
	})
}

// BenchmarkConnRoundTrip: loopback round trips of reads (payload in the reply) and
// writes (payload in the request), at 1 and 32 calls in flight on one Conn.
func BenchmarkConnRoundTrip(b *testing.B) {
	_, addr := startServer(b, ServerConfig{}, benchHandler())
	c := dial(b, addr)
	for _, op := range []api.Op{api.OpRead, api.OpWrite} {
		for _, size := range []int{4 << 10, 64 << 10} {
			for _, depth := range []int{1, 32} {
				name := fmt.Sprintf("op=%s/size=%dKiB/inflight=%d", map[api.Op]string{api.OpRead: "read", api.OpWrite: "write"}[op], size>>10, depth)
				b.Run(name, func(b *testing.B) {
					free := make(chan *Call, depth)
					for range depth {
						call := &Call{Header: api.Header{Op: op, Length: uint32(size)}}
						if op == api.OpRead {
							call.ReadBuf = make([]byte, size)
						} else {
							call.Payload = make([]byte, size)
						}
						free <- call
					}
					var wg sync.WaitGroup
					var failed error
					var mu sync.Mutex
					done := func(call *Call) {
						if call.Err != nil {
							mu.Lock()
							failed = call.Err
							mu.Unlock()
						}
						free <- call
						wg.Done()
					}
					b.SetBytes(int64(size))
					b.ResetTimer()
					for range b.N {
						call := <-free
						wg.Add(1)
						c.Go(call, done)
					}
					wg.Wait()
					if failed != nil {
						b.Fatal(failed)
					}
				})
			}
		}
	}
}
