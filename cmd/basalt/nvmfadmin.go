package main

import (
	"context"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/pkg/api"
)

// anaList is `basalt nvmf ls`: every access node, then one row per path of
// every (subsystem, host, namespace).
type anaList struct{ *api.ListANAResponse }

func (l anaList) table(w io.Writer) {
	fmt.Fprintln(w, "ACCESS NODE\tADDR\tONLINE\tNAME")
	for _, n := range l.Nodes {
		fmt.Fprintf(w, "%d\t%s\t%v\t%s\n", n.Id, n.Addr, n.Online, n.Name)
	}
	policy := map[string]string{}
	for _, s := range l.Subsystems {
		policy[s.Nqn] = policyText(s.Policy)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "SUBSYSTEM\tPOLICY\tHOST\tNSID\tACCESS NODE\tADDR\tSTATE")
	as := l.Assignments
	sort.SliceStable(as, func(i, j int) bool {
		if as[i].Subsystem != as[j].Subsystem {
			return as[i].Subsystem < as[j].Subsystem
		}
		if as[i].Host != as[j].Host {
			return as[i].Host < as[j].Host
		}
		return as[i].Nsid < as[j].Nsid
	})
	for _, a := range as {
		p := policy[a.Subsystem]
		if p == "" {
			p = "inherit"
		}
		for _, n := range l.Nodes {
			st := "inaccessible"
			switch {
			case a.Optimized == n.Id:
				st = "optimized"
			case containsID(a.NonOptimized, n.Id):
				st = "non-optimized"
			}
			if !n.Online {
				st += " (offline)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", a.Subsystem, p, a.Host, a.Nsid, n.Id, n.Addr, st)
		}
	}
}

func containsID(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func policyText(p api.ANAPolicy) string {
	if p == api.ANAPolicy_ANA_POLICY_BALANCE {
		return "balance"
	}
	return "inherit"
}

// nvmfAdminCommands are `basalt nvmf ls` and `basalt nvmf policy`.
func nvmfAdminCommands() []*cobra.Command {
	ls := &cobra.Command{Use: "ls", Short: "List NVMe/TCP access nodes, hosts, namespaces and the ANA state of every path", Args: cobra.NoArgs}
	lf := addAdminFlags(ls)
	ls.RunE = func(*cobra.Command, []string) error {
		return lf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.ListANA(ctx, &api.ListANARequest{})
			if err != nil {
				return nil, err
			}
			return anaList{r}, nil
		})
	}
	policy := &cobra.Command{
		Use:   "policy SUBSYSTEM-NQN inherit|balance",
		Short: "Set a subsystem's ANA policy: inherit (one optimized node per host) or balance (a host's namespaces spread)",
		Args:  cobra.ExactArgs(2),
	}
	pf := addAdminFlags(policy)
	policy.RunE = func(_ *cobra.Command, args []string) error {
		var p api.ANAPolicy
		switch args[1] {
		case "inherit":
			p = api.ANAPolicy_ANA_POLICY_INHERIT
		case "balance":
			p = api.ANAPolicy_ANA_POLICY_BALANCE
		default:
			return fmt.Errorf("policy must be inherit or balance, not %q", args[1])
		}
		return pf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			_, err := c.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{Nqn: args[0], Policy: p}})
			return nil, err
		})
	}
	return []*cobra.Command{ls, policy}
}
