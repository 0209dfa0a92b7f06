package datastore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmarks run on the file system of the test's temp dir. Reproduce:
//
//	go test -run XXX -bench . -benchmem ./internal/datastore/
//
// WriteAt/ReadAt measure the hot path (page-cache pwrite/pread plus the
// store's bookkeeping); SyncDirty measures Sync of N dirty chunks with
// real fdatasync.

const benchChunk = 16 << 20

func benchCopyset(b *testing.B) *Copyset {
	s, err := Open(Config{Dir: b.TempDir(), PreallocChunks: 0, Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	cs, err := s.Copyset(1, benchChunk)
	if err != nil {
		b.Fatal(err)
	}
	return cs
}

func BenchmarkWriteAt(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			cs := benchCopyset(b)
			p := make([]byte, size)
			r := rand.New(rand.NewPCG(1, 1))
			const chunks = 4
			for i := range chunks { // create the files outside the timed loop
				cs.WriteAt(ChunkID{1, uint64(i)}, p, 0)
			}
			slots := benchChunk / int64(size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				id := ChunkID{1, uint64(i % chunks)}
				if err := cs.WriteAt(id, p, r.Int64N(slots)*int64(size)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkReadAt(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			cs := benchCopyset(b)
			buf := make([]byte, 1<<20)
			for off := int64(0); off < benchChunk; off += int64(len(buf)) {
				cs.WriteAt(ChunkID{1, 0}, buf, off)
			}
			p := make([]byte, size)
			r := rand.New(rand.NewPCG(1, 1))
			slots := benchChunk / int64(size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := cs.ReadAt(ChunkID{1, 0}, p, r.Int64N(slots)*int64(size)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSyncDirty: one op = N chunks each dirtied by one 4 KiB write,
// then one Sync (N fdatasyncs, 4 in flight). Compare with N × a single
// fdatasync to see what batching buys on this device.
func BenchmarkSyncDirty(b *testing.B) {
	for _, n := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			cs := benchCopyset(b)
			p := make([]byte, 4096)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				for c := range n {
					if err := cs.WriteAt(ChunkID{1, uint64(c)}, p, int64(i%4096)*4096); err != nil {
						b.Fatal(err)
					}
				}
				if err := cs.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSmallRewrite: 4 KiB writes into chunks first filled with 1 MiB
// writes, as a volume is after a sequential fill. The folios the fill left in
// the page cache decide what each small write costs (see writePiece).
func BenchmarkSmallRewrite(b *testing.B) {
	cs := benchCopyset(b)
	big := make([]byte, 1<<20)
	const chunks = 8
	for i := range chunks {
		for off := int64(0); off < benchChunk; off += int64(len(big)) {
			if err := cs.WriteAt(ChunkID{1, uint64(i)}, big, off); err != nil {
				b.Fatal(err)
			}
		}
	}
	p := make([]byte, 4<<10)
	r := rand.New(rand.NewPCG(1, 1))
	slots := benchChunk / int64(len(p))
	b.SetBytes(int64(len(p)))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := cs.WriteAt(ChunkID{1, uint64(i % chunks)}, p, r.Int64N(slots)*int64(len(p))); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLargeWrite: one op = one 256 KiB sequential write, with a Sync
// after every 16 (as the log compaction syncs the chunks a follower wrote),
// through the page cache (WriteAt, the leader) and around it
// (WriteAtUncached, a follower's data aligned in its frame). cpu-µs/op is the process's user+system
// time per op, which a loaded machine changes less than the wall time.
func BenchmarkLargeWrite(b *testing.B) {
	const size = 256 << 10
	for _, mode := range []string{"buffered", "direct"} {
		b.Run(mode, func(b *testing.B) {
			cs := benchCopyset(b)
			p := make([]byte, size)
			write := cs.WriteAtUncached
			if mode == "buffered" {
				write = cs.WriteAt
			}
			b.SetBytes(size)
			start := cpuTime(b)
			for i := 0; b.Loop(); i++ {
				off := int64(i) * size
				id := ChunkID{1, uint64(off / benchChunk % 8)}
				if err := write(id, p, off%benchChunk); err != nil {
					b.Fatal(err)
				}
				if i%16 == 15 {
					if err := cs.Sync(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// BenchmarkSaveMeta: a 1 KiB meta record saved durably, by SaveMeta's two
// slots and by replacing a file (writeAtomic, what SaveMeta did before).
func BenchmarkSaveMeta(b *testing.B) {
	meta := make([]byte, 1<<10)
	for _, mode := range []string{"slots", "rename"} {
		b.Run(mode, func(b *testing.B) {
			cs := benchCopyset(b)
			start := cpuTime(b)
			for b.Loop() {
				var err error
				if mode == "slots" {
					err = cs.SaveMeta(meta)
				} else {
					err = writeAtomic(cs.dir, metaFileName, metaMagic, meta)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
