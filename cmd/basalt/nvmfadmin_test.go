package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/pkg/api"
)

func TestNVMfLsTable(t *testing.T) {
	l := anaList{&api.ListANAResponse{
		Nodes: []*api.AccessNode{{Id: 1, Addr: "a:1", Online: true}, {Id: 2, Addr: "b:1", Online: true}, {Id: 3, Addr: "c:1"}},
		Assignments: []*api.ANAAssignment{
			{Subsystem: "nqn.g", Host: "h1", Nsid: 1, Optimized: 2, NonOptimized: []uint64{1}},
		},
		Subsystems: []*api.NVMfSubsystem{{Nqn: "nqn.g", Policy: api.ANAPolicy_ANA_POLICY_BALANCE, Volumes: []string{"v1"}}},
	}}
	var b bytes.Buffer
	l.table(&b)
	out := b.String()
	for _, want := range []string{
		"nqn.g\tbalance\th1\t1\t1\ta:1\tnon-optimized\n",
		"nqn.g\tbalance\th1\t1\t2\tb:1\toptimized\n",
		"nqn.g\tbalance\th1\t1\t3\tc:1\tinaccessible (offline)\n",
		"GROUP nqn.g (balance): namespaces [v1]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("basalt nvmf ls lacks %q:\n%s", want, out)
		}
	}
}
