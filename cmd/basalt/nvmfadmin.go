package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/pkg/api"
)

// anaList is `basalt nvmf ls`: every access node, then one row per path of
// every (subsystem, host, namespace).
type anaList struct{ *api.ListANAResponse }

func (l anaList) table(w io.Writer) {
	l.Nodes = slices.DeleteFunc(slices.Clone(l.Nodes), func(n *api.AccessNode) bool { return n.Addr == "" }) // iSCSI portals alone
	fmt.Fprintln(w, "ACCESS NODE\tADDR\tONLINE\tNAME")
	for _, n := range l.Nodes {
		fmt.Fprintf(w, "%d\t%s\t%v\t%s\n", n.Id, n.Addr, n.Online, n.Name)
	}
	policy := map[string]string{}
	for _, s := range l.Subsystems {
		policy[s.Nqn] = policyText(s.Policy)
		if len(s.Volumes) > 0 {
			fmt.Fprintf(w, "\nGROUP %s (%s): namespaces %v\n", s.Nqn, policyText(s.Policy), s.Volumes)
		}
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
		p, err := parsePolicy(args[1])
		if err != nil {
			return err
		}
		return pf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			_, err := c.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{Nqn: args[0], Policy: p}})
			return nil, err
		})
	}
	group := &cobra.Command{
		Use:   "group NAME VOLUME...",
		Short: "Define the subsystem " + nvmf.GroupNQNPrefix + "NAME: one namespace per volume, NSIDs in the order given",
		Args:  cobra.MinimumNArgs(2),
	}
	gf := addAdminFlags(group)
	gpolicy := group.Flags().String("policy", "inherit", "ANA policy: inherit or balance")
	group.RunE = func(_ *cobra.Command, args []string) error {
		p, err := parsePolicy(*gpolicy)
		if err != nil {
			return err
		}
		nqn := nvmf.GroupNQNPrefix + args[0]
		return gf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			_, err := c.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{
				Nqn: nqn, Policy: p, Volumes: args[1:]}})
			if err != nil {
				return nil, err
			}
			return subsystemSet{Nqn: nqn, Policy: *gpolicy, Volumes: args[1:]}, nil
		})
	}
	return []*cobra.Command{ls, policy, group}
}

type subsystemSet struct {
	Nqn     string   `json:"nqn"`
	Policy  string   `json:"policy"`
	Volumes []string `json:"volumes"`
}

func (s subsystemSet) table(w io.Writer) {
	fmt.Fprintf(w, "subsystem %s (policy %s): namespaces %v\n", s.Nqn, s.Policy, s.Volumes)
}

func parsePolicy(s string) (api.ANAPolicy, error) {
	switch s {
	case "inherit":
		return api.ANAPolicy_ANA_POLICY_INHERIT, nil
	case "balance":
		return api.ANAPolicy_ANA_POLICY_BALANCE, nil
	}
	return 0, fmt.Errorf("policy must be inherit or balance, not %q", s)
}

// portalList is `basalt iscsi ls`: the access nodes with an iSCSI portal.
type portalList struct {
	Nodes []*api.AccessNode `json:"nodes"`
}

func (l portalList) table(w io.Writer) {
	fmt.Fprintln(w, "ACCESS NODE\tPORTAL\tONLINE\tSESSIONS\tNAME")
	for _, n := range l.Nodes {
		fmt.Fprintf(w, "%d\t%s\t%v\t%d\t%s\n", n.Id, n.IscsiPortal, n.Online, len(n.IscsiSessions), n.Name)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ACCESS NODE\tTARGET\tINITIATOR\tFROM\tISID\tTSIH\tDIGESTS\tSINCE")
	for _, n := range l.Nodes {
		for _, s := range n.IscsiSessions {
			digests := "none"
			switch {
			case s.HeaderDigest && s.DataDigest:
				digests = "header,data"
			case s.HeaderDigest:
				digests = "header"
			case s.DataDigest:
				digests = "data"
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.Id, s.Target, s.Initiator, s.Remote, s.Isid, s.Tsih,
				digests, time.UnixMilli(s.SinceUnixMs).UTC().Format(time.RFC3339))
		}
	}
}

func iscsiListCommand() *cobra.Command {
	ls := &cobra.Command{Use: "ls", Short: "List the registered access nodes' iSCSI portals (basalt iscsi --register) and the sessions logged in at each", Args: cobra.NoArgs}
	lf := addAdminFlags(ls)
	ls.RunE = func(*cobra.Command, []string) error {
		return lf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.ListANA(ctx, &api.ListANARequest{})
			if err != nil {
				return nil, err
			}
			var l portalList
			for _, n := range r.Nodes {
				if n.IscsiPortal != "" {
					l.Nodes = append(l.Nodes, n)
				}
			}
			return l, nil
		})
	}
	return ls
}
