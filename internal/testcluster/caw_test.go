package testcluster

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// The block a compare-and-write counter lives in: cawBlock bytes, the
// counter in its first half (value, then a checksum of it), a marker that
// only plain writes change in its second half. A compare-and-write covers
// the whole block, so every plain write of the marker overlaps it.
const (
	cawBlock  = 512
	cawMarker = cawBlock / 2
)

// counterHalf is the first half of the block for counter value n.
func counterHalf(n uint64) []byte {
	b := make([]byte, cawMarker)
	binary.BigEndian.PutUint64(b, n)
	sum := sha256.Sum256(b[:8])
	for i := 8; i < len(b); i += len(sum) {
		copy(b[i:], sum[:])
	}
	return b
}

// markerHalf is the second half for marker m.
func markerHalf(m uint64) []byte {
	b := make([]byte, cawBlock-cawMarker)
	for i := 0; i < len(b); i += 8 {
		binary.BigEndian.PutUint64(b[i:], m^uint64(i))
	}
	return b
}

// decodeBlock returns the counter and the marker a block holds, or why it
// holds neither (a torn or lost write).
func decodeBlock(b []byte) (n, m uint64, err error) {
	n = binary.BigEndian.Uint64(b)
	m = binary.BigEndian.Uint64(b[cawMarker:])
	if string(b[:cawMarker]) != string(counterHalf(n)) {
		return 0, 0, fmt.Errorf("counter half does not hold counter %d", n)
	}
	if string(b[cawMarker:]) != string(markerHalf(m)) {
		return 0, 0, fmt.Errorf("marker half does not hold marker %d", m)
	}
	return n, m, nil
}

// TestCompareAndWriteCounter: goroutines increment a counter by read →
// CompareAndWrite(old → old+1), retrying on a miscompare, while a plain
// writer keeps rewriting the same block's other half (a marker, so each of
// its writes overlaps every compare-and-write) and others hammer the
// neighbouring blocks of the same chunk; the copyset's leader is killed and
// restarted midway. What a user checks: the counter equals the number of
// compare-and-writes that succeeded (none lost, none doubled), and the
// marker is the last one acknowledged (no compare-and-write wrote back a
// marker it read before a plain write replaced it).
//
// A volume has one writer session (a second would fence the first), so the
// concurrent writers share one handle, as the iSCSI sessions of one access
// node share a backend.
func TestCompareAndWriteCounter(t *testing.T) {
	c := Start(t, Options{})
	c.OpTimeout = 120 * time.Second // a leader kill is retried through, never an ambiguous timeout
	const size = 64 << 20
	chunk := int64(c.Pool.ChunkSize)
	vol := c.CreateVolume("caw", size)
	v := c.Open("caw", false)
	off := chunk + 8192 // in chunk 1, between its neighbours
	cs := api.CopysetOf(vol.Id, uint64(off/chunk), c.Pool.CopysetCount)

	initial := append(counterHalf(0), markerHalf(0)...)
	if _, err := v.WriteAt(initial, off); err != nil {
		t.Fatal(err)
	}

	const incrementers, perGoroutine = 4, 60
	var (
		wg                   sync.WaitGroup
		stop                 = make(chan struct{})
		succeeded, miscomp   atomic.Int64
		ambiguous            atomic.Int64 // failed with an error that does not say whether it wrote
		lastMarker, markerWr atomic.Uint64
		neighbourWrites      atomic.Int64
		errMu                sync.Mutex
		firstErr             error
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	for g := range incrementers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			old := make([]byte, cawBlock)
			for done := 0; done < perGoroutine; {
				if _, err := v.ReadAt(old, off); err != nil {
					fail(fmt.Errorf("incrementer %d: read: %w", g, err))
					return
				}
				n, _, err := decodeBlock(old)
				if err != nil {
					fail(fmt.Errorf("incrementer %d: the block is damaged: %w", g, err))
					return
				}
				next := append(counterHalf(n+1), old[cawMarker:]...)
				var me *client.MiscompareError
				switch err := v.CompareAndWrite(old, next, off); {
				case err == nil:
					succeeded.Add(1)
					done++
				case errors.As(err, &me):
					miscomp.Add(1)
				default:
					ambiguous.Add(1)
					t.Logf("incrementer %d: compare-and-write of %d failed: %v", g, n+1, err)
				}
			}
		}()
	}
	// The marker writer: one plain write at a time, so the last one
	// acknowledged is what the block must end with.
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewSource(1))
		for m := uint64(1); ; m++ {
			select {
			case <-stop:
				return
			default:
			}
			// Paced (up to 2 ms between writes), so that the incrementers
			// are not starved of windows without a marker write in them.
			time.Sleep(time.Duration(rng.Intn(2000)) * time.Microsecond)
			if _, err := v.WriteAt(markerHalf(m), off+cawMarker); err != nil {
				fail(fmt.Errorf("marker write %d: %w", m, err))
				return
			}
			lastMarker.Store(m)
			markerWr.Add(1)
		}
	}()
	// Neighbours: the rest of the 4 KiB block and the block before, same
	// chunk and copyset, never the counter's block.
	for _, nb := range []struct{ off, n int64 }{{off - 4096, 4096}, {off + cawBlock, 4096 - cawBlock}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(nb.off))
			p := make([]byte, nb.n)
			for {
				select {
				case <-stop:
					return
				default:
				}
				rng.Read(p)
				if _, err := v.WriteAt(p, nb.off); err != nil {
					fail(fmt.Errorf("neighbour write at %d: %w", nb.off, err))
					return
				}
				neighbourWrites.Add(1)
			}
		}()
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	stopAll := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-finished
	}
	defer stopAll()

	// Midway, kill the copyset's leader, and bring it back.
	c.Eventually(5*time.Minute, "a third of the increments", func(context.Context) error {
		if n := succeeded.Load(); n < incrementers*perGoroutine/3 {
			return fmt.Errorf("%d increments", n)
		}
		return nil
	})
	var leader uint64
	c.Eventually(time.Minute, "the copyset's leader known", func(context.Context) error {
		for _, s := range c.Status().Copysets {
			if s.Id == cs && s.LeaderHint != 0 {
				leader = s.LeaderHint
				return nil
			}
		}
		return fmt.Errorf("copyset %d has no leader hint", cs)
	})
	victim := c.ProcOf(leader)
	c.Kill(victim)
	t.Logf("killed %s, leader of copyset %d, after %d increments", victim.Name, cs, succeeded.Load())
	c.Eventually(5*time.Minute, "two thirds of the increments", func(context.Context) error {
		if n := succeeded.Load(); n < 2*incrementers*perGoroutine/3 {
			return fmt.Errorf("%d increments", n)
		}
		return nil
	})
	c.Start(victim)
	t.Logf("restarted %s after %d increments", victim.Name, succeeded.Load())

	// The incrementers end on their own; then the plain writers stop.
	c.Eventually(10*time.Minute, "every increment", func(context.Context) error {
		errMu.Lock()
		err := firstErr
		errMu.Unlock()
		if err != nil {
			return nil // reported below
		}
		if n := succeeded.Load(); n < incrementers*perGoroutine {
			return fmt.Errorf("%d increments", n)
		}
		return nil
	})
	stopAll()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	got := make([]byte, cawBlock)
	if _, err := v.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	n, m, err := decodeBlock(got)
	if err != nil {
		t.Fatalf("the block at the end: %v", err)
	}
	t.Logf("%d compare-and-writes succeeded, %d miscompared, %d failed; %d marker and %d neighbour writes",
		succeeded.Load(), miscomp.Load(), ambiguous.Load(), markerWr.Load(), neighbourWrites.Load())
	if ok, amb := int64(n)-succeeded.Load(), ambiguous.Load(); ok < 0 || ok > amb {
		t.Fatalf("counter %d after %d successful compare-and-writes (and %d that failed without saying whether they wrote): updates lost or doubled",
			n, succeeded.Load(), amb)
	}
	if want := lastMarker.Load(); m != want {
		t.Fatalf("marker %d, but the last plain write acknowledged wrote %d: a compare-and-write wrote back an older one", m, want)
	}
	if miscomp.Load() == 0 {
		t.Logf("no compare-and-write miscompared: the goroutines never raced (a quiet machine)")
	}
	c.WaitHealthy(180 * time.Second)
	c.CompareReplicas(180 * time.Second)
}
