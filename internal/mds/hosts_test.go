package mds

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/basalt-storage/basalt/pkg/api"
)

// A volume's NVMe allow-list: hosts added in order and removed, adding or
// removing twice changing nothing, kept by GetVolume, ListVolumes and an
// attachment's rewrite of the record; a bad NQN, a missing volume and a
// list past its limit refused, changing nothing.
func TestSetVolumeHost(t *testing.T) {
	c := startWithPool(t, Config{}, 3)
	ctx := ctxT(t)
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	const (
		a = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001"
		b = "nqn.2026-12.io.basalt.test:host-b"
	)
	set := func(nqn string, allow bool) ([]string, bool, error) {
		t.Helper()
		r, err := c.SetVolumeHost(ctx, &api.SetVolumeHostRequest{Volume: "v", HostNqn: nqn, Allow: allow})
		return r.GetVolume().GetAllowedHosts(), r.GetChanged(), err
	}
	get := func() []string {
		t.Helper()
		g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "v"})
		if err != nil {
			t.Fatal(err)
		}
		return g.Volume.AllowedHosts
	}
	if l := get(); len(l) != 0 {
		t.Fatalf("a new volume allows %v", l)
	}
	if l, ch, err := set(a, true); err != nil || !ch || !slices.Equal(l, []string{a}) {
		t.Fatalf("allow a: %v %v %v", l, ch, err)
	}
	if l, ch, err := set(b, true); err != nil || !ch || !slices.Equal(l, []string{a, b}) {
		t.Fatalf("allow b: %v %v %v", l, ch, err)
	}
	if l, ch, err := set(a, true); err != nil || ch || !slices.Equal(l, []string{a, b}) {
		t.Fatalf("allow a again: %v changed %v %v", l, ch, err)
	}
	if _, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if l := get(); !slices.Equal(l, []string{a, b}) {
		t.Fatalf("after an attach GetVolume allows %v", l)
	}
	for what, nqn := range map[string]string{
		"empty":           "",
		"no nqn prefix":   "iqn.2026-12.io.basalt:host",
		"no colon":        "nqn.2026-12.io.basalt.host",
		"nothing after :": "nqn.2026-12.io.basalt:",
		"bad month":       "nqn.2026-13.io.basalt:host",
		"no date":         "nqn.io.basalt:host",
		"bad domain":      "nqn.2026-12.-io.basalt:host",
		"space":           "nqn.2026-12.io.basalt:host 1",
		"newline":         "nqn.2026-12.io.basalt:host\n",
		"short uuid":      "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000",
		"224 bytes":       "nqn.2026-12.io.basalt:" + strings.Repeat("h", 224-len("nqn.2026-12.io.basalt:")),
		"discovery nqn":   "nqn.2014-08.org.nvmexpress.discovery",
	} {
		_, _, err := set(nqn, true)
		wantCode(t, what, err, codes.InvalidArgument)
		if err != nil && !strings.Contains(err.Error(), "host NQN") {
			t.Errorf("%s: error %q does not say what is wrong", what, err)
		}
	}
	if _, _, err := set("nqn.2026-12.io.basalt:"+strings.Repeat("h", 223-len("nqn.2026-12.io.basalt:")), false); err != nil {
		t.Errorf("a 223-byte NQN refused: %v", err)
	}
	_, err := c.SetVolumeHost(ctx, &api.SetVolumeHostRequest{Volume: "nope", HostNqn: a, Allow: true})
	wantCode(t, "missing volume", err, codes.NotFound)
	if l := get(); !slices.Equal(l, []string{a, b}) {
		t.Fatalf("after the refused calls GetVolume allows %v", l)
	}
	if l, ch, err := set(a, false); err != nil || !ch || !slices.Equal(l, []string{b}) {
		t.Fatalf("deny a: %v %v %v", l, ch, err)
	}
	if l, ch, err := set(a, false); err != nil || ch || !slices.Equal(l, []string{b}) {
		t.Fatalf("deny a again: %v changed %v %v", l, ch, err)
	}
	lv, err := c.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil || len(lv.Volumes) != 1 || !slices.Equal(lv.Volumes[0].AllowedHosts, []string{b}) {
		t.Fatalf("ListVolumes: %v %v", lv, err)
	}
	if l, _, err := set(b, false); err != nil || len(l) != 0 {
		t.Fatalf("deny the last host: %v %v", l, err)
	}
	for i := range maxAllowedHosts {
		if _, _, err := set(fmt.Sprintf("nqn.2026-12.io.basalt.test:h%d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err = set(a, true)
	wantCode(t, "one host past the limit", err, codes.InvalidArgument)
}
