package chunkserver

import (
	"testing"

	"github.com/basalt-storage/basalt/internal/raftstore"
)

func TestTransferTarget(t *testing.T) {
	g := raftstore.GroupStatus{Voters: []uint64{1, 2, 3}, Progress: map[uint64]uint64{1: 100, 2: 90, 3: 100},
		Active: map[uint64]bool{1: true, 2: true, 3: true}}
	if got := transferTarget(g, 1, map[uint64]int{}); got != 3 {
		t.Fatalf("target %d, want 3 (the caught-up peer)", got)
	}
	g.Progress[2] = 100
	if got := transferTarget(g, 1, map[uint64]int{2: 1}); got != 3 {
		t.Fatalf("target %d, want 3 (caught up, and given fewer leaderships than 2)", got)
	}
	if got := transferTarget(g, 1, map[uint64]int{3: 2}); got != 2 {
		t.Fatalf("target %d, want 2", got)
	}
	g.Active[2] = false
	if got := transferTarget(g, 1, map[uint64]int{3: 2}); got != 3 {
		t.Fatalf("target %d, want 3 (2 is not heard from)", got)
	}
	g.Active[3] = false
	if got := transferTarget(g, 1, nil); got != 0 {
		t.Fatalf("no peer heard from: target %d, want 0", got)
	}
	solo := raftstore.GroupStatus{Voters: []uint64{1}, Progress: map[uint64]uint64{1: 5}}
	if got := transferTarget(solo, 1, nil); got != 0 {
		t.Fatalf("single voter: target %d, want 0", got)
	}
}
