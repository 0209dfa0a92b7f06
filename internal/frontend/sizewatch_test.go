package frontend

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// growDisk is a Backend whose size a test grows, and its own Opener (every
// name opens it); it counts Checks, opens and Stats.
type growDisk struct {
	size                 atomic.Int64
	checks, opens, stats atomic.Int32
}

func newGrowDisk(size int64) *growDisk {
	d := &growDisk{}
	d.size.Store(size)
	return d
}

func (d *growDisk) Submit(_ api.Op, _ []byte, _, _ int64, done func(error)) { done(nil) }
func (d *growDisk) Info() Info                                              { return Info{Size: d.size.Load()} }
func (d *growDisk) Check(context.Context) error                             { d.checks.Add(1); return nil }
func (d *growDisk) Close() error                                            { return nil }
func (d *growDisk) Open(context.Context, string) (Backend, error)           { d.opens.Add(1); return d, nil }
func (d *growDisk) Stat(context.Context, string) (Info, error)              { d.stats.Add(1); return d.Info(), nil }
func (d *growDisk) List(context.Context) ([]string, error)                  { return []string{"vol"}, nil }
func (d *growDisk) Classify(err error) error                                { return err }

func watchExports(o Opener, every time.Duration) *Exports {
	return NewExports(ExportsConfig{Opener: o, Logger: slog.New(slog.DiscardHandler), SizeCheck: every})
}

func watchCount(e *Exports) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.watches)
}

// waitUntil polls cond for up to a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after a minute", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Every subscriber of a name shares one watcher, which re-reads the size
// through the open backend (Check, then Info) and hands it to each; the last
// subscriber to leave ends it.
func TestWatchSizeOneWatcherPerExport(t *testing.T) {
	d := newGrowDisk(1 << 20)
	e := watchExports(d, time.Millisecond)
	defer e.Close()
	a := attach(t, e, "vol")
	defer a.Detach()

	var seen [3]atomic.Int64
	var stops []func()
	for i := range seen {
		stops = append(stops, e.WatchSize("vol", func(size int64) { seen[i].Store(size) }))
	}
	stops = append(stops, e.WatchSize("vol", nil)) // only keeps the backend's size fresh
	if n := watchCount(e); n != 1 {
		t.Fatalf("%d watchers for one export's 4 subscribers, want 1", n)
	}
	e.mu.Lock()
	w := e.watches["vol"]
	e.mu.Unlock()

	d.size.Store(3 << 20)
	waitUntil(t, "every subscriber sees the grown size", func() bool {
		for i := range seen {
			if seen[i].Load() != 3<<20 {
				return false
			}
		}
		return true
	})
	if d.checks.Load() == 0 || d.stats.Load() != 0 {
		t.Fatalf("%d Checks and %d Stats: an open export's size is re-read through its backend", d.checks.Load(), d.stats.Load())
	}

	stops[0]()
	stops[0]() // a second stop is harmless
	if n := watchCount(e); n != 1 {
		t.Fatalf("%d watchers while 3 subscribers remain, want 1", n)
	}
	for _, stop := range stops[1:] {
		stop()
	}
	if n := watchCount(e); n != 0 {
		t.Fatalf("%d watchers after every subscriber left", n)
	}
	select {
	case <-w.stop:
	default:
		t.Fatal("the watcher was not told to stop after its last subscriber left")
	}
}

// With no backend open (an NVMe multipath controller attaches at its first
// I/O), the watcher reads the size from the metadata and never opens the
// export.
func TestWatchSizeReadsMetadataWhenNotOpen(t *testing.T) {
	d := newGrowDisk(1 << 20)
	e := watchExports(d, time.Millisecond)
	defer e.Close()
	var seen atomic.Int64
	stop := e.WatchSize("vol", func(size int64) { seen.Store(size) })
	defer stop()
	d.size.Store(2 << 20)
	waitUntil(t, "the subscriber sees the grown size", func() bool { return seen.Load() == 2<<20 })
	if d.opens.Load() != 0 || d.checks.Load() != 0 {
		t.Fatalf("the watch opened the export (%d opens, %d Checks)", d.opens.Load(), d.checks.Load())
	}
}

// Close ends every watch; after it, and with a negative SizeCheck, WatchSize
// watches nothing.
func TestWatchSizeEndsAtClose(t *testing.T) {
	d := newGrowDisk(1 << 20)
	e := watchExports(d, time.Hour)
	stop := e.WatchSize("vol", nil)
	e.mu.Lock()
	w := e.watches["vol"]
	e.mu.Unlock()
	e.Close()
	select {
	case <-w.stop:
	default:
		t.Fatal("Close did not stop the watcher")
	}
	stop() // after Close: harmless
	e.WatchSize("vol", nil)()
	if n := watchCount(e); n != 0 {
		t.Fatalf("%d watchers after Close", n)
	}
	never := watchExports(d, -1)
	defer never.Close()
	defer never.WatchSize("vol", nil)()
	if n := watchCount(never); n != 0 {
		t.Fatalf("%d watchers with SizeCheck negative", n)
	}
}
