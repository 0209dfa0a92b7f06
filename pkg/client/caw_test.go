package client

import (
	"bytes"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestCompareAndWrite: routed like a write (through a redirect to the
// leader), a match writes, a miscompare is a final *MiscompareError with the
// offset, and a request the chunkservers would refuse is refused before
// anything is sent.
func TestCompareAndWrite(t *testing.T) {
	c := newFakeCluster(t)
	for cs := range uint32(tCS) {
		c.mds.hints[cs] = c.members[cs][1] // a follower: it redirects
	}
	v := c.open(t, nil)
	off := int64(5*tChunk + 4096)
	a, b := bytes.Repeat([]byte{'a'}, 512), bytes.Repeat([]byte{'b'}, 512)
	if _, err := v.WriteAt(a, off); err != nil {
		t.Fatal(err)
	}
	if err := v.CompareAndWrite(a, b, off); err != nil {
		t.Fatalf("compare-and-write a→b: %v", err)
	}
	got := make([]byte, 512)
	if _, err := v.ReadAt(got, off); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read back: %v, equal=%v", err, bytes.Equal(got, b))
	}
	err := v.CompareAndWrite(a, a, off)
	var me *MiscompareError
	if !errors.As(err, &me) || me.Offset != 0 || !errors.Is(err, api.ErrMiscompare) {
		t.Fatalf("compare-and-write a→a over b: %v, want a MiscompareError at 0", err)
	}
	cmp := bytes.Clone(b)
	cmp[300] = 'z'
	if err := v.CompareAndWrite(cmp, a, off); !errors.As(err, &me) || me.Offset != 300 {
		t.Fatalf("compare-and-write with byte 300 different: %v, want a MiscompareError at 300", err)
	}
	if n := c.notLeaders(); n < 1 {
		t.Fatalf("NOT_LEADER answers: %d, want the redirect", n)
	}
	before := c.frameCount(api.OpCompareAndWrite)
	for name, f := range map[string]func() error{
		"across a chunk": func() error { return v.CompareAndWrite(a, b, tChunk-256) },
		"over 64 KiB":    func() error { return v.CompareAndWrite(make([]byte, 64<<10+512), make([]byte, 64<<10+512), 0) },
		"lengths differ": func() error { return v.CompareAndWrite(a, b[:100], off) },
	} {
		if err := f(); !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("%s: %v, want BAD_REQUEST", name, err)
		}
	}
	if n := c.frameCount(api.OpCompareAndWrite) - before; n != 0 {
		t.Fatalf("%d refused compare-and-writes were sent", n)
	}
	if bad := c.violations(); len(bad) != 0 {
		t.Fatalf("protocol violations: %v", bad)
	}
}
