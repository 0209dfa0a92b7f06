package mds

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// A node's attach limit: AttachVolume refuses a new attachment beyond it
// with ResourceExhausted (what CSI's ControllerPublishVolume answers),
// atomically even when publishes race; a detach, or a takeover by another
// node, frees a place; registering again keeps the count.
func TestAttachLimit(t *testing.T) {
	c := startWithPool(t, Config{SessionLease: 10 * time.Second}, 3)
	ctx := ctxT(t)
	for _, n := range []*api.Node{{Id: "small", MaxVolumes: 3}, {Id: "other"}} {
		if _, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "neg", MaxVolumes: -1}})
	wantCode(t, "a negative limit", err, codes.InvalidArgument)
	vols := []string{"v0", "v1", "v2", "v3", "v4", "v5"}
	for _, v := range vols {
		if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: v, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	// Six publishes at once to a node that takes three.
	errs := make(chan error, len(vols))
	for _, v := range vols {
		go func() {
			_, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: v, Node: "small", Exclusive: true})
			errs <- err
		}()
	}
	var ok, full int
	for range vols {
		switch err := <-errs; status.Code(err) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			full++
		default:
			t.Fatalf("attach: %v", err)
		}
	}
	if ok != 3 || full != 3 {
		t.Fatalf("6 racing attaches to a node with limit 3: %d attached, %d refused; want 3 and 3", ok, full)
	}
	attachedTo := func(node string) []string {
		t.Helper()
		l, err := c.ListVolumes(ctx, &api.ListVolumesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, v := range l.Volumes {
			if slices.ContainsFunc(v.Attachments, func(a *api.Attachment) bool { return a.Node == node }) {
				out = append(out, v.Name)
			}
		}
		return out
	}
	on := attachedTo("small")
	if len(on) != 3 {
		t.Fatalf("attached to small: %v; want 3", on)
	}
	var off []string
	for _, v := range vols {
		if !slices.Contains(on, v) {
			off = append(off, v)
		}
	}
	// Again for one attached: idempotent, not refused.
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: on[0], Node: "small", Exclusive: true}); err != nil {
		t.Fatalf("attach again: %v", err)
	}
	// Registering again (a plugin restart) keeps the count.
	r, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "small", MaxVolumes: 3}})
	if err != nil || r.Node.Attached != 3 || r.Node.MaxVolumes != 3 {
		t.Fatalf("register again: %v %v; want attached 3, max 3", r, err)
	}
	_, err = c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: off[0], Node: "small"})
	wantCode(t, "attach beyond the limit after re-registering", err, codes.ResourceExhausted)
	// A detach frees a place.
	if _, err := c.DetachVolume(ctx, &api.DetachVolumeRequest{Name: on[0], Node: "small"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: off[0], Node: "small"}); err != nil {
		t.Fatalf("attach after a detach: %v", err)
	}
	// A takeover by another node frees one too.
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: on[1], Node: "other", Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: off[1], Node: "small"}); err != nil {
		t.Fatalf("attach after a takeover freed a place: %v", err)
	}
	_, err = c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: off[2], Node: "small"})
	wantCode(t, "attach beyond the limit again", err, codes.ResourceExhausted)
	if got := attachedTo("small"); len(got) != 3 {
		t.Fatalf("attached to small at the end: %v; want 3", got)
	}
	// No limit: the other node takes all.
	for _, v := range vols {
		if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: v, Node: "other", ReadOnly: v != on[1]}); err != nil && status.Code(err) != codes.AlreadyExists {
			t.Fatalf("attach %s to the unlimited node: %v", v, err)
		}
	}
}

// CheckOnly answers as the attach would and changes nothing.
func TestAttachCheckOnly(t *testing.T) {
	c := startWithPool(t, Config{SessionLease: 10 * time.Second}, 3)
	ctx := ctxT(t)
	for _, n := range []*api.Node{{Id: "one", MaxVolumes: 1}, {Id: "b"}} {
		if _, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: n}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{"v0", "v1"} {
		if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: v, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v0", Node: "one", CheckOnly: true}); err != nil {
		t.Fatalf("check: %v", err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v1", Node: "one", CheckOnly: true}); err != nil {
		t.Fatalf("check of a second volume (the first was only checked): %v", err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v0", Node: "b", Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v1", Node: "one"}); err != nil {
		t.Fatal(err)
	}
	_, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v0", Node: "one", Exclusive: true, CheckOnly: true})
	wantCode(t, "check beyond the limit", err, codes.ResourceExhausted)
	_, err = c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v1", Node: "one", ReadOnly: true, CheckOnly: true})
	wantCode(t, "check with another read_only", err, codes.AlreadyExists)
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "v1", Node: "b", Exclusive: true, CheckOnly: true}); err != nil {
		t.Fatalf("check of a takeover: %v", err)
	}
	g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "v1"})
	if err != nil || len(g.Volume.Attachments) != 1 || g.Volume.Attachments[0].Node != "one" {
		t.Fatalf("after checks, v1 is attached to %v (%v); want only node one", g.GetVolume().GetAttachments(), err)
	}
}

// TestAttachmentHostNQN: a node's registered host NQN and iSCSI initiator
// name are checked (the "nqn." form, at most 223 bytes; "iqn.", "eui." or
// "naa.", at most 223 bytes) and copied into the attachments made to it,
// which is what NVMe/TCP and iSCSI access nodes let write (docs/nvmf.md,
// docs/iscsi.md).
func TestAttachmentHostNQN(t *testing.T) {
	c := startWithPool(t, Config{SessionLease: 10 * time.Second}, 3)
	ctx := ctxT(t)
	if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "pv", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	long := "nqn." + strings.Repeat("x", 220)
	for _, bad := range []string{"host-a", "nqn.", long, "nqn.2014-08.org.nvmexpress:uuid:a b"} {
		_, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "node-a", HostNqn: bad}})
		wantCode(t, "register host NQN "+bad, err, codes.InvalidArgument)
	}
	for _, bad := range []string{"host-a", "iqn.", "iqn." + strings.Repeat("x", 220), "iqn.1993-08.org.debian:01:a b", "nqn.2014-08.x:y"} {
		_, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "node-a", InitiatorIqn: bad}})
		wantCode(t, "register initiator name "+bad, err, codes.InvalidArgument)
	}
	const nqnA = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001"
	const iqnA = "iqn.1993-08.org.debian:01:aaaa0001"
	if r, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "node-a", HostNqn: nqnA, InitiatorIqn: iqnA}}); err != nil ||
		r.Node.HostNqn != nqnA || r.Node.InitiatorIqn != iqnA {
		t.Fatalf("register node-a: %v, %v", r, err)
	}
	if _, err := c.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "node-b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "pv", Node: "node-a"}); err != nil {
		t.Fatal(err)
	}
	r, err := c.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "pv", Node: "node-b", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: "pv"})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*api.Volume{r.Volume, g.Volume} {
		if len(v.Attachments) != 2 || v.Attachments[0].HostNqn != nqnA || v.Attachments[0].InitiatorIqn != iqnA ||
			v.Attachments[1].HostNqn != "" || v.Attachments[1].InitiatorIqn != "" {
			t.Fatalf("attachments %v; want node-a's with %s and %s, node-b's with none", v.Attachments, nqnA, iqnA)
		}
	}
}
