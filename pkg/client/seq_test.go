package client

import (
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestRetryKeepsItsNumber: every attempt of a write, trim or write-zeroes
// piece carries the same Header.Seq (so the copyset applies it once), numbers
// grow per copyset, reads are not numbered, and Settled is the lowest number
// still outstanding in that copyset: below a write whose answer is pending,
// past it once it is answered.
func TestRetryKeepsItsNumber(t *testing.T) {
	c := newFakeCluster(t)
	cs := api.CopysetOf(tVolume, 0, tCS)
	var mu sync.Mutex
	var seen []api.Header // copyset cs's requests as they arrive
	c.setHook(func(_ uint64, h api.Header) action {
		if h.Copyset != cs || h.Op == api.OpFence {
			return serve
		}
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, h)
		switch {
		case h.Op == api.OpWrite && h.Seq == 1:
			if len(seen) == 1 {
				return ignore // the first attempt's answer is lost
			}
		case h.Op == api.OpWrite && h.Seq == 3:
			return gated
		}
		return serve
	})
	c.gate = make(chan struct{})
	v := c.open(t, func(cfg *Config) { cfg.IOTimeout = 50 * time.Millisecond })
	if _, err := v.WriteAt([]byte("one"), 0); err != nil {
		t.Fatal(err)
	}
	if err := v.Trim(0, 4096); err != nil {
		t.Fatal(err)
	}
	third := make(chan error, 1)
	v.Submit(api.OpWrite, []byte("three"), 4096, 5, func(err error) { third <- err })
	for arrived := false; !arrived; time.Sleep(time.Millisecond) { // request 3 waits for its answer
		mu.Lock()
		arrived = seen[len(seen)-1].Seq == 3
		mu.Unlock()
	}
	if _, err := v.WriteAt([]byte("four"), 8192); err != nil {
		t.Fatal(err)
	}
	close(c.gate)
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if _, err := v.WriteAt([]byte("five"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := v.ReadAt(make([]byte, 4), 0); err != nil {
		t.Fatal(err)
	}
	type req struct {
		op           api.Op
		seq, settled uint64
	}
	want := []req{
		{api.OpWrite, 1, 1}, {api.OpWrite, 1, 1}, // the retry: same number
		{api.OpTrim, 2, 2},
		{api.OpWrite, 3, 3},
		{api.OpWrite, 4, 3}, // request 3 is still unanswered
		{api.OpWrite, 5, 5},
		{api.OpRead, 0, 0},
	}
	mu.Lock()
	defer mu.Unlock()
	var got []req
	for _, h := range seen {
		if h.Op == api.OpWrite && h.Seq == 1 && len(got) >= 2 {
			continue // more retries of request 1 (a loaded machine): same number, fine
		}
		got = append(got, req{h.Op, h.Seq, h.Settled})
	}
	if len(got) != len(want) {
		t.Fatalf("copyset %d saw %v, want %v", cs, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("request %d: %+v, want %+v (all: %v)", i, got[i], want[i], got)
		}
	}
}
