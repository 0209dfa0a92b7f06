package volumes_test

// The adapter against a real cluster (MDS and three chunkserver processes):
// the writer role is taken on the first write, never by attaching or reading;
// a fenced export re-opens for a new attachment; a resize reaches an open export.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/volumes"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

type fixture struct {
	t       *testing.T
	c       *testcluster.Cluster
	exports *frontend.Exports
	logs    *testutil.LogBuffer
}

func newFixture(t *testing.T, c *testcluster.Cluster, readOnly bool) *fixture {
	return newFixtureWith(t, c, volumes.Config{ReadOnly: readOnly})
}

// newFixtureWith is newFixture with more of the Opener's Config (MDS, client
// name and logger are filled in).
func newFixtureWith(t *testing.T, c *testcluster.Cluster, cfg volumes.Config) *fixture {
	logs := &testutil.LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	cfg.MDS, cfg.ClientName, cfg.Logger = c.API, t.Name(), log
	cfg.DataTLS = adminDataTLS(c)
	e := frontend.NewExports(frontend.ExportsConfig{Logger: log, Opener: volumes.New(cfg)})
	t.Cleanup(func() { e.Close() })
	return &fixture{t: t, c: c, exports: e, logs: logs}
}

// adminDataTLS is the identity c.API speaks for (the admin), toward chunkservers.
func adminDataTLS(c *testcluster.Cluster) *tls.Config {
	return c.Identity(identity.RoleAdmin, "admin").ClientTLS(identity.RoleChunkserver)
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
	for _, name := range []string{"quiet", "fenced", "grow", "ro", "deleted", "closed", "away", "race"} {
		c.CreateVolume(name, 64<<20)
		waitServed(t, c, name)
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

	// Writes and flushes from several attachments race to be the export's first
	// mutation: the role is taken once, nothing is sent before it is, and every
	// write lands.
	t.Run("concurrent first writes take the writer role once", func(t *testing.T) {
		f := newFixture(t, c, false)
		before := f.epoch("race")
		as := []*frontend.Attachment{f.attach("race"), f.attach("race"), f.attach("race")}
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op, buf := api.OpWrite, []byte(fmt.Sprintf("w%03d", i))
				if i%8 == 0 {
					op, buf = api.OpFlush, nil
				}
				if err := do(as[i%3], op, buf, int64(i)*4096); err != nil {
					errs <- fmt.Errorf("%v #%d: %w", op, i, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if e := f.epoch("race"); e != before+1 {
			t.Fatalf("writer epoch %d after concurrent first writes, want %d (one claim)", e, before+1)
		}
		for i := range 64 {
			if i%8 == 0 {
				continue
			}
			buf := make([]byte, 4)
			if err := do(as[(i+1)%3], api.OpRead, buf, int64(i)*4096); err != nil || string(buf) != fmt.Sprintf("w%03d", i) {
				t.Fatalf("read of write #%d: %q, %v", i, buf, err)
			}
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

	// Every attachment holds a read-only session, and the MDS refuses to delete
	// a volume with any session (as `rbd rm` refuses an image with watchers), so
	// an attachment can never outlive its volume and write to a successor of the
	// same name. (Should a reader's lease lapse, its volume stops and never
	// claims; and openWriter compares volume ids besides.)
	t.Run("an attached volume cannot be deleted", func(t *testing.T) {
		f := newFixture(t, c, false)
		a := f.attach("deleted")
		if err := do(a, api.OpRead, make([]byte, 4), 0); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.API.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "deleted"})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("delete of an attached volume: %v, want FailedPrecondition", err)
		}
		if err := do(a, api.OpWrite, []byte("still"), 0); err != nil {
			t.Fatalf("write after a refused delete: %v", err)
		}
	})

	t.Run("a closed backend never takes the writer role", func(t *testing.T) {
		o := volumes.New(volumes.Config{MDS: c.API, DataTLS: adminDataTLS(c), ClientName: t.Name()})
		b, err := o.Open(context.Background(), "closed")
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		ch := make(chan error, 1)
		b.Submit(api.OpWrite, []byte("late"), 0, 4, func(err error) { ch <- err })
		if err := o.Classify(<-ch); !errors.Is(err, frontend.ErrShuttingDown) {
			t.Errorf("write on a closed backend: %v, want ErrShuttingDown", err)
		}
		f := newFixture(t, c, false)
		if e := f.epoch("closed"); e != 0 {
			t.Fatalf("a write on a closed backend moved the writer epoch to %d", e)
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

	// Runs last: it stops the MDS for a moment.
	t.Run("a first write while the MDS is away fails as unavailable; the next takes the role", func(t *testing.T) {
		f := newFixtureWith(t, c, volumes.Config{ClaimTimeout: time.Second})
		a := f.attach("away")
		c.Pause(c.MDS)
		// SIGSTOP takes effect asynchronously: wait until the MDS stops answering.
		eventually(t, "the stopped MDS not answering", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if _, err := c.API.GetVolume(ctx, &api.GetVolumeRequest{Name: "away"}); err == nil {
				return errors.New("it still answers")
			}
			return nil
		})
		err := do(a, api.OpWrite, []byte("x"), 0)
		c.Resume(c.MDS)
		if !errors.Is(err, frontend.ErrUnavailable) {
			t.Fatalf("first write with the MDS stopped: %v, want ErrUnavailable (a multipath host retries that on another path)", err)
		}
		if !strings.Contains(f.logs.String(), "the next write tries again") {
			t.Errorf("no log line says the writer role could not be taken and what happens next:\n%s", f.logs)
		}
		eventually(t, "a write after the MDS is back", func() error {
			return do(a, api.OpWrite, []byte("y"), 0)
		})
	})
}

// waitServed returns once every copyset's leader serves the named volume: a
// chunkserver learns of a new volume at its next heartbeat (or at once, at most
// once a second, when IO names it).
func waitServed(t *testing.T, c *testcluster.Cluster, name string) {
	t.Helper()
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

// eventually retries f for up to 10 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still fails after 60 s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
