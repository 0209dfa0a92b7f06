package raftstore

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/raftstore/memlog"
	"github.com/basalt-storage/basalt/internal/wal"
)

// benchCluster starts three live hosts with ngroups groups and waits for leaders.
func benchCluster(b *testing.B, ngroups int, newLog func(id uint64) LogStore) (map[uint64]*Host, map[uint64]uint64, func()) {
	n := newLiveNet()
	hosts := map[uint64]*Host{}
	for id := uint64(1); id <= 3; id++ {
		h, err := New(Config{
			NodeID: id, Log: newLog(id), Transport: liveTransport{n: n, from: id},
			Workers: 4, TickInterval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			b.Fatal(err)
		}
		hosts[id] = h
		n.add(id, h)
		for g := uint64(1); g <= uint64(ngroups); g++ {
			if err := h.CreateGroup(g, []uint64{1, 2, 3}, newTestSM(), false); err != nil {
				b.Fatal(err)
			}
		}
		h.Start()
	}
	leaders := map[uint64]uint64{}
	deadline := time.Now().Add(10 * time.Second)
	for g := uint64(1); g <= uint64(ngroups); g++ {
		for leaders[g] == 0 {
			for id, h := range hosts {
				if st, _ := h.Status(g); st.IsLeader {
					leaders[g] = id
				}
			}
			if time.Now().After(deadline) {
				b.Fatal("no leader")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return hosts, leaders, func() {
		for _, h := range hosts {
			h.Stop()
		}
		close(n.stop)
		n.wg.Wait()
	}
}

// BenchmarkPropose measures 4 KiB proposals through three hosts (in-process network),
// one in flight per client, 32 clients spread over the groups. "memlog" isolates the
// host's own cost; "wal" adds the shared WAL's fdatasync (group commit) on this disk.
func BenchmarkPropose(b *testing.B) {
	for _, logKind := range []string{"memlog", "wal"} {
		for _, ngroups := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/groups=%d", logKind, ngroups), func(b *testing.B) {
				dir := b.TempDir()
				var wals []*wal.WAL
				newLog := func(id uint64) LogStore {
					if logKind == "memlog" {
						return memlog.New()
					}
					w, err := wal.Open(wal.Config{Dir: filepath.Join(dir, fmt.Sprint(id)), Logger: slog.New(slog.DiscardHandler)})
					if err != nil {
						b.Fatal(err)
					}
					wals = append(wals, w)
					return w
				}
				hosts, leaders, stop := benchCluster(b, ngroups, newLog)
				defer func() {
					stop()
					for _, w := range wals {
						w.Close()
					}
				}()
				var next atomic.Uint64
				b.SetBytes(4096)
				b.SetParallelism(16) // 32 clients on 2 CPUs
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					g := next.Add(1)%uint64(ngroups) + 1
					done := make(chan error, 1)
					i := 0
					for pb.Next() {
						i++
						data := make([]byte, ProposalHeader+4096) // the host keeps it
						copy(data[ProposalHeader:], fmt.Sprintf("%08d", i%1000))
						hosts[leaders[g]].Propose(g, data, func(err error) { done <- err })
						if err := <-done; err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.StopTimer()
				s := hosts[leaders[1]].Stats()
				b.ReportMetric(float64(s.ProposeCommit.Quantile(0.99).Microseconds()), "p99-µs")
				var rounds, groups uint64
				for _, h := range hosts {
					st := h.Stats()
					rounds += st.ReadyRounds
					groups += st.ReadyGroups
				}
				b.ReportMetric(float64(groups)/float64(rounds), "groups/round")
			})
		}
	}
}
