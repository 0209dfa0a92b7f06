package mds

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/pkg/api"
)

// nodeRE is the rule for node ids: a Kubernetes node name fits (a DNS
// subdomain, at most 253 characters).
var nodeRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,253}$`)

func checkNode(id string) error {
	if !nodeRE.MatchString(id) {
		return fmt.Errorf("%w: node id %q: use 1 to 253 characters from A-Z a-z 0-9 . _ -", ErrInvalidArgument, id)
	}
	return nil
}

// RegisterNode records a host that attaches volumes, or updates its zone and
// server. Registering again is not an error.
func (h *handler) RegisterNode(ctx context.Context, req *api.RegisterNodeRequest) (*api.RegisterNodeResponse, error) {
	s := h.s
	n := req.GetNode()
	if n == nil {
		return nil, fmt.Errorf("%w: no node given", ErrInvalidArgument)
	}
	if err := checkNode(n.Id); err != nil {
		return nil, err
	}
	rec := nodeRecord{ID: n.Id, Zone: n.Zone, Server: n.Server, RegisteredMs: time.Now().UnixMilli()}
	lk := s.leaderKey()
	if lk == "" {
		return nil, ErrNotActive
	}
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(lk), ">", 0)).
		Then(clientv3.OpPut(nodeKey(rec.ID), encode(rec))).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, ErrNotActive
	}
	s.log.Info("node registered", "node", rec.ID, "zone", rec.Zone, "server", rec.Server)
	return &api.RegisterNodeResponse{Node: &api.Node{Id: rec.ID, Zone: rec.Zone, Server: rec.Server, RegisteredUnixMs: rec.RegisteredMs}}, nil
}

// AttachVolume records that a volume is published to a node; see
// api.AttachVolumeRequest for the rules.
func (h *handler) AttachVolume(ctx context.Context, req *api.AttachVolumeRequest) (*api.AttachVolumeResponse, error) {
	s := h.s
	if err := checkName("volume", req.Name); err != nil {
		return nil, err
	}
	if err := checkNode(req.Node); err != nil {
		return nil, err
	}
	var rec volumeRecord
	var superseded []string
	err := s.txn(ctx, func(stm concurrency.STM) error {
		superseded = nil
		v, err := volumeByName(stm, req.Name)
		if err != nil {
			return err
		}
		if stm.Get(nodeKey(req.Node)) == "" {
			return fmt.Errorf("%w: node %q is not registered (its CSI node plugin never ran)", ErrNotFound, req.Node)
		}
		rec = v
		i := slices.IndexFunc(v.Attachments, func(a attachmentRecord) bool { return a.Node == req.Node })
		if i >= 0 && v.Attachments[i].ReadOnly != req.ReadOnly {
			return fmt.Errorf("%w: volume %q is published to node %q with read_only=%v",
				ErrAlreadyExists, req.Name, req.Node, v.Attachments[i].ReadOnly)
		}
		keep := v.Attachments[:0:0]
		for _, a := range v.Attachments {
			if req.Exclusive && a.Node != req.Node {
				superseded = append(superseded, a.Node)
				continue
			}
			keep = append(keep, a)
		}
		if i < 0 {
			keep = append(keep, attachmentRecord{Node: req.Node, ReadOnly: req.ReadOnly, AttachedMs: time.Now().UnixMilli()})
		}
		if i >= 0 && len(superseded) == 0 {
			return nil // already so
		}
		rec.Attachments = keep
		stm.Put(volumeKey(v.ID), encode(rec))
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("volume attached", "volume", rec.ID, "name", rec.Name, "node", req.Node,
		"read_only", req.ReadOnly, "superseded", superseded)
	return &api.AttachVolumeResponse{Volume: rec.proto(), Superseded: superseded}, nil
}

// DetachVolume drops a volume's attachment to a node.
func (h *handler) DetachVolume(ctx context.Context, req *api.DetachVolumeRequest) (*api.DetachVolumeResponse, error) {
	s := h.s
	if err := checkName("volume", req.Name); err != nil {
		return nil, err
	}
	if err := checkNode(req.Node); err != nil {
		return nil, err
	}
	var changed bool
	err := s.txn(ctx, func(stm concurrency.STM) error {
		changed = false
		v, err := volumeByName(stm, req.Name)
		if err != nil {
			return nil // nothing to detach
		}
		i := slices.IndexFunc(v.Attachments, func(a attachmentRecord) bool { return a.Node == req.Node })
		if i < 0 {
			return nil
		}
		v.Attachments = slices.Delete(slices.Clone(v.Attachments), i, i+1)
		stm.Put(volumeKey(v.ID), encode(v))
		changed = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		s.log.Info("volume detached", "name", req.Name, "node", req.Node)
	}
	return &api.DetachVolumeResponse{}, nil
}
