package api

import "testing"

// TestRouteGolden freezes the routing rule (STYLE 12): these values were
// computed once, VolumeHash checked against an independent FNV-1a 64. A change
// here moves every chunk of every volume.
func TestRouteGolden(t *testing.T) {
	for _, g := range []struct{ volume, hash uint64 }{
		{0x0, 0xa8c7f832281a39c5},
		{0x1, 0xa8c7f732281a3812},
		{0x2a, 0xa8c7de32281a0d97},
		{0xdeadbeefcafe, 0xd58314de6d224867},
		{0xffffffffffffffff, 0x8cf51a8bfca3883d},
	} {
		if h := VolumeHash(g.volume); h != g.hash {
			t.Errorf("VolumeHash(%#x) = %#x, frozen at %#x", g.volume, h, g.hash)
		}
	}
	for _, g := range []struct {
		volume, chunk uint64
		count, want   uint32
	}{
		{0x1, 0, 100, 94},
		{0x1, 99, 100, 93},
		{0xdeadbeefcafe, 12345, 7, 5},
		{0x2a, 3, 1, 0},
	} {
		if cs := CopysetOf(g.volume, g.chunk, g.count); cs != g.want {
			t.Errorf("CopysetOf(%#x, %d, %d) = %d, frozen at %d", g.volume, g.chunk, g.count, cs, g.want)
		}
	}
	if g := GroupID(3, 7); g != 3<<32|7 {
		t.Errorf("GroupID(3, 7) = %#x", g)
	}
	if p, c := SplitGroupID(GroupID(0xffffffff, 12)); p != 0xffffffff || c != 12 {
		t.Errorf("SplitGroupID(GroupID(0xffffffff, 12)) = %d, %d", p, c)
	}
}
