package mds

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

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
	if err := checkHostNQN(n.HostNqn); err != nil {
		return nil, fmt.Errorf("node %q: %w", n.Id, err)
	}
	if err := checkInitiatorIQN(n.InitiatorIqn); err != nil {
		return nil, fmt.Errorf("node %q: %w", n.Id, err)
	}
	if n.MaxVolumes < 0 {
		return nil, fmt.Errorf("%w: node %q: max_volumes %d < 0", ErrInvalidArgument, n.Id, n.MaxVolumes)
	}
	var rec nodeRecord
	err := s.txn(ctx, func(stm concurrency.STM) error {
		// The volumes attached stay: a node plugin registers at every start.
		var old nodeRecord
		if v := stm.Get(nodeKey(n.Id)); v != "" {
			var err error
			if old, err = decode[nodeRecord](v); err != nil {
				return err
			}
		}
		rec = nodeRecord{ID: n.Id, Zone: n.Zone, Server: n.Server, RegisteredMs: time.Now().UnixMilli(),
			MaxVolumes: n.MaxVolumes, HostNQN: n.HostNqn, InitiatorIQN: n.InitiatorIqn, Volumes: old.Volumes}
		stm.Put(nodeKey(rec.ID), encode(rec))
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("node registered", "node", rec.ID, "zone", rec.Zone, "server", rec.Server, "max_volumes", rec.MaxVolumes,
		"attached", len(rec.Volumes), "host_nqn", rec.HostNQN, "initiator_iqn", rec.InitiatorIQN)
	return &api.RegisterNodeResponse{Node: rec.proto()}, nil
}

func (r nodeRecord) proto() *api.Node {
	return &api.Node{Id: r.ID, Zone: r.Zone, Server: r.Server, RegisteredUnixMs: r.RegisteredMs,
		MaxVolumes: r.MaxVolumes, Attached: int64(len(r.Volumes)), HostNqn: r.HostNQN,
		InitiatorIqn: r.InitiatorIQN}
}

// checkHostNQN checks a node's NVMe host NQN: empty (unknown), or an NQN as
// NVMe defines one — "nqn." and at most 223 bytes — of printable ASCII.
func checkHostNQN(nqn string) error {
	if nqn == "" {
		return nil
	}
	ok := len(nqn) <= 223 && len(nqn) > len("nqn.") && strings.HasPrefix(nqn, "nqn.")
	for i := 0; ok && i < len(nqn); i++ {
		ok = nqn[i] > ' ' && nqn[i] < 0x7f
	}
	if !ok {
		return fmt.Errorf("%w: host NQN %q: want \"nqn.\" and at most 223 printable bytes", ErrInvalidArgument, nqn)
	}
	return nil
}

// checkInitiatorIQN checks a node's iSCSI initiator name: empty (unknown),
// or a name as RFC 3720 3.2.6 defines one — "iqn.", "eui." or "naa." and at
// most 223 bytes — of printable ASCII without spaces.
func checkInitiatorIQN(name string) error {
	if name == "" {
		return nil
	}
	ok := len(name) <= 223 && len(name) > len("iqn.")
	if ok {
		p := strings.ToLower(name[:4])
		ok = p == "iqn." || p == "eui." || p == "naa."
	}
	for i := 0; ok && i < len(name); i++ {
		ok = name[i] > ' ' && name[i] < 0x7f
	}
	if !ok {
		return fmt.Errorf("%w: iSCSI initiator name %q: want \"iqn.\", \"eui.\" or \"naa.\" and at most 223 printable bytes", ErrInvalidArgument, name)
	}
	return nil
}

// nodeVolumes adds (add) or drops the volume id in the node's list of
// attached volumes, in the transaction; with add it refuses a volume beyond
// the node's limit. A node record that is gone is left so.
func nodeVolumes(stm concurrency.STM, node string, id uint64, add bool) error {
	v := stm.Get(nodeKey(node))
	if v == "" {
		return nil
	}
	rec, err := decode[nodeRecord](v)
	if err != nil {
		return err
	}
	i := slices.Index(rec.Volumes, id)
	switch {
	case add && i >= 0, !add && i < 0:
		return nil
	case add:
		if rec.MaxVolumes > 0 && int64(len(rec.Volumes)) >= rec.MaxVolumes {
			return fmt.Errorf("%w: node %q has %d volumes attached, its limit", ErrAttachLimit, node, len(rec.Volumes))
		}
		rec.Volumes = append(slices.Clone(rec.Volumes), id)
	default:
		rec.Volumes = slices.Delete(slices.Clone(rec.Volumes), i, i+1)
	}
	stm.Put(nodeKey(node), encode(rec))
	return nil
}

// errCheckOnly aborts a CheckOnly AttachVolume's transaction once it would succeed.
var errCheckOnly = errors.New("mds: check only")

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
		nv := stm.Get(nodeKey(req.Node))
		if nv == "" {
			return fmt.Errorf("%w: node %q is not registered (its CSI node plugin never ran)", ErrNotFound, req.Node)
		}
		node, err := decode[nodeRecord](nv)
		if err != nil {
			return err
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
			if err := nodeVolumes(stm, req.Node, v.ID, true); err != nil {
				return err
			}
			keep = append(keep, attachmentRecord{Node: req.Node, ReadOnly: req.ReadOnly, AttachedMs: time.Now().UnixMilli(),
				HostNQN: node.HostNQN, InitiatorIQN: node.InitiatorIQN})
		}
		for _, n := range superseded {
			if err := nodeVolumes(stm, n, v.ID, false); err != nil {
				return err
			}
		}
		if req.CheckOnly {
			return errCheckOnly
		}
		if i >= 0 && len(superseded) == 0 {
			return nil // already so
		}
		rec.Attachments = keep
		stm.Put(volumeKey(v.ID), encode(rec))
		return nil
	})
	if errors.Is(err, errCheckOnly) {
		return &api.AttachVolumeResponse{Volume: rec.proto()}, nil
	}
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
		if err := nodeVolumes(stm, req.Node, v.ID, false); err != nil {
			return err
		}
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
