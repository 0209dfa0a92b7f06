package access

import (
	"context"
	"strings"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
)

// HostKind is how a host names itself to an access node: the identity an
// attachment records for it.
type HostKind int

const (
	// NVMeHost is an NVMe host NQN (Attachment.HostNqn).
	NVMeHost HostKind = iota
	// ISCSIInitiator is an iSCSI initiator name (Attachment.InitiatorIqn),
	// compared case-insensitively as iSCSI names are (RFC 3722).
	ISCSIInitiator
	// CSINode is a CSI node's id (Attachment.Node): the one client of the
	// node plugin's own NBD socket is that node's kernel.
	CSINode
)

// mayWrite is a target's MayWrite (NVMe/TCP, iSCSI, a CSI node's NBD): whether the host of
// kind named host may write volume, from the volume's attachments in the
// MDS (the target keeps the answer per controller or session for its
// MayWriteTTL, frontend.WriteGate; a reconnected host asks afresh).
func (n *Node) mayWrite(kind HostKind) frontend.MayWriteFunc {
	return func(ctx context.Context, volume, host string) (bool, error) {
		r, err := n.mds.GetVolume(ctx, &api.GetVolumeRequest{Name: volume})
		if err != nil {
			return false, err
		}
		return HostMayWrite(r.Volume, kind, host), nil
	}
}

// HostMayWrite reports whether the host of kind named host may write v: a
// volume attached to no node (not published by the CSI driver) may be
// written by every host; an attached one only by the host a writable
// attachment names — so a host whose node the volume was published away
// from (fenced) stays fenced when its kernel reconnects. A writable
// attachment naming no host of that kind (recorded before MDSs kept one, or
// its node registered none) is unknown: every host may write. Every
// attachment names its node.
func HostMayWrite(v *api.Volume, kind HostKind, host string) bool {
	for _, a := range v.Attachments {
		if a.ReadOnly {
			continue
		}
		switch kind {
		case NVMeHost:
			if a.HostNqn == "" || a.HostNqn == host {
				return true
			}
		case ISCSIInitiator:
			if a.InitiatorIqn == "" || strings.EqualFold(a.InitiatorIqn, host) {
				return true
			}
		case CSINode:
			if a.Node == host {
				return true
			}
		}
	}
	return len(v.Attachments) == 0
}
