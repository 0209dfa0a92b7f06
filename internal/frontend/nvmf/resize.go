package nvmf

import "slices"

// Online growth. A volume may grow while a host uses it (CSI
// ControllerExpandVolume, `basalt volume resize`). Each I/O controller
// subscribes its namespaces to their volumes' sizes (frontend.Exports.
// WatchSize: one watcher per volume re-reads it every ExportsConfig.
// SizeCheck, from the open backend or, before a Multipath controller's first
// I/O, from the metadata). A namespace whose volume grew takes the new size
// (Identify Namespace NSZE/NCAP/NUSE and the LBA range check), goes on the
// Changed Namespace List (log page 04h), and the controller sends a
// Namespace Attribute Changed notice on an Asynchronous Event Request. The
// Linux host then reads the list (clearing it), rescans and updates the
// block device's capacity in place: a mounted file system can grow into it
// (resize2fs, xfs_growfs).

// aenNSChanged is the completion dword 0 of an Asynchronous Event Request
// reporting a namespace change: type notice (2), information 0x00 (Namespace
// Attribute Changed), log page 0x04.
const aenNSChanged = 0x2 | 0x00<<8 | logChangedNS<<16

// aenNSEnabled is the Asynchronous Event Configuration bit (feature 0x0B)
// that enables Namespace Attribute notices; OAES advertises it in Identify.
const aenNSEnabled = 1 << 8

// maxChangedNS is the Changed Namespace List's capacity; more changes are
// reported as the single entry 0xffffffff ("more than 1024: rescan all").
const maxChangedNS = 1024

// watchSizes subscribes c's namespaces to their volumes' sizes until the
// controller ends (kill). A discovery controller has none.
func (c *controller) watchSizes() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	for _, ns := range c.namespaces() {
		if ns != nil {
			c.watchSizeLocked(ns)
		}
	}
}

// watchSizeLocked subscribes ns to its volume's size. Caller holds c.mu.
func (c *controller) watchSizeLocked(ns *namespace) {
	ns.unwatch = c.s.cfg.Exports.WatchSize(ns.volume, func(size int64) { c.sizeIs(ns, size) })
}

// sizeIs grows ns if its volume grew to size and notifies the host.
func (c *controller) sizeIs(ns *namespace, size int64) {
	nlb := uint64(size) >> ns.lbaShift
	old := ns.nlb.Load()
	if nlb <= old || !ns.nlb.CompareAndSwap(old, nlb) {
		return // volumes only grow; a smaller answer is stale
	}
	c.s.log.Info("nvmf: namespace grew", "cntlid", c.id, "nsid", ns.nsid, "volume", ns.volume,
		"old_bytes", old<<ns.lbaShift, "bytes", nlb<<ns.lbaShift)
	c.notifyNSChanged([]uint32{ns.nsid})
}

// notifyNSChanged puts nsids on the Changed Namespace List and delivers a
// Namespace Attribute Changed notice if it can (else it waits for an AER,
// for notices to be enabled, or for the host to read the list).
func (c *controller) notifyNSChanged(nsids []uint32) {
	c.mu.Lock()
	for _, id := range nsids {
		switch {
		case len(c.changedNS) == 1 && c.changedNS[0] == 0xffffffff:
		case slices.Contains(c.changedNS, id):
		case len(c.changedNS) == maxChangedNS:
			c.changedNS = []uint32{0xffffffff}
		default:
			c.changedNS = append(c.changedNS, id)
		}
	}
	c.nsPending = true
	cmd, dw0 := c.deliverLocked()
	c.mu.Unlock()
	if cmd != nil {
		cmd.c.complete(cmd, scSuccess, dw0, 0)
	}
}
