package mds

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestANAAssignments: three access nodes report one host on an inherit and
// a balance subsystem; the MDS stores one optimized and two non-optimized
// paths per namespace, and moves the optimized paths of a node that stops
// heartbeating to a survivor.
func TestANAAssignments(t *testing.T) {
	r := startMDS(t, Config{HeartbeatTimeout: time.Second})
	t.Cleanup(func() { r.stop(t) })
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	var ids []uint64
	for i := range 3 {
		resp, err := c.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: fmt.Sprintf("10.0.0.%d:4420", i+1), Name: "n"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.Id)
	}
	again, err := c.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: "10.0.0.1:4420"})
	if err != nil || again.Id != ids[0] {
		t.Fatalf("registering the same address again: id %v, %v; want %d", again.GetId(), err, ids[0])
	}
	if _, err := c.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{
		Nqn: "bal", Policy: api.ANAPolicy_ANA_POLICY_BALANCE}}); err != nil {
		t.Fatal(err)
	}
	hosts := []*api.NVMfHost{
		{Subsystem: "inh", Host: "h1", Nsids: []uint32{1, 2, 3}},
		{Subsystem: "bal", Host: "h1", Nsids: []uint32{1, 2, 3}},
	}
	// beat heartbeats every node in alive until ok accepts the answer.
	beat := func(alive []uint64, ok func(map[string]*api.ANAAssignment) bool) map[string]*api.ANAAssignment {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			var got map[string]*api.ANAAssignment
			for _, id := range alive {
				resp, err := c.AccessNodeHeartbeat(ctx, &api.AccessNodeHeartbeatRequest{Id: id, Hosts: hosts})
				if err != nil {
					t.Fatal(err)
				}
				got = map[string]*api.ANAAssignment{}
				for _, a := range resp.Assignments {
					got[fmt.Sprintf("%s/%d", a.Subsystem, a.Nsid)] = a
				}
			}
			if ok(got) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("no acceptable assignment within 90 s; last %v", got)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	full := func(alive []uint64) func(map[string]*api.ANAAssignment) bool {
		return func(got map[string]*api.ANAAssignment) bool {
			if len(got) != 6 {
				return false
			}
			for _, a := range got {
				if !slices.Contains(alive, a.Optimized) || len(a.NonOptimized) != min(2, len(alive)-1) {
					return false
				}
			}
			return true
		}
	}
	got := beat(ids, full(ids))
	inh := got["inh/1"].Optimized
	for ns := 2; ns <= 3; ns++ {
		if o := got[fmt.Sprintf("inh/%d", ns)].Optimized; o != inh {
			t.Errorf("inherit: namespace %d optimized on %d, namespace 1 on %d", ns, o, inh)
		}
	}
	bal := map[uint64]bool{}
	for ns := 1; ns <= 3; ns++ {
		bal[got[fmt.Sprintf("bal/%d", ns)].Optimized] = true
	}
	if len(bal) != 3 {
		t.Errorf("balance: 3 namespaces on %d optimized nodes, want 3: %v", len(bal), got)
	}
	// Node inh stops: its namespaces move to one of their non-optimized nodes.
	var alive []uint64
	for _, id := range ids {
		if id != inh {
			alive = append(alive, id)
		}
	}
	before := got
	got = beat(alive, full(alive))
	for k, a := range got {
		if b := before[k]; b.Optimized == inh && !slices.Contains(b.NonOptimized, a.Optimized) {
			t.Errorf("%s failed over to %d, not one of its non-optimized %v", k, a.Optimized, b.NonOptimized)
		}
	}
	list, err := c.ListANA(ctx, &api.ListANARequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Nodes) != 3 || len(list.Assignments) != 6 || len(list.Subsystems) != 1 {
		t.Fatalf("ListANA: %d nodes, %d assignments, %d subsystems; want 3, 6, 1", len(list.Nodes), len(list.Assignments), len(list.Subsystems))
	}
	for _, n := range list.Nodes {
		if n.Online == (n.Id == inh) {
			t.Errorf("ListANA: node %d online %v", n.Id, n.Online)
		}
	}
	if _, err := c.AccessNodeHeartbeat(ctx, &api.AccessNodeHeartbeatRequest{Id: 999}); err == nil {
		t.Error("heartbeat of an unregistered access node accepted")
	}
}

// TestNVMfGroupSubsystem: a subsystem of several volumes is stored with
// its policy and handed to access nodes in their heartbeat answers; one
// naming a volume that does not exist is refused.
func TestNVMfGroupSubsystem(t *testing.T) {
	c := startWithPool(t, Config{}, 8)
	ctx := ctxT(t)
	for _, v := range []string{"a", "b"} {
		if _, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: v, Size: 1 << 20, Pool: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{Nqn: "g", Volumes: []string{"a", "nope"}}})
	wantCode(t, "a group with a missing volume", err, codes.NotFound)
	if _, err := c.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{
		Nqn: "g", Policy: api.ANAPolicy_ANA_POLICY_BALANCE, Volumes: []string{"b", "a"}}}); err != nil {
		t.Fatal(err)
	}
	reg, err := c.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: "10.0.0.9:4420"})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := c.AccessNodeHeartbeat(ctx, &api.AccessNodeHeartbeatRequest{Id: reg.Id})
	if err != nil {
		t.Fatal(err)
	}
	if len(hb.Subsystems) != 1 || hb.Subsystems[0].Nqn != "g" || !slices.Equal(hb.Subsystems[0].Volumes, []string{"b", "a"}) ||
		hb.Subsystems[0].Policy != api.ANAPolicy_ANA_POLICY_BALANCE || len(hb.Nodes) != 1 {
		t.Fatalf("heartbeat answer: %v", hb)
	}
}

// TestAccessNodePortals: an access node may register an iSCSI portal, an
// NVMe/TCP address or both; either keeps its id when it registers again;
// ListANA gives the portals (for redirectors); a portal-only node is never
// given an NVMe/TCP path; an address that is not host:port, or none, is
// refused.
func TestAccessNodePortals(t *testing.T) {
	r := startMDS(t, Config{HeartbeatTimeout: time.Second})
	t.Cleanup(func() { r.stop(t) })
	waitActive(t, r, 30*time.Second)
	c := dial(t, r.s.Addr())
	ctx := ctxT(t)
	for _, bad := range []*api.RegisterAccessNodeRequest{{}, {IscsiPortal: "no-port"}, {Addr: "10.0.0.1:4420", IscsiPortal: "x"}} {
		if _, err := c.RegisterAccessNode(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("RegisterAccessNode(%v): %v, want InvalidArgument", bad, err)
		}
	}
	portal, err := c.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{IscsiPortal: "10.0.0.1:3260", Name: "iscsi-only"})
	if err != nil {
		t.Fatal(err)
	}
	both, err := c.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: "10.0.0.2:4420", IscsiPortal: "10.0.0.2:3260", Name: "both"})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := c.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{IscsiPortal: "10.0.0.1:3260", Name: "iscsi-only"}); err != nil || again.Id != portal.Id {
		t.Fatalf("the same portal again: id %v, %v; want %d", again.GetId(), err, portal.Id)
	}
	if again, err := c.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: "10.0.0.2:4420", IscsiPortal: "10.0.0.2:3260", Name: "both"}); err != nil || again.Id != both.Id {
		t.Fatalf("the same addresses again: id %v, %v; want %d", again.GetId(), err, both.Id)
	}
	host := []*api.NVMfHost{{Subsystem: "s", Host: "h", Nsids: []uint32{1}}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.AccessNodeHeartbeat(ctx, &api.AccessNodeHeartbeatRequest{Id: portal.Id}); err != nil {
			t.Fatal(err)
		}
		resp, err := c.AccessNodeHeartbeat(ctx, &api.AccessNodeHeartbeatRequest{Id: both.Id, Hosts: host})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Assignments) == 1 {
			if a := resp.Assignments[0]; a.Optimized != both.Id || len(a.NonOptimized) != 0 {
				t.Fatalf("paths %v: want the NVMe/TCP node %d optimized and no other (node %d has no NVMe/TCP address)", a, both.Id, portal.Id)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ANA assignment within 60 s: %v", resp)
		}
		time.Sleep(100 * time.Millisecond)
	}
	l, err := c.ListANA(ctx, &api.ListANARequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]string{}
	for _, n := range l.Nodes {
		got[n.Id] = n.Addr + "|" + n.IscsiPortal
	}
	if got[portal.Id] != "|10.0.0.1:3260" || got[both.Id] != "10.0.0.2:4420|10.0.0.2:3260" {
		t.Errorf("ListANA nodes %v", got)
	}
}
