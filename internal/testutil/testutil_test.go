package testutil

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePortIsFreeAndNeverRepeated(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("FreePort handed out port %d twice", p)
		}
		seen[p] = true
		if lo, hi, ok := pickRange(); ok && (p < lo || p >= hi) {
			t.Fatalf("FreePort returned %d, outside [%d, %d) (below or above the ephemeral range)", p, lo, hi)
		}
	}
	ln, err := net.Listen("tcp", FreeAddr(t))
	if err != nil {
		t.Fatalf("listen on a FreeAddr: %v", err)
	}
	ln.Close()
}

func TestFreePortBaseRangeIsFree(t *testing.T) {
	const n = 30
	base := FreePortBase(t, n)
	for p := base; p < base+n; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d of the range at %d: %v", p, base, err)
		}
		ln.Close()
	}
	if p := FreePort(t); p >= base && p < base+n {
		t.Fatalf("FreePort returned %d, inside the range [%d, %d) handed out before", p, base, base+n)
	}
}

func TestRequireToolSkipsWhenMissing(t *testing.T) {
	var skipped bool
	t.Run("missing", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		RequireTool(t, "basalt-no-such-tool")
		t.Error("RequireTool returned for a tool that is not installed")
	})
	if !skipped {
		t.Fatal("RequireTool did not skip the test for a missing tool")
	}
	if path := RequireTool(t, "sh"); path == "" {
		t.Fatal("RequireTool returned no path for sh")
	}
}
