package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
)

// BenchmarkSave measures Save of one entry per call (one Raft group per
// saver, as copysets do) over entry sizes and numbers of concurrent savers.
// b.N counts Saves across all savers; syncs/op shows how many fdatasyncs
// group commit needed per Save.
//
//	go test ./internal/wal -run '^$' -bench . -benchmem
func BenchmarkSave(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 256 << 10} {
		for _, savers := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("size=%dKiB/savers=%d", size>>10, savers), func(b *testing.B) {
				benchSave(b, size, savers)
			})
		}
	}
}

func benchSave(b *testing.B, size, savers int) {
	w := openT(b, b.TempDir(), func(c *Config) { c.SegmentSize = DefaultSegmentSize })
	defer w.Close()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i)
	}
	var next atomic.Int64
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for s := range savers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			group := uint64(s + 1)
			idx := uint64(1)
			ents := []*pb.Entry{{Term: new(uint64(1)), Index: new(idx), Type: new(pb.EntryType_EntryNormal), Data: data}}
			u := []Update{{Group: group, Entries: ents}}
			for next.Add(1) <= int64(b.N) {
				ents[0] = &pb.Entry{Term: ents[0].Term, Index: new(idx), Type: ents[0].Type, Data: data}
				if err := w.Save(u); err != nil {
					b.Error(err)
					return
				}
				idx++
				if idx%1024 == 0 { // keep the log (and segments) bounded
					sn := &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(idx - 1)}}
					if err := w.CreateSnapshot(group, sn, idx-1); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	st := w.Stats()
	b.ReportMetric(float64(st.Syncs)/float64(b.N), "syncs/op")
	b.ReportMetric(float64(st.MeanSyncTime().Microseconds()), "µs/sync")
}

// BenchmarkPlainFileSync is the baseline: write the same bytes to a
// preallocated file and fdatasync after every write, one writer.
func BenchmarkPlainFileSync(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			f, err := os.OpenFile(filepath.Join(b.TempDir(), "plain"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			const fileSize = 64 << 20
			if err := unix.Fallocate(int(f.Fd()), 0, 0, fileSize); err != nil {
				b.Skipf("fallocate: %v", err)
			}
			data := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			off := int64(0)
			for range b.N {
				if off+int64(size) > fileSize {
					off = 0
				}
				if _, err := f.WriteAt(data, off); err != nil {
					b.Fatal(err)
				}
				if err := unix.Fdatasync(int(f.Fd())); err != nil {
					b.Fatal(err)
				}
				off += int64(size)
			}
		})
	}
}
