package nvmf

import (
	"context"
	"slices"
	"time"
)

// Online growth. A volume may grow while a host uses it (CSI
// ControllerExpandVolume, `basalt volume resize`). Every ResizeCheck each I/O
// controller re-reads the sizes of its namespaces' volumes; a namespace whose
// volume grew takes the new size (Identify Namespace NSZE/NCAP/NUSE and the
// LBA range check), goes on the Changed Namespace List (log page 04h), and the
// controller sends a Namespace Attribute Changed notice on an Asynchronous
// Event Request. The Linux host then reads the list (clearing it), rescans
// and updates the block device's capacity in place: a mounted file system
// can grow into it (resize2fs, xfs_growfs).

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

// watchSizes re-reads the sizes of c's namespaces every Config.ResizeCheck
// until the controller ends. It runs on its own goroutine, one per I/O
// controller.
func (c *controller) watchSizes() {
	every := c.s.cfg.ResizeCheck
	if c.discovery || every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stopKA:
			return
		case <-t.C:
		}
		c.checkSizes(min(every, 10*time.Second))
	}
}

// checkSizes grows the namespaces whose volumes grew and notifies the host.
func (c *controller) checkSizes(timeout time.Duration) {
	var grown []uint32
	for _, ns := range c.nss {
		size, ok := c.volumeSize(ns, timeout)
		if !ok {
			continue
		}
		nlb := uint64(size) >> ns.lbaShift
		old := ns.nlb.Load()
		if nlb <= old || !ns.nlb.CompareAndSwap(old, nlb) {
			continue // volumes only grow; a smaller answer is stale
		}
		c.s.log.Info("nvmf: namespace grew", "cntlid", c.id, "nsid", ns.nsid, "volume", ns.volume,
			"old_bytes", old<<ns.lbaShift, "bytes", nlb<<ns.lbaShift)
		grown = append(grown, ns.nsid)
	}
	if len(grown) > 0 {
		c.notifyNSChanged(grown)
	}
}

// volumeSize is ns's volume's size now: from its open backend (Check
// re-reads it) or, before the first I/O of a Multipath controller, from the
// volume's metadata. ok is false when it cannot be known now.
func (c *controller) volumeSize(ns *namespace, timeout time.Duration) (int64, bool) {
	c.mu.Lock()
	att := ns.att
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.s.conns.Context(), timeout)
	defer cancel()
	if att != nil {
		b := att.Backend()
		if err := b.Check(ctx); err != nil {
			return 0, false // fenced or deleted: its IO fails anyway
		}
		return b.Info().Size, true
	}
	info, err := c.s.cfg.Exports.Describe(ctx, ns.volume)
	if err != nil {
		return 0, false
	}
	return info.Size, true
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
