package mds

import (
	"maps"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/basalt-storage/basalt/pkg/api"
)

// A volume's metadata: keys set, changed and removed (an empty value), kept
// by GetVolume and ListVolumes and across an attachment's rewrite of the
// record; bad keys, values and volumes refused, changing nothing.
func TestSetVolumeMeta(t *testing.T) {
	c := startWithPool(t, Config{}, 3)
	ctx := ctxT(t)
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	set := func(meta map[string]string) (map[string]string, error) {
		t.Helper()
		r, err := c.SetVolumeMeta(ctx, &api.SetVolumeMetaRequest{Name: "v", Meta: meta})
		return r.GetVolume().GetMeta(), err
	}
	get := func() map[string]string {
		t.Helper()
		g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "v"})
		if err != nil {
			t.Fatal(err)
		}
		return g.Volume.Meta
	}
	if m, err := set(map[string]string{"csi/protocol": "nvmf", "owner": "db"}); err != nil || !maps.Equal(m, map[string]string{"csi/protocol": "nvmf", "owner": "db"}) {
		t.Fatalf("set: %v %v", m, err)
	}
	// Again: the same answer (idempotent).
	if m, err := set(map[string]string{"csi/protocol": "nvmf"}); err != nil || len(m) != 2 {
		t.Fatalf("set again: %v %v", m, err)
	}
	if m, err := set(map[string]string{"csi/protocol": "iscsi", "owner": ""}); err != nil || !maps.Equal(m, map[string]string{"csi/protocol": "iscsi"}) {
		t.Fatalf("change and remove: %v %v", m, err)
	}
	// An attachment rewrites the volume's record: the metadata stays.
	if _, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if m := get(); !maps.Equal(m, map[string]string{"csi/protocol": "iscsi"}) {
		t.Fatalf("after an attach GetVolume has %v", m)
	}
	for what, meta := range map[string]map[string]string{
		"bad key":    {"a b": "x"},
		"empty key":  {"": "x"},
		"long key":   {strings.Repeat("k", 64): "x"},
		"long value": {"k": strings.Repeat("v", 1025)},
	} {
		_, err := set(meta)
		wantCode(t, what, err, codes.InvalidArgument)
	}
	many := map[string]string{}
	for i := range 65 {
		many["k"+strings.Repeat("x", i)] = "v"
	}
	_, err := set(many)
	wantCode(t, "too many keys", err, codes.InvalidArgument)
	_, err = c.SetVolumeMeta(ctx, &api.SetVolumeMetaRequest{Name: "nope", Meta: map[string]string{"k": "v"}})
	wantCode(t, "missing volume", err, codes.NotFound)
	if m := get(); !maps.Equal(m, map[string]string{"csi/protocol": "iscsi"}) {
		t.Fatalf("after the refused calls GetVolume has %v", m)
	}
	lv, err := c.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil || len(lv.Volumes) != 1 || lv.Volumes[0].Meta["csi/protocol"] != "iscsi" {
		t.Fatalf("ListVolumes: %v %v", lv, err)
	}
}
