package chunkserver

import (
	"slices"
	"testing"
)

// TestWriteGate: writes share; a compare-and-write waits for the
// overlapping writes in, holds back overlapping newcomers (even writes,
// first come first served) and lets everything else pass; other volumes
// and adjacent ranges never conflict.
func TestWriteGate(t *testing.T) {
	var g writeGate
	var ran []string
	run := func(name string) func() { return func() { ran = append(ran, name) } }
	enter := func(name string, s gateSpan, excl bool) (uint64, bool) {
		t.Helper()
		id, w := g.enter(s, excl)
		if w == nil {
			return id, true
		}
		g.then(w, run(name))
		return id, false
	}
	w1, in := enter("w1", gateSpan{1, 0, 4096}, false)
	if !in {
		t.Fatal("a write with nothing in the gate waits")
	}
	w2, in := enter("w2", gateSpan{1, 1024, 2048}, false)
	if !in {
		t.Fatal("overlapping writes do not share")
	}
	c1, in := enter("c1", gateSpan{1, 2047, 2048 + 512}, true)
	if in {
		t.Fatal("a compare-and-write overlapping writes in flight did not wait")
	}
	if _, in := enter("w3", gateSpan{1, 2048 + 511, 8192}, false); in {
		t.Fatal("a write overlapping a waiting compare-and-write went ahead of it")
	}
	w4, in := enter("w4", gateSpan{1, 2048 + 512, 8192}, false) // adjacent: no overlap
	if !in {
		t.Fatal("a write next to a compare-and-write waits")
	}
	w5, in := enter("w5", gateSpan{2, 0, 8192}, false) // another volume
	if !in {
		t.Fatal("a write of another volume waits")
	}
	g.leave(w4)
	g.leave(w5)
	g.leave(w1)
	if len(ran) != 0 {
		t.Fatalf("%v let in while w2 is still in flight", ran)
	}
	g.leave(w2)
	if !slices.Equal(ran, []string{"c1"}) {
		t.Fatalf("after the writes: %v let in, want c1 only", ran)
	}
	g.leave(c1)
	if !slices.Equal(ran, []string{"c1", "w3"}) {
		t.Fatalf("after the compare-and-write: %v, want w3 let in", ran)
	}
	g.mu.Lock()
	active, queued, excl := len(g.active), len(g.queued), g.excl
	g.mu.Unlock()
	if active != 1 || queued != 0 || excl != 0 {
		t.Fatalf("gate: %d active, %d queued, %d exclusive; want w3 alone", active, queued, excl)
	}
}

// TestWriteGateAdmittedBeforeThen: a waiter let in before its caller
// handed it a function runs that function at once.
func TestWriteGateAdmittedBeforeThen(t *testing.T) {
	var g writeGate
	w1, _ := g.enter(gateSpan{1, 0, 512}, false)
	_, w := g.enter(gateSpan{1, 0, 512}, true)
	if w == nil {
		t.Fatal("did not wait")
	}
	g.leave(w1) // lets it in, with no function yet
	ran := false
	g.then(w, func() { ran = true })
	if !ran {
		t.Fatal("then did not run the function of a waiter already in")
	}
}
