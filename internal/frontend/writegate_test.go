package frontend

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// WriteGate's contract: the first Allow waits for an answer (and reports a
// failure to get one), later ones answer at once with the last answer while
// it is refreshed in the background; a failed refresh keeps the last answer,
// a successful one replaces it. A nil ask allows every write.
func TestWriteGate(t *testing.T) {
	if ok, err := NewWriteGate(nil, "v", "h", time.Second, time.Second, slog.New(slog.DiscardHandler)).Allow(); !ok || err != nil {
		t.Fatalf("nil ask: %v %v; want allowed", ok, err)
	}
	type answer struct {
		ok  bool
		err error
	}
	var next atomic.Pointer[answer]
	var asked atomic.Int32
	g := NewWriteGate(func(_ context.Context, volume, host string) (bool, error) {
		if volume != "v" || host != "h" {
			t.Errorf("asked about %s, %s", volume, host)
		}
		asked.Add(1)
		a := next.Load()
		return a.ok, a.err
	}, "v", "h", time.Millisecond, time.Second, slog.New(slog.DiscardHandler))
	down := errors.New("the MDS does not answer")

	next.Store(&answer{err: down})
	if ok, err := g.Allow(); ok || !errors.Is(err, down) {
		t.Fatalf("first Allow with the MDS down: %v %v; want the error", ok, err)
	}
	next.Store(&answer{ok: true})
	if ok, err := g.Allow(); !ok || err != nil {
		t.Fatalf("first answer: %v %v; want allowed", ok, err)
	}
	// Refreshes fail: the last answer stays.
	next.Store(&answer{err: down})
	n := asked.Load()
	for stop := time.Now().Add(60 * time.Second); asked.Load() < n+3; {
		if time.Now().After(stop) {
			t.Fatalf("asked %d times in 60 s; want refreshes every millisecond", asked.Load()-n)
		}
		if ok, err := g.Allow(); !ok || err != nil {
			t.Fatalf("Allow while refreshes fail: %v %v; want the last answer, allowed", ok, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	// A refresh says no: soon every write is refused.
	next.Store(&answer{ok: false})
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, err := g.Allow()
		if err != nil {
			t.Fatalf("Allow with an answer: %v", err)
		}
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Allow still allows 60 s after the answer became no")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
