package bufpool

import (
	"fmt"
	"testing"
)

func TestGetSizesAndClasses(t *testing.T) {
	for _, tc := range []struct{ n, cap int }{
		{1, 4 << 10}, {4 << 10, 4 << 10}, {4<<10 + 1, 8 << 10}, {100 << 10, 128 << 10},
		{MaxPooled, MaxPooled}, {MaxPooled + 1, MaxPooled + 1},
	} {
		p := Get(tc.n)
		if len(*p) != tc.n || cap(*p) != tc.cap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.n, len(*p), cap(*p), tc.n, tc.cap)
		}
		Put(p)
	}
}

// A buffer put back serves the next Get of its class, whatever its length
// was; buffers of other capacities are not kept.
func TestPutReuses(t *testing.T) {
	p := Get(5000) // class 8 KiB
	(*p)[0] = 42
	Put(p)
	q := Get(8 << 10)
	if len(*q) != 8<<10 || cap(*q) != 8<<10 {
		t.Fatalf("Get after Put: len %d cap %d", len(*q), cap(*q))
	}
	Put(q)

	odd := make([]byte, 5000)
	Put(&odd) // not a class size: dropped
	r := Get(5000)
	if cap(*r) != 8<<10 {
		t.Fatalf("a foreign buffer of cap %d was pooled", cap(*r))
	}
}

func TestGetPutAllocatesNothingWhenWarm(t *testing.T) {
	if raceEnabled {
		t.Skip("skipped under the race detector: its sync.Pool drops a random share of Puts")
	}
	Put(Get(64 << 10))
	if n := testing.AllocsPerRun(100, func() { Put(Get(64 << 10)) }); n != 0 {
		t.Fatalf("Get+Put of a warm class: %v allocations, want 0", n)
	}
}

func BenchmarkGetPut(b *testing.B) {
	for _, n := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", n>>10), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Put(Get(n))
			}
		})
	}
}

// Under the race detector a buffer put back is poisoned: a use after Put
// sees Poison, whether or not the pool hands the buffer out again.
func TestPutPoisonsUnderRace(t *testing.T) {
	if !raceEnabled {
		t.Skip("Put poisons only under the race detector (go test -race)")
	}
	p := Get(5000)
	kept := (*p)[:cap(*p)]
	for i := range kept {
		kept[i] = 1
	}
	Put(p)
	for i, c := range kept {
		if c != Poison {
			t.Fatalf("byte %d of a buffer put back is %#x, want Poison", i, c)
		}
	}
}
