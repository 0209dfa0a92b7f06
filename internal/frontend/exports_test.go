package frontend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

// testBackend is a Backend whose death (a fence) and closing tests control.
type testBackend struct {
	name   string
	gen    int // which opening of the name it is
	info   Info
	dead   atomic.Pointer[error]
	closes atomic.Int32
}

func (b *testBackend) Submit(op api.Op, buf []byte, off, length int64, done func(error)) {
	if p := b.dead.Load(); p != nil {
		done(*p)
		return
	}
	done(nil)
}
func (b *testBackend) Info() Info { return b.info }
func (b *testBackend) Check(context.Context) error {
	if p := b.dead.Load(); p != nil {
		return *p
	}
	return nil
}
func (b *testBackend) Close() error { b.closes.Add(1); return nil }

// testOpener opens testBackends; gate, if set for a name, holds its opens until closed.
type testOpener struct {
	mu     sync.Mutex
	opens  map[string]int
	opened []*testBackend
	gate   map[string]chan struct{}
	stats  atomic.Int32
	info   Info
}

func newOpener() *testOpener {
	return &testOpener{opens: map[string]int{}, gate: map[string]chan struct{}{},
		info: Info{Size: 1 << 20, CanFlush: true}}
}

func (o *testOpener) Open(ctx context.Context, name string) (Backend, error) {
	if name == "missing" {
		return nil, fmt.Errorf("%w: %q", ErrNoSuchExport, name)
	}
	o.mu.Lock()
	gate := o.gate[name]
	o.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.opens[name]++
	b := &testBackend{name: name, gen: o.opens[name], info: o.info}
	o.opened = append(o.opened, b)
	return b, nil
}

func (o *testOpener) Stat(ctx context.Context, name string) (Info, error) {
	o.stats.Add(1)
	if name == "missing" {
		return Info{}, ErrNoSuchExport
	}
	return o.info, nil
}
func (o *testOpener) List(context.Context) ([]string, error) { return []string{"a", "b"}, nil }
func (o *testOpener) Classify(err error) error               { return err }

func (o *testOpener) openCount(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.opens[name]
}

func newExports(o *testOpener) (*Exports, *testutil.LogBuffer) {
	var logs testutil.LogBuffer
	return NewExports(ExportsConfig{Opener: o, Logger: slog.New(slog.NewTextHandler(&logs, nil))}), &logs
}

func attach(t *testing.T, e *Exports, name string) *Attachment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := e.Attach(ctx, name)
	if err != nil {
		t.Fatalf("attach %q: %v", name, err)
	}
	return a
}

func TestAttachSharesOneBackendAndLastDetachCloses(t *testing.T) {
	o := newOpener()
	e, logs := newExports(o)
	a1, a2 := attach(t, e, "vol"), attach(t, e, "vol")
	if a1.Backend() != a2.Backend() {
		t.Fatal("two attachments to one export got different backends")
	}
	if n := o.openCount("vol"); n != 1 {
		t.Fatalf("the export was opened %d times, want 1", n)
	}
	b := a1.Backend().(*testBackend)
	a1.Detach()
	a1.Detach() // a second Detach is harmless
	if n := b.closes.Load(); n != 0 {
		t.Fatalf("backend closed while an attachment still holds it")
	}
	a2.Detach()
	if n := b.closes.Load(); n != 1 {
		t.Fatalf("backend closed %d times after the last detach, want 1", n)
	}
	if !strings.Contains(logs.String(), "last attachment detached") {
		t.Errorf("no log line says why the export closed:\n%s", logs)
	}
	// The next attachment opens it again.
	a3 := attach(t, e, "vol")
	defer a3.Detach()
	if a3.Backend() == b || o.openCount("vol") != 2 {
		t.Fatalf("attach after the last detach did not open the export again")
	}
}

func TestAttachUnknownExport(t *testing.T) {
	e, _ := newExports(newOpener())
	if _, err := e.Attach(context.Background(), "missing"); !errors.Is(err, ErrNoSuchExport) {
		t.Fatalf("attach of an unknown export: %v, want ErrNoSuchExport", err)
	}
	if _, err := e.Describe(context.Background(), "missing"); !errors.Is(err, ErrNoSuchExport) {
		t.Fatalf("describe of an unknown export: %v, want ErrNoSuchExport", err)
	}
}

// A slow open of one export holds up only the attachers of that export, and
// they all share it.
func TestSlowOpenStallsOnlyItsOwnExport(t *testing.T) {
	o := newOpener()
	gate := make(chan struct{})
	o.gate["slow"] = gate
	e, _ := newExports(o)

	type res struct {
		a   *Attachment
		err error
	}
	slow := make(chan res, 3)
	for range 3 {
		go func() {
			a, err := e.Attach(context.Background(), "slow")
			slow <- res{a, err}
		}()
	}
	time.Sleep(20 * time.Millisecond) // let them start waiting
	start := time.Now()
	fast := attach(t, e, "fast")
	// The slow open is held until the gate closes: an attach it stalled
	// would not return at all; the bound only has to be generous.
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("attaching another export took %s while one was opening", d)
	}
	fast.Detach()
	select {
	case r := <-slow:
		t.Fatalf("an attacher of the slow export returned before its open finished: %v", r.err)
	default:
	}
	// One waiter gives up; the others still get the shared open.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.Attach(ctx, "slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an attacher whose context ended: %v, want DeadlineExceeded", err)
	}
	close(gate)
	var first Backend
	for range 3 {
		r := <-slow
		if r.err != nil {
			t.Fatal(r.err)
		}
		if first == nil {
			first = r.a.Backend()
		} else if r.a.Backend() != first {
			t.Fatal("attachers of one export got different backends")
		}
		defer r.a.Detach()
	}
	if n := o.openCount("slow"); n != 1 {
		t.Fatalf("the slow export was opened %d times, want 1 shared open", n)
	}
}

// An attacher that gives up does not leak the backend the shared open
// produces later.
func TestAbandonedOpenIsClosed(t *testing.T) {
	o := newOpener()
	gate := make(chan struct{})
	o.gate["vol"] = gate
	e, _ := newExports(o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.Attach(ctx, "vol"); err == nil {
		t.Fatal("attach returned before the open finished")
	}
	close(gate)
	deadline := time.Now().Add(60 * time.Second)
	for {
		o.mu.Lock()
		var closed bool
		if len(o.opened) == 1 {
			closed = o.opened[0].closes.Load() == 1
		}
		o.mu.Unlock()
		if closed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the backend opened for an attacher that gave up was never closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A fenced backend stays with the attachments that hold it (their IO keeps
// failing), and a new attachment gets a fresh one, with a log line.
func TestFencedExportReopens(t *testing.T) {
	o := newOpener()
	e, logs := newExports(o)
	old := attach(t, e, "vol")
	fenced := fmt.Errorf("%w: epoch 7 took over", ErrFenced)
	ob := old.Backend().(*testBackend)
	ob.dead.Store(&fenced)

	fresh := attach(t, e, "vol")
	if fresh.Backend() == old.Backend() {
		t.Fatal("a new attachment joined the fenced backend")
	}
	if n := o.openCount("vol"); n != 2 {
		t.Fatalf("opened %d times, want 2 (the re-open)", n)
	}
	if !strings.Contains(logs.String(), "opening the export again") || !strings.Contains(logs.String(), "epoch 7 took over") {
		t.Errorf("no log line says the export was re-opened and why:\n%s", logs)
	}
	var got error
	old.Backend().Submit(api.OpWrite, make([]byte, 1), 0, 1, func(err error) { got = err })
	if !errors.Is(got, ErrFenced) {
		t.Errorf("IO on the old attachment: %v, want ErrFenced", got)
	}
	// Later attachments join the fresh backend, and each backend closes with
	// its own last attachment.
	again := attach(t, e, "vol")
	if again.Backend() != fresh.Backend() {
		t.Fatal("an attachment after the re-open did not join the fresh backend")
	}
	old.Detach()
	if ob.closes.Load() != 1 {
		t.Fatal("the fenced backend was not closed when its last attachment detached")
	}
	fresh.Detach()
	again.Detach()
	if fresh.Backend().(*testBackend).closes.Load() != 1 {
		t.Fatal("the fresh backend was not closed after its last detach")
	}
}

func TestDescribeNeverOpens(t *testing.T) {
	o := newOpener()
	e, _ := newExports(o)
	info, err := e.Describe(context.Background(), "vol")
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 1<<20 || info.BlockSizes.Minimum != 1 || info.BlockSizes.Preferred != 4096 {
		t.Errorf("describe: %+v, want the opener's size with default block sizes", info)
	}
	if n := o.openCount("vol"); n != 0 || o.stats.Load() != 1 {
		t.Fatalf("describe opened the export %d times (stats %d); it must only look at metadata", n, o.stats.Load())
	}
}

func TestBlockSizesChecked(t *testing.T) {
	for _, bs := range []BlockSizes{
		{Minimum: 3},
		{Minimum: 128 << 10},
		{Preferred: 256},
		{Minimum: 512, Preferred: 4096, Maximum: 1000},
		{Preferred: 8192, Maximum: 4096},
	} {
		o := newOpener()
		o.info.BlockSizes = bs
		e, _ := newExports(o)
		if _, err := e.Describe(context.Background(), "vol"); !errors.Is(err, ErrBadInfo) {
			t.Errorf("describe with block sizes %+v: %v, want ErrBadInfo", bs, err)
		}
		if _, err := e.Attach(context.Background(), "vol"); !errors.Is(err, ErrBadInfo) {
			t.Errorf("attach with block sizes %+v: %v, want ErrBadInfo", bs, err)
		}
	}
	o := newOpener()
	o.info.BlockSizes = BlockSizes{Minimum: 512, Maximum: 1 << 20}
	e, _ := newExports(o)
	info, err := e.Describe(context.Background(), "vol")
	if err != nil || info.BlockSizes != (BlockSizes{Minimum: 512, Preferred: 4096, Maximum: 1 << 20}) {
		t.Errorf("describe: %+v, %v; want the preferred size defaulted to 4096", info.BlockSizes, err)
	}
}

func TestCloseClosesHeldBackendsAndRefusesAttach(t *testing.T) {
	o := newOpener()
	e, _ := newExports(o)
	a := attach(t, e, "vol")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if n := a.Backend().(*testBackend).closes.Load(); n != 1 {
		t.Fatalf("Close closed a held backend %d times, want 1", n)
	}
	a.Detach() // after Close: no second close
	if n := a.Backend().(*testBackend).closes.Load(); n != 1 {
		t.Fatalf("detach after Close closed the backend again (%d closes)", n)
	}
	if _, err := e.Attach(context.Background(), "vol"); !errors.Is(err, ErrClosed) {
		t.Fatalf("attach after Close: %v, want ErrClosed", err)
	}
}

// flakyOpener is a testOpener whose opens take a random while and sometimes fail.
type flakyOpener struct{ *testOpener }

var errFlakyOpen = errors.New("open failed")

func (f flakyOpener) Open(ctx context.Context, name string) (Backend, error) {
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
	if rand.IntN(20) == 0 {
		return nil, errFlakyOpen
	}
	return f.testOpener.Open(ctx, name)
}

// Many attachers at once, with opens that are slow or fail, attachers that give
// up, backends that get fenced and Close in the middle: no attachment ever gets
// a closed backend, and every backend opened is closed exactly once.
func TestAttachDetachStress(t *testing.T) {
	o := newOpener()
	e := NewExports(ExportsConfig{Opener: flakyOpener{o}, Logger: slog.New(slog.DiscardHandler)})
	var closing atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 13))
			for range 500 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(400))*time.Microsecond)
				a, err := e.Attach(ctx, fmt.Sprint("vol", r.IntN(3)))
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded), errors.Is(err, errFlakyOpen),
					errors.Is(err, ErrFenced), errors.Is(err, ErrClosed):
					continue // gave up, failed open, fenced again at once, closed
				case err != nil:
					errs <- err
					return
				}
				b := a.Backend().(*testBackend)
				if b.closes.Load() != 0 && !closing.Load() {
					errs <- fmt.Errorf("attached to %s#%d, which was closed", b.name, b.gen)
				}
				if r.IntN(50) == 0 {
					fenced := fmt.Errorf("%w: by the stress test", ErrFenced)
					b.dead.Store(&fenced)
				}
				a.Detach()
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	closing.Store(true)
	e.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Opens abandoned by every attacher finish (and close) on their own goroutine.
	deadline := time.Now().Add(60 * time.Second)
	for {
		o.mu.Lock()
		var bad []string
		for _, b := range o.opened {
			if n := b.closes.Load(); n != 1 {
				bad = append(bad, fmt.Sprintf("%s#%d closed %d times", b.name, b.gen, n))
			}
		}
		opened := len(o.opened)
		o.mu.Unlock()
		if len(bad) == 0 {
			t.Logf("%d backends opened, each closed once", opened)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("of %d backends: %v", opened, bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
