package latency

import (
	"testing"
	"time"
)

func TestBoundsDoubleFrom5usTo42s(t *testing.T) {
	b := Bounds()
	if len(b) != 24 || b[0] != 5*time.Microsecond {
		t.Fatalf("Bounds() = %d bounds from %v, want 24 from 5µs", len(b), b[0])
	}
	for i := 1; i < len(b); i++ {
		if b[i] != 2*b[i-1] {
			t.Fatalf("bound %d is %v after %v: not doubling", i, b[i], b[i-1])
		}
	}
	if last := b[len(b)-1]; last < 40*time.Second || last > 45*time.Second {
		t.Fatalf("last bound %v, want about 42 s", last)
	}
	s := Seconds()
	for i := range b {
		if s[i] != b[i].Seconds() {
			t.Fatalf("Seconds()[%d] = %v, Bounds()[%d] = %v", i, s[i], i, b[i])
		}
	}
	b[0] = 0
	if Bounds()[0] != 5*time.Microsecond {
		t.Fatal("changing a returned slice changed the scheme")
	}
}
