package mds

import (
	"fmt"
	"slices"
	"testing"
	"time"

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
