package nvmf

import (
	"context"
	"strings"
)

// Group edits. A group subsystem's volumes (Paths.Groups, `basalt nvmf
// group NAME VOL...`: NSID i is the i-th volume) may change while hosts are
// connected. SetPaths then brings each controller of the group to the new
// list (regroup): an NSID whose volume is new gets a namespace, one whose
// volume left loses it (its attachment is detached when the controller
// ends: commands in flight finish on it), one whose volume changed gets the
// new volume's; each such NSID goes on the Changed Namespace List (log page
// 04h) and the controller sends a Namespace Attribute Changed notice. Linux
// then rescans ("rescanning namespaces"), adds and removes block devices.
// A new volume whose allow-list does not admit the host (mayConnect) gets
// no namespace on that host's controllers. Append to grow a group and
// remove from its end to shrink it: Linux drops a namespace whose
// identifiers changed under the same NSID and adds it back only at a later
// rescan.

// groupNSMax is the room a group subsystem's controller announces for
// namespaces (NN, MNAN, ANAGRPMAX, NANAGRPID; ANA group id = NSID): a group
// may grow to it while hosts are connected. Linux sizes its ANA log buffer
// by these at Connect (16 + 256*(32+4) bytes here) and warns about a log
// past them.
const groupNSMax = 256

// nnOf is NN of a controller of subsystem subNQN that has n namespaces at
// Connect: a group's may grow.
func nnOf(subNQN string, n int) uint32 {
	if strings.HasPrefix(subNQN, GroupNQNPrefix) {
		return uint32(max(n, groupNSMax))
	}
	return uint32(n)
}

// regroup brings c's namespaces to its group's volumes as SetPaths left
// them (none if the group is gone) and notifies the host of the NSIDs that
// changed.
func (c *controller) regroup() {
	c.rgMu.Lock()
	defer c.rgMu.Unlock()
	vols, _ := c.s.subsystemVolumes(c.subNQN)
	vols = vols[:min(len(vols), int(c.nn))]
	log := c.s.log.With("cntlid", c.id, "subnqn", c.subNQN, "hostnqn", c.hostNQN)
	ctx, cancel := context.WithTimeout(c.s.conns.Context(), c.s.cfg.ConnectTimeout)
	defer cancel()
	old := c.namespaces()
	next := make([]*namespace, len(vols))
	var changed []uint32
	var added, removed []*namespace
	for i := range max(len(old), len(next)) {
		var was *namespace
		if i < len(old) {
			was = old[i]
		}
		if i < len(next) {
			if was != nil && was.volume == vols[i] {
				next[i] = was
				continue
			}
			if ok, err := c.s.mayConnect(ctx, c.hostNQN, vols[i:i+1]); !ok {
				log.Warn("nvmf: a group's new volume is not for this host", "nsid", i+1, "volume", vols[i], "err", err)
			} else if ns, err := c.s.newNamespace(ctx, c.hostNQN, uint32(i+1), vols[i], log); err != nil {
				log.Warn("nvmf: a group's new volume cannot be a namespace", "nsid", i+1, "volume", vols[i], "err", err)
			} else {
				next[i] = ns
				added = append(added, ns)
			}
		}
		if was == nil && (i >= len(next) || next[i] == nil) {
			continue // inactive before and after
		}
		if was != nil {
			removed = append(removed, was)
		}
		changed = append(changed, uint32(i+1))
	}
	if len(changed) == 0 {
		return
	}
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		for _, ns := range added {
			if ns.att != nil {
				ns.att.Detach()
			}
		}
		return
	}
	c.nss.Store(&next)
	var unwatch []func()
	for _, ns := range removed {
		if ns.unwatch != nil {
			unwatch = append(unwatch, ns.unwatch)
			ns.unwatch = nil
		}
		c.gone = append(c.gone, ns)
	}
	for _, ns := range added {
		c.watchSizeLocked(ns)
	}
	c.mu.Unlock()
	for _, stop := range unwatch {
		stop()
	}
	for _, ns := range added {
		log.Info("nvmf: namespace added to a connected controller", "nsid", ns.nsid, "volume", ns.volume)
	}
	for _, ns := range removed {
		log.Info("nvmf: namespace removed from a connected controller", "nsid", ns.nsid, "volume", ns.volume)
	}
	c.s.hostsChanged() // the MDS assigns the new namespaces' paths
	c.notifyNSChanged(changed)
}
