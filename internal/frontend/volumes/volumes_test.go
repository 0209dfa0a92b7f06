package volumes_test

// The adapter against a real cluster (MDS and three chunkserver processes):
// the writer role is taken on the first write, never by attaching or reading;
// a fenced export re-opens for a new attachment; a resize reaches an open export.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/volumes"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/api"
)

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type fixture struct {
	t       *testing.T
	c       *testcluster.Cluster
	exports *frontend.Exports
	logs    *logBuffer
}

func newFixture(t *testing.T, c *testcluster.Cluster, readOnly bool) *fixture {
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	e := frontend.NewExports(frontend.ExportsConfig{Logger: log, Opener: volumes.New(volumes.Config{
		MDS: c.API, ReadOnly: readOnly, ClientName: t.Name(), Logger: log,
	})})
	t.Cleanup(func() { e.Close() })
	return &fixture{t: t, c: c, exports: e, logs: logs}
}

func (f *fixture) attach(name string) *frontend.Attachment {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := f.exports.Attach(ctx, name)
	if err != nil {
		f.t.Fatalf("attach %q: %v", name, err)
	}
	f.t.Cleanup(a.Detach)
	return a
}

// do runs one IO on a's backend and returns its error, classified.
func do(a *frontend.Attachment, op api.Op, buf []byte, off int64) error {
	ch := make(chan error, 1)
	a.Backend().Submit(op, buf, off, int64(len(buf)), func(err error) { ch <- err })
	if err := <-ch; err != nil {
		return a.Classify(err)
	}
	return nil
}

func (f *fixture) epoch(name string) uint64 {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := f.c.API.GetVolume(ctx, &api.GetVolumeRequest{Name: name})
	if err != nil {
		f.t.Fatal(err)
	}
	return r.Volume.Epoch
}

func TestVolumesOnACluster(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{})
	for _, name := range []string{"quiet", "fenced", "grow", "ro"} {
		c.CreateVolume(name, 64<<20)
	}
	// A chunkserver learns of a new volume at its next heartbeat (or at once,
	// at most once a second, when IO names it): wait until every copyset's
	// leader serves each volume.
	for _, name := range []string{"quiet", "fenced", "grow", "ro"} {
		v := c.Open(name, true)
		eventually(t, "reads of "+name+" on every copyset", func() error {
			for off := int64(0); off < v.Size(); off += int64(c.Pool.ChunkSize) {
				if _, err := v.ReadAt(make([]byte, 1), off); err != nil {
					return err
				}
			}
			return nil
		})
	}

	t.Run("attaching and reading take no writer role", func(t *testing.T) {
		f := newFixture(t, c, false)
		writer := c.Open("quiet", false) // a writer served elsewhere
		if _, err := writer.WriteAt([]byte("theirs"), 0); err != nil {
			t.Fatal(err)
		}
		before := f.epoch("quiet")
		info, err := f.exports.Describe(context.Background(), "quiet")
		if err != nil || info.Size != 64<<20 || info.ReadOnly {
			t.Fatalf("describe: %+v, %v", info, err)
		}
		a := f.attach("quiet")
		buf := make([]byte, 6)
		if err := do(a, api.OpRead, buf, 0); err != nil || string(buf) != "theirs" {
			t.Fatalf("read through the export: %q, %v", buf, err)
		}
		if err := do(a, api.OpFlush, nil, 0); err != nil {
			t.Fatalf("flush before any write: %v", err)
		}
		if e := f.epoch("quiet"); e != before {
			t.Fatalf("describing, attaching, reading and flushing moved the writer epoch from %d to %d", before, e)
		}
		if _, err := writer.WriteAt([]byte("still"), 4096); err != nil {
			t.Fatalf("the other writer was disturbed: %v", err)
		}
		// The first write takes the role: the other writer is fenced.
		if err := do(a, api.OpWrite, []byte("mine"), 0); err != nil {
			t.Fatalf("first write through the export: %v", err)
		}
		if e := f.epoch("quiet"); e != before+1 {
			t.Fatalf("epoch %d after the export's first write, want %d", e, before+1)
		}
		if _, err := writer.WriteAt([]byte("late"), 0); !errors.Is(err, api.ErrFenced) {
			t.Fatalf("the superseded writer's write: %v, want FENCED", err)
		}
		if err := do(a, api.OpRead, buf[:4], 0); err != nil || string(buf[:4]) != "mine" {
			t.Fatalf("read back: %q, %v", buf[:4], err)
		}
		if !strings.Contains(f.logs.String(), "took the writer role") {
			t.Errorf("no log line says the export took the writer role:\n%s", f.logs)
		}
	})

	t.Run("a fenced export re-opens for a new attachment", func(t *testing.T) {
		f := newFixture(t, c, false)
		old := f.attach("fenced")
		if err := do(old, api.OpWrite, []byte("one"), 0); err != nil {
			t.Fatal(err)
		}
		other := c.Open("fenced", false) // another host takes over
		if _, err := other.WriteAt([]byte("two"), 0); err != nil {
			t.Fatal(err)
		}
		if err := do(old, api.OpWrite, []byte("one"), 0); !errors.Is(err, frontend.ErrFenced) {
			t.Fatalf("write through the superseded export: %v, want ErrFenced", err)
		}
		fresh := f.attach("fenced")
		if fresh.Backend() == old.Backend() {
			t.Fatal("the new attachment joined the fenced backend")
		}
		if !strings.Contains(f.logs.String(), "opening the export again") {
			t.Errorf("no log line says the fenced export was re-opened:\n%s", f.logs)
		}
		if err := do(fresh, api.OpWrite, []byte("three"), 0); err != nil {
			t.Fatalf("write through the re-opened export: %v", err)
		}
		if err := do(old, api.OpRead, make([]byte, 3), 0); !errors.Is(err, frontend.ErrFenced) {
			t.Fatalf("the old attachment still works (%v); its client must reconnect", err)
		}
	})

	t.Run("a resize reaches an open export", func(t *testing.T) {
		f := newFixture(t, c, false)
		first := f.attach("grow")

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.API.ResizeVolume(ctx, &api.ResizeVolumeRequest{Name: "grow", Size: 128 << 20}); err != nil {
			t.Fatal(err)
		}
		second := f.attach("grow")
		if second.Backend() != first.Backend() {
			t.Fatal("the second attachment did not share the open backend")
		}
		if n := second.Info().Size; n != 128<<20 {
			t.Fatalf("an attachment after the resize sees %d bytes, want %d", n, 128<<20)
		}
		// The chunkservers learn of the resize with their next heartbeat; until
		// then they refuse IO in the added part.
		eventually(t, "a write in the added part", func() error {
			return do(second, api.OpWrite, []byte("grown"), 100<<20)
		})
	})

	t.Run("a read-only export never writes", func(t *testing.T) {
		f := newFixture(t, c, true)
		before := f.epoch("ro")
		a := f.attach("ro")
		if !a.Info().ReadOnly || a.Info().CanTrim {
			t.Fatalf("read-only export info: %+v", a.Info())
		}
		if err := do(a, api.OpWrite, []byte("no"), 0); !errors.Is(err, frontend.ErrReadOnly) {
			t.Fatalf("write on a read-only export: %v, want ErrReadOnly", err)
		}
		if e := f.epoch("ro"); e != before {
			t.Fatalf("a read-only export moved the writer epoch from %d to %d", before, e)
		}
	})

	t.Run("unknown volumes and the list", func(t *testing.T) {
		f := newFixture(t, c, false)
		if _, err := f.exports.Attach(context.Background(), "nope"); !errors.Is(err, frontend.ErrNoSuchExport) {
			t.Fatalf("attach of an unknown volume: %v, want ErrNoSuchExport", err)
		}
		if _, err := f.exports.Describe(context.Background(), "nope"); !errors.Is(err, frontend.ErrNoSuchExport) {
			t.Fatalf("describe of an unknown volume: %v, want ErrNoSuchExport", err)
		}
		names, err := f.exports.List(context.Background())
		if err != nil || !strings.Contains(strings.Join(names, ","), "quiet") {
			t.Fatalf("list: %v, %v", names, err)
		}
	})
}

// eventually retries f for up to 10 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still fails after 10 s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
