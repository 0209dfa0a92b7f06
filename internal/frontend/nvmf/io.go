package nvmf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"

	"github.com/basalt-storage/basalt/internal/bufpool"
	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
)

// statusOf maps a failed IO's error class to an NVMe status (frontend/doc.go).
func statusOf(err error) uint16 {
	switch {
	case errors.Is(err, errPreemptAborted):
		return scPreemptAbort
	case errors.Is(err, frontend.ErrReadOnly):
		return scWriteProtected | dnr
	case errors.Is(err, frontend.ErrFenced):
		return scANAInaccessible
	case errors.Is(err, frontend.ErrNoSpace):
		return scCapExceeded | dnr
	case errors.Is(err, frontend.ErrOutOfRange):
		return scLBARange | dnr
	case errors.Is(err, frontend.ErrInvalid):
		return scInvalidField | dnr
	case errors.Is(err, frontend.ErrNotSupported):
		return scInvalidOpcode | dnr
	case errors.Is(err, frontend.ErrUnavailable), errors.Is(err, frontend.ErrShuttingDown):
		return scNSNotReady
	}
	return scInternal
}

// status is statusOf for this server. A single access node (not Multipath)
// keeps a fenced attachment until the host reconnects, and the host has no
// other path: ANA Inaccessible there is final, so it carries DNR. Without it
// the kernel's multipath head (CMIC says multi-controller) re-reads the ANA
// log, finds the path optimized and resubmits the write, forever: the fenced
// node's late write hangs instead of failing.
func (c *conn) status(err error) uint16 {
	sc := statusOf(err)
	if sc == scANAInaccessible && !c.s.cfg.Multipath {
		sc |= dnr
	}
	return sc
}

// submit runs one backend IO for cmd; done runs with the classified error,
// errPreemptAborted if a Preempt and Abort aborted it (preempt.go) after gen
// was read, before its reservation check.
func (c *conn) submit(gen uint64, op api.Op, buf []byte, off, n int64, done func(error)) {
	att, ns := c.att, c.ns
	e, ok := ns.fence.enter(gen)
	if !ok {
		done(errPreemptAborted)
		return
	}
	c.wg.Add(1)
	att.Backend().Submit(op, buf, off, n, func(err error) {
		if err != nil {
			err = att.Classify(err)
			if isFenced(err) {
				c.ctrl.dropAttachment(ns, att)
			}
		}
		if e.aborted.Load() {
			err = errPreemptAborted
		}
		done(err)
		e.leave() // after its answer is queued
		c.wg.Done()
	})
}

func (c *conn) io(cmd *command) {
	s := cmd.sqe
	ctrl := c.ctrl
	if ctrl.discovery {
		c.complete(cmd, scInvalidOpcode|dnr, 0, 0)
		return
	}
	if s.opcode == ioFlush && s.nsid == 0xffffffff {
		// Every namespace: a completed write is durable already (FUA
		// needs nothing either), so there is nothing to wait for.
		c.complete(cmd, scSuccess, 0, 0)
		return
	}
	ns := ctrl.namespace(s.nsid)
	if ns == nil {
		c.complete(cmd, scInvalidNS|dnr, 0, 0)
		return
	}
	c.ns = ns
	switch s.opcode {
	case ioResvRegister, ioResvReport, ioResvAcquire, ioResvRelease:
		c.reservationCmd(cmd, ns)
		return
	}
	gen := ns.fence.gen.Load() // before the check: a Preempt and Abort after it aborts the command
	if conflict, failed := c.resvConflict(cmd, ns); failed {
		return
	} else if conflict {
		c.complete(cmd, scResvConflict|dnr, 0, 0)
		return
	}
	if c.s.cfg.Multipath {
		if c.s.anaState(ctrl, ns.nsid) == ANAInaccessible {
			c.complete(cmd, scANAInaccessible, 0, 0)
			return
		}
		att, err := ctrl.attachment(ns)
		if err != nil {
			c.log.Warn("nvmf: the volume cannot be attached", "volume", ns.volume, "err", err)
			c.complete(cmd, scNSNotReady, 0, 0)
			return
		}
		c.att = att
	} else {
		c.att = ns.att
	}
	if s.opcode == ioFlush {
		if !ns.info.CanFlush {
			c.complete(cmd, scSuccess, 0, 0)
			return
		}
		c.submit(gen, api.OpFlush, nil, 0, 0, func(err error) { c.done(cmd, err) })
		return
	}
	slba := uint64(s.cdw[10]) | uint64(s.cdw[11])<<32
	nlb := uint64(s.cdw[12]&0xffff) + 1
	off, n := int64(slba<<ns.lbaShift), int64(nlb<<ns.lbaShift)
	switch s.opcode {
	case ioRead, ioWrite, ioCompare, ioWriteZeroes:
		if size := ns.nlb.Load(); slba >= size || nlb > size-slba {
			c.complete(cmd, scLBARange|dnr, 0, 0)
			return
		}
		if s.opcode != ioWriteZeroes && (n > int64(c.s.cfg.MaxTransfer) || int64(s.sglLen) != n) {
			c.complete(cmd, scInvalidField|dnr, 0, 0)
			return
		}
		if (s.opcode == ioWrite || s.opcode == ioWriteZeroes) && ns.readOnly {
			c.complete(cmd, scWriteProtected|dnr, 0, 0)
			return
		}
		if (s.opcode == ioWrite || s.opcode == ioWriteZeroes) && !c.mayWrite(cmd, ns) {
			return
		}
	}
	switch s.opcode {
	case ioRead:
		// Pooled, back once the C2HData PDUs are written: a fresh buffer
		// per read was most of the target's garbage.
		p := bufpool.Get(int(n))
		c.submit(gen, api.OpRead, *p, off, n, func(err error) {
			if err != nil {
				bufpool.Put(p)
				c.complete(cmd, c.status(err), 0, 0)
				return
			}
			c.completeDataThen(cmd, *p, func() { bufpool.Put(p) })
		})
	case ioWrite:
		// FUA (cdw12 bit 30) needs nothing: every completed write is durable.
		c.submit(gen, api.OpWrite, cmd.data, off, n, func(err error) {
			cmd.putData() // the backend is done with it
			c.done(cmd, err)
		})
	case ioCompare:
		buf := make([]byte, n)
		c.submit(gen, api.OpRead, buf, off, n, func(err error) {
			switch {
			case err != nil:
				c.complete(cmd, c.status(err), 0, 0)
			case !bytes.Equal(buf, cmd.data):
				c.complete(cmd, scCompareFailed|dnr, 0, 0)
			default:
				c.complete(cmd, scSuccess, 0, 0)
			}
		})
	case ioWriteZeroes:
		if ns.info.CanWriteZeroes {
			c.submit(gen, api.OpWriteZeroes, nil, off, n, func(err error) { c.done(cmd, err) })
			return
		}
		c.submit(gen, api.OpWrite, make([]byte, n), off, n, func(err error) { c.done(cmd, err) })
	case ioDSM:
		c.dsm(cmd, gen)
	default:
		c.complete(cmd, scInvalidOpcode|dnr, 0, 0)
	}
}

// mayWrite reports whether the controller's host may write ns's volume
// (Config.MayWrite, through ns.write: only the first write waits for an
// answer); when not, it has completed cmd. A host refused is refused on
// every path — the answer is about the host, not this access node — so its
// ANA Inaccessible carries DNR even on a Multipath node.
func (c *conn) mayWrite(cmd *command, ns *namespace) bool {
	ok, err := ns.write.Allow()
	switch {
	case err != nil:
		c.complete(cmd, scNSNotReady, 0, 0)
	case !ok:
		c.complete(cmd, scANAInaccessible|dnr, 0, 0)
	}
	return ok
}

func (c *conn) done(cmd *command, err error) {
	if err != nil {
		c.complete(cmd, c.status(err), 0, 0)
		return
	}
	c.complete(cmd, scSuccess, 0, 0)
}

// dsm serves Dataset Management: deallocate trims each range; the other
// attributes are hints. Linux sends a 4 KiB buffer whatever the range count,
// so only the first NR ranges of the data are read.
func (c *conn) dsm(cmd *command, gen uint64) {
	s := cmd.sqe
	ns := c.ns
	nr := int(s.cdw[10]&0xff) + 1
	if s.cdw[11]&4 == 0 || !ns.info.CanTrim {
		c.complete(cmd, scSuccess, 0, 0)
		return
	}
	if ns.readOnly {
		c.complete(cmd, scWriteProtected|dnr, 0, 0)
		return
	}
	if !c.mayWrite(cmd, ns) {
		return
	}
	if len(cmd.data) < nr*16 {
		c.complete(cmd, scInvalidField|dnr, 0, 0)
		return
	}
	type rng struct{ off, n int64 }
	var ranges []rng
	for i := range nr {
		r := cmd.data[i*16:]
		nlb := uint64(binary.LittleEndian.Uint32(r[4:]))
		slba := binary.LittleEndian.Uint64(r[8:])
		if nlb == 0 {
			continue
		}
		if size := ns.nlb.Load(); slba >= size || nlb > size-slba {
			c.complete(cmd, scLBARange|dnr, 0, 0)
			return
		}
		ranges = append(ranges, rng{int64(slba << ns.lbaShift), int64(nlb << ns.lbaShift)})
	}
	if len(ranges) == 0 {
		c.complete(cmd, scSuccess, 0, 0)
		return
	}
	var mu sync.Mutex
	left := len(ranges)
	var first error
	for _, r := range ranges {
		c.submit(gen, api.OpTrim, nil, r.off, r.n, func(err error) {
			mu.Lock()
			if err != nil && first == nil {
				first = err
			}
			left--
			last := left == 0
			mu.Unlock()
			if last {
				c.done(cmd, first)
			}
		})
	}
}
