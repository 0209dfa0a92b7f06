package mds

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/basalt-storage/basalt/pkg/api"
)

// Attachments: only registered nodes; idempotent; read_only conflicts are
// AlreadyExists; an exclusive attach supersedes the other nodes; a volume
// with attachments is not deleted; detach of what is not there is fine.
func TestAttachments(t *testing.T) {
	c := startWithPool(t, Config{SessionLease: 10 * time.Second}, 3)
	ctx := ctxT(t)
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "pv", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "pv", Node: "node-a"})
	wantCode(t, "attach to an unregistered node", err, codes.NotFound)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if _, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: n, Zone: "z1"}}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "bad/id"}})
	wantCode(t, "register a bad node id", err, codes.InvalidArgument)
	_, err = c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "nope", Node: "node-a"})
	wantCode(t, "attach a missing volume", err, codes.NotFound)

	nodes := func(v *api.Volume) []string {
		var out []string
		for _, a := range v.Attachments {
			out = append(out, a.Node)
		}
		return out
	}
	for range 2 { // idempotent
		r, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "pv", Node: "node-a", Exclusive: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := nodes(r.Volume); !slices.Equal(got, []string{"node-a"}) || len(r.Superseded) != 0 {
			t.Fatalf("attached to %v, superseded %v; want [node-a], none", got, r.Superseded)
		}
	}
	_, err = c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "pv", Node: "node-a", ReadOnly: true})
	wantCode(t, "attach again read-only", err, codes.AlreadyExists)
	r, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "pv", Node: "node-c", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodes(r.Volume); !slices.Equal(got, []string{"node-a", "node-c"}) {
		t.Fatalf("a reader beside the writer: attached to %v", got)
	}
	// node-a's node died: the writer moves to node-b.
	r, err = c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "pv", Node: "node-b", Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodes(r.Volume); !slices.Equal(got, []string{"node-b"}) || !slices.Equal(r.Superseded, []string{"node-a", "node-c"}) {
		t.Fatalf("takeover: attached to %v, superseded %v; want [node-b], [node-a node-c]", got, r.Superseded)
	}
	g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "pv"})
	if err != nil || !slices.Equal(nodes(g.Volume), []string{"node-b"}) {
		t.Fatalf("GetVolume after the takeover: %v %v", g, err)
	}
	_, err = c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "pv"})
	wantCode(t, "delete while published", err, codes.FailedPrecondition)
	for _, n := range []string{"node-b", "node-b", "node-a"} { // again, and one not attached
		if _, err := c.DetachVolume(ctx, &api.DetachVolumeRequest{Name: "pv", Node: n}); err != nil {
			t.Fatalf("detach %s: %v", n, err)
		}
	}
	if _, err := c.DetachVolume(ctx, &api.DetachVolumeRequest{Name: "nope", Node: "node-a"}); err != nil {
		t.Fatalf("detach of a missing volume: %v", err)
	}
	if _, err := c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "pv"}); err != nil {
		t.Fatalf("delete after the last detach: %v", err)
	}
}
