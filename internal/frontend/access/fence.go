package access

import (
	"context"

	"github.com/basalt-storage/basalt/pkg/api"
)

// mayWrite is the NVMe/TCP server's MayWrite: whether hostNQN may write
// volume, from the volume's attachments in the MDS (the server keeps the
// answer per controller for MayWriteTTL; a reconnected host's new
// controller asks afresh).
func (n *Node) mayWrite(ctx context.Context, volume, hostNQN string) (bool, error) {
	r, err := n.mds.GetVolume(ctx, &api.GetVolumeRequest{Name: volume})
	if err != nil {
		return false, err
	}
	return HostMayWrite(r.Volume, hostNQN), nil
}

// HostMayWrite reports whether the NVMe host hostNQN may write v: a volume
// attached to no node (not published by the CSI driver) may be written by
// every host; an attached one only by the host a writable attachment names
// — so a host whose node the volume was published away from (fenced) stays
// fenced when its kernel reconnects. A writable attachment with no host NQN
// (recorded before MDSs kept one, or its node registered none) is unknown:
// every host may write.
func HostMayWrite(v *api.Volume, hostNQN string) bool {
	for _, a := range v.Attachments {
		if !a.ReadOnly && (a.HostNqn == "" || a.HostNqn == hostNQN) {
			return true
		}
	}
	return len(v.Attachments) == 0
}
