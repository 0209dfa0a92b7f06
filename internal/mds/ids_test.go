package mds

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestCreateVolumesConcurrently creates many volumes from many goroutines:
// every create succeeds, ids are unique, and the rate is reported (no timing
// assertion).
func TestCreateVolumesConcurrently(t *testing.T) {
	c := startWithPool(t, Config{}, 3)
	const (
		volumes = 1000
		workers = 32
	)
	var (
		next atomic.Int64
		mu   sync.Mutex
		ids  = map[uint64]string{}
		wg   sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= volumes {
					return
				}
				name := fmt.Sprintf("v%04d", i)
				r, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: name, Size: 4096})
				if err != nil {
					t.Errorf("create %s: %v", name, err)
					return
				}
				mu.Lock()
				if other, ok := ids[r.Volume.Id]; ok {
					t.Errorf("volume id %d given to %s and %s", r.Volume.Id, other, name)
				}
				ids[r.Volume.Id] = name
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	t.Logf("%d volumes created by %d goroutines in %v: %.0f creates/s", volumes, workers, d.Round(time.Millisecond), volumes/d.Seconds())
}
