package mds

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"net/url"
	"slices"
	"sort"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/internal/placement"
	"github.com/basalt-storage/basalt/pkg/api"
)

// liveAN is what the active MDS knows about an access node from its
// heartbeats (Server.accessNodes, under Server.mu).
type liveAN struct {
	last     time.Time
	hosts    []*api.NVMfHost
	sessions []*api.ISCSISession
}

// maxISCSISessions bounds the sessions the MDS keeps of one access node.
const maxISCSISessions = 4096

// accessNodeRecord is the value at /basalt/access-nodes/<id>.
type accessNodeRecord struct {
	ID           uint64 `json:"id"`
	Addr         string `json:"addr"` // NVMe/TCP; "": none
	ISCSIPortal  string `json:"iscsi_portal,omitempty"`
	Name         string `json:"name,omitempty"`
	RegisteredMs int64  `json:"registered_unix_ms"`
	// Owner is the identity that registered the node (basalt://…); only it
	// re-registers or heartbeats as this node. "" on an Insecure MDS.
	Owner string `json:"owner,omitempty"`
}

// nvmfSubsystemRecord is the value at /basalt/nvmf-subsystems/<escaped nqn>.
type nvmfSubsystemRecord struct {
	NQN     string   `json:"nqn"`
	Policy  string   `json:"policy"`            // "inherit" or "balance"
	Volumes []string `json:"volumes,omitempty"` // a group's volumes, NSID order
}

func (r nvmfSubsystemRecord) proto() *api.NVMfSubsystem {
	p := api.ANAPolicy_ANA_POLICY_INHERIT
	if r.Policy == "balance" {
		p = api.ANAPolicy_ANA_POLICY_BALANCE
	}
	return &api.NVMfSubsystem{Nqn: r.NQN, Policy: p, Volumes: r.Volumes}
}

// anaRecord is one element of the array at /basalt/ana-assignments.
type anaRecord struct {
	Subsystem    string   `json:"subsystem"`
	Host         string   `json:"host"`
	NSID         uint32   `json:"nsid"`
	Optimized    uint64   `json:"optimized"`
	NonOptimized []uint64 `json:"non_optimized,omitempty"`
}

func accessNodeKey(id uint64) string { return idKey(accessNodePrefix, id) }
func nvmfSubsysKey(nqn string) string {
	return nvmfSubsysPrefix + url.PathEscape(nqn)
}

// RegisterAccessNode records an access node by its NVMe/TCP address and
// iSCSI portal; a node registering again with either keeps its id.
func (h *handler) RegisterAccessNode(ctx context.Context, req *api.RegisterAccessNodeRequest) (*api.RegisterAccessNodeResponse, error) {
	s := h.s
	if req.Addr == "" && req.IscsiPortal == "" {
		return nil, fmt.Errorf("%w: an access node needs its NVMe/TCP address or iSCSI portal", ErrInvalidArgument)
	}
	for _, a := range []string{req.Addr, req.IscsiPortal} {
		if _, _, err := net.SplitHostPort(a); a != "" && err != nil {
			return nil, fmt.Errorf("%w: access node address %q: want host:port", ErrInvalidArgument, a)
		}
	}
	var id uint64
	owner := sessionOwner(ctx)
	err := s.txn(ctx, func(stm concurrency.STM) error {
		// Few access nodes: look the address up among them all.
		recs, err := getPrefix[accessNodeRecord](ctx, s.cli, accessNodePrefix)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if (req.Addr != "" && r.Addr == req.Addr) || (req.IscsiPortal != "" && r.ISCSIPortal == req.IscsiPortal) {
				if err := checkAccessNodeOwner(ctx, r); err != nil {
					return err
				}
				id = r.ID
				if r.Name != req.Name || r.Owner != owner || r.Addr != req.Addr || r.ISCSIPortal != req.IscsiPortal {
					r.Name, r.Owner, r.Addr, r.ISCSIPortal = req.Name, owner, req.Addr, req.IscsiPortal
					stm.Put(accessNodeKey(id), encode(r))
				}
				return nil
			}
		}
		if id, err = nextID(stm, idAccessNode); err != nil {
			return err
		}
		stm.Put(accessNodeKey(id), encode(accessNodeRecord{ID: id, Addr: req.Addr, ISCSIPortal: req.IscsiPortal,
			Name: req.Name, RegisteredMs: time.Now().UnixMilli(), Owner: owner}))
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.accessNodes[id] = &liveAN{last: time.Now()}
	s.mu.Unlock()
	s.log.Info("access node registered", "access_node", id, "nvmf_addr", req.Addr, "iscsi_portal", req.IscsiPortal, "name", req.Name)
	return &api.RegisterAccessNodeResponse{Id: id}, nil
}

// SetNVMfSubsystem sets a subsystem's ANA policy.
func (h *handler) SetNVMfSubsystem(ctx context.Context, req *api.SetNVMfSubsystemRequest) (*api.SetNVMfSubsystemResponse, error) {
	sub := req.GetSubsystem()
	if sub.GetNqn() == "" {
		return nil, fmt.Errorf("%w: a subsystem needs its NQN", ErrInvalidArgument)
	}
	rec := nvmfSubsystemRecord{NQN: sub.Nqn, Policy: policyName(sub.Policy), Volumes: sub.Volumes}
	err := h.s.txn(ctx, func(stm concurrency.STM) error {
		for _, v := range sub.Volumes {
			if stm.Get(volumeNameKey(v)) == "" {
				return fmt.Errorf("%w: subsystem %s: volume %q does not exist", ErrNotFound, sub.Nqn, v)
			}
		}
		stm.Put(nvmfSubsysKey(sub.Nqn), encode(rec))
		return nil
	})
	if err != nil {
		return nil, err
	}
	h.s.log.Info("NVMe subsystem set", "subsystem", sub.Nqn, "policy", rec.Policy, "volumes", rec.Volumes)
	return &api.SetNVMfSubsystemResponse{}, nil
}

func policyName(p api.ANAPolicy) string {
	if p == api.ANAPolicy_ANA_POLICY_BALANCE {
		return "balance"
	}
	return "inherit"
}

// AccessNodeHeartbeat records an access node's liveness and the hosts it
// serves, reassigns the ANA paths if the live nodes or hosts changed, and
// answers with the live nodes and the assignments of the reported hosts.
func (h *handler) AccessNodeHeartbeat(ctx context.Context, req *api.AccessNodeHeartbeatRequest) (*api.AccessNodeHeartbeatResponse, error) {
	s := h.s
	if rec, ok, err := getOne[accessNodeRecord](ctx, s.cli, accessNodeKey(req.Id)); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("%w: access node %d is not registered; register first", ErrNotFound, req.Id)
	} else if err := checkAccessNodeOwner(ctx, rec); err != nil {
		return nil, err
	}
	s.anaMu.Lock()
	defer s.anaMu.Unlock()
	now := time.Now()
	s.mu.Lock()
	s.accessNodes[req.Id] = &liveAN{last: now, hosts: req.Hosts, sessions: req.IscsiSessions[:min(len(req.IscsiSessions), maxISCSISessions)]}
	s.mu.Unlock()
	nodes, assigned, subs, err := s.reassignANA(ctx, now)
	if err != nil {
		return nil, err
	}
	resp := &api.AccessNodeHeartbeatResponse{Nodes: nodes}
	want := map[[2]string]bool{}
	for _, hst := range req.Hosts {
		want[[2]string{hst.Subsystem, hst.Host}] = true
	}
	hash := fnv.New64a()
	for _, n := range nodes {
		fmt.Fprintf(hash, "%d %s\n", n.Id, n.Addr)
	}
	for _, a := range assigned {
		if want[[2]string{a.Subsystem, a.Host}] {
			resp.Assignments = append(resp.Assignments, a.proto())
			fmt.Fprintf(hash, "%s %s %d %d %v\n", a.Subsystem, a.Host, a.NSID, a.Optimized, a.NonOptimized)
		}
	}
	for _, r := range subs {
		if len(r.Volumes) > 0 {
			resp.Subsystems = append(resp.Subsystems, r.proto())
			fmt.Fprintf(hash, "%s %v\n", r.NQN, r.Volumes)
		}
	}
	resp.Revision = hash.Sum64()
	return resp, nil
}

func (a anaRecord) proto() *api.ANAAssignment {
	return &api.ANAAssignment{Subsystem: a.Subsystem, Host: a.Host, Nsid: a.NSID, Optimized: a.Optimized,
		NonOptimized: a.NonOptimized}
}

// reassignANA computes the assignments for the live access nodes and the
// hosts they report (placement.AssignANA, sticky to the stored ones) and
// stores them if they changed. For HeartbeatTimeout after a takeover it
// only reads them: until every live node has been heard from, a newly
// active MDS would move paths away from nodes that are fine. Caller holds
// s.anaMu.
func (s *Server) reassignANA(ctx context.Context, now time.Time) ([]*api.AccessNode, []anaRecord, []nvmfSubsystemRecord, error) {
	recs, err := getPrefix[accessNodeRecord](ctx, s.cli, accessNodePrefix)
	if err != nil {
		return nil, nil, nil, err
	}
	subs, err := getPrefix[nvmfSubsystemRecord](ctx, s.cli, nvmfSubsysPrefix)
	if err != nil {
		return nil, nil, nil, err
	}
	stored, _, err := getOne[[]anaRecord](ctx, s.cli, anaKey)
	if err != nil {
		return nil, nil, nil, err
	}
	policy := map[string]placement.ANAPolicy{}
	for _, r := range subs {
		if r.Policy == "balance" {
			policy[r.NQN] = placement.ANABalance
		}
	}
	var nodes []*api.AccessNode
	var live []uint64
	hosts := map[[2]string]map[uint32]bool{}
	reach := map[[2]string][]uint64{} // the nodes each host is connected to
	s.mu.Lock()
	settled := now.Sub(s.activeSince) > s.cfg.HeartbeatTimeout
	for _, r := range recs {
		l := s.accessNodes[r.ID]
		if l == nil || now.Sub(l.last) > s.cfg.HeartbeatTimeout {
			continue
		}
		nodes = append(nodes, &api.AccessNode{Id: r.ID, Addr: r.Addr, IscsiPortal: r.ISCSIPortal, Name: r.Name,
			Online: true, LastHeartbeatUnixMs: l.last.UnixMilli()})
		live = append(live, r.ID)
		for _, h := range l.hosts {
			k := [2]string{h.Subsystem, h.Host}
			if hosts[k] == nil {
				hosts[k] = map[uint32]bool{}
			}
			reach[k] = append(reach[k], r.ID)
			for _, ns := range h.Nsids {
				hosts[k][ns] = true
			}
		}
	}
	s.mu.Unlock()
	if !settled {
		return nodes, stored, subs, nil
	}
	var in []placement.ANAHost
	for k, nss := range hosts {
		h := placement.ANAHost{Subsystem: k[0], Host: k[1], Policy: policy[k[0]], Nodes: reach[k]}
		for ns := range nss {
			h.NSIDs = append(h.NSIDs, ns)
		}
		in = append(in, h)
	}
	prev := map[placement.ANAKey]placement.ANAPaths{}
	for _, a := range stored {
		prev[placement.ANAKey{Subsystem: a.Subsystem, Host: a.Host, NSID: a.NSID}] = placement.ANAPaths{
			Optimized: a.Optimized, NonOptimized: a.NonOptimized}
	}
	out := placement.AssignANA(live, in, prev)
	next := make([]anaRecord, 0, len(out))
	for k, p := range out {
		next = append(next, anaRecord{Subsystem: k.Subsystem, Host: k.Host, NSID: k.NSID,
			Optimized: p.Optimized, NonOptimized: p.NonOptimized})
	}
	sort.Slice(next, func(i, j int) bool {
		a, b := next[i], next[j]
		if a.Subsystem != b.Subsystem {
			return a.Subsystem < b.Subsystem
		}
		if a.Host != b.Host {
			return a.Host < b.Host
		}
		return a.NSID < b.NSID
	})
	if encode(next) == encode(stored) || (len(next) == 0 && len(stored) == 0) {
		return nodes, next, subs, nil
	}
	if err := s.txn(ctx, func(stm concurrency.STM) error {
		stm.Put(anaKey, encode(next))
		return nil
	}); err != nil {
		return nil, nil, nil, err
	}
	for _, a := range next {
		if p, ok := prev[placement.ANAKey{Subsystem: a.Subsystem, Host: a.Host, NSID: a.NSID}]; !ok ||
			p.Optimized != a.Optimized || !slices.Equal(p.NonOptimized, a.NonOptimized) {
			s.log.Info("ANA paths assigned", "subsystem", a.Subsystem, "host", a.Host, "nsid", a.NSID,
				"optimized", a.Optimized, "non_optimized", a.NonOptimized, "was_optimized", p.Optimized,
				"live_access_nodes", live)
		}
	}
	return nodes, next, subs, nil
}

// ListANA lists the access nodes, the ANA assignments and the subsystem
// policies, for `basalt nvmf ls`.
func (h *handler) ListANA(ctx context.Context, _ *api.ListANARequest) (*api.ListANAResponse, error) {
	s := h.s
	recs, err := getPrefix[accessNodeRecord](ctx, s.cli, accessNodePrefix)
	if err != nil {
		return nil, err
	}
	subs, err := getPrefix[nvmfSubsystemRecord](ctx, s.cli, nvmfSubsysPrefix)
	if err != nil {
		return nil, err
	}
	stored, _, err := getOne[[]anaRecord](ctx, s.cli, anaKey)
	if err != nil {
		return nil, err
	}
	resp := &api.ListANAResponse{}
	now := time.Now()
	s.mu.Lock()
	for _, r := range recs {
		n := &api.AccessNode{Id: r.ID, Addr: r.Addr, IscsiPortal: r.ISCSIPortal, Name: r.Name}
		if l := s.accessNodes[r.ID]; l != nil {
			n.Online = now.Sub(l.last) <= s.cfg.HeartbeatTimeout
			n.LastHeartbeatUnixMs = l.last.UnixMilli()
			if n.Online {
				n.IscsiSessions = l.sessions
			}
		}
		resp.Nodes = append(resp.Nodes, n)
	}
	s.mu.Unlock()
	for _, a := range stored {
		resp.Assignments = append(resp.Assignments, a.proto())
	}
	for _, r := range subs {
		resp.Subsystems = append(resp.Subsystems, r.proto())
	}
	return resp, nil
}
