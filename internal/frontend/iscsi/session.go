package iscsi

import (
	"context"
	"encoding/binary"
	"net"
	"sort"
	"strconv"

	"github.com/basalt-storage/basalt/internal/frontend/iscsi/scsi"
)

func (c *conn) nopOut(p *pdu) {
	if !c.acceptCmdSN(p) || p.itt() == reservedTag {
		return // out of window, or the answer to a NOP-In we never send
	}
	r := &pdu{}
	r.bhs[0] = opNopIn
	r.bhs[1] = 0x80
	copy(r.bhs[8:16], p.bhs[8:16])
	r.put32(16, p.itt())
	r.put32(20, reservedTag)
	if len(p.data) > 0 {
		r.data = p.data[:min(len(p.data), c.peerMaxData)]
	}
	c.send(true, r)
}

// Task management functions and responses (RFC 7143 11.5, 11.6).
const (
	tmfAbortTask        = 1
	tmfAbortTaskSet     = 2
	tmfClearACA         = 3
	tmfClearTaskSet     = 4
	tmfLUNReset         = 5
	tmfTargetWarmReset  = 6
	tmfTargetColdReset  = 7
	tmfTaskReassign     = 8
	tmfComplete         = 0
	tmfNoTask           = 1
	tmfNoLUN            = 2
	tmfReassignUnsupp   = 4
	tmfNotSupported     = 5
	tmfFunctionRejected = 255
)

// taskMgmt answers a task management request. Aborted tasks get no
// response; the TMF response is sent once every one of them left the
// backend.
func (c *conn) taskMgmt(p *pdu) error {
	if !c.acceptCmdSN(p) {
		return nil
	}
	fn := p.bhs[1] & 0x7f
	respond := func(code byte, waits []*task, after func()) {
		r := &pdu{}
		r.bhs[0] = opTaskResp
		r.bhs[1] = 0x80
		r.bhs[2] = code
		r.put32(16, p.itt())
		if len(waits) == 0 {
			c.send(true, r)
			if after != nil {
				after()
			}
			return
		}
		chs := c.waitChans(waits) // now: the tasks are reused once released
		go func() {
			for _, ch := range chs {
				<-ch
			}
			c.send(false, r)
			if after != nil {
				after()
			}
		}()
	}
	lunOK := binary.BigEndian.Uint64(p.bhs[8:16]) == 0
	switch fn {
	case tmfAbortTask:
		rtt, ref := p.u32(20), p.u32(32)
		c.mu.Lock()
		t := c.tasks[rtt]
		c.mu.Unlock()
		if t != nil && t.counted && t.cmdSN != ref {
			// The tag names another command than the one meant (the tag was
			// reused after the referenced command completed): RefCmdSN must
			// be the referenced command's CmdSN (RFC 7143 11.5, RefCmdSN).
			t = nil
		}
		if t == nil {
			// RFC 7143 11.6.1 (ABORT TASK b, c): a RefCmdSN in the command window and before
			// this request's CmdSN names a command not received yet: it
			// counts as received (it will not run) and the abort is
			// complete. Else the command was answered already, or never
			// was: the task does not exist.
			exp := c.expCmdSN.Load()
			if int32(ref-exp) >= 0 && int32(ref-p.u32(24)) < 0 && int32(c.maxCmdSN(exp)-ref) >= 0 {
				c.skipCmdSN[ref] = true
				respond(tmfComplete, nil, nil)
			} else {
				respond(tmfNoTask, nil, nil)
			}
			return nil
		}
		respond(tmfComplete, c.abort([]*task{t}), nil)
	case tmfAbortTaskSet, tmfClearTaskSet, tmfLUNReset, tmfTargetWarmReset, tmfTargetColdReset:
		if !lunOK && (fn == tmfAbortTaskSet || fn == tmfClearTaskSet || fn == tmfLUNReset) {
			respond(tmfNoLUN, nil, nil)
			return nil
		}
		c.mu.Lock()
		var all []*task
		for _, t := range c.tasks {
			all = append(all, t)
		}
		c.mu.Unlock()
		if c.lu != nil && (fn == tmfLUNReset || fn == tmfTargetWarmReset || fn == tmfTargetColdReset) {
			c.lu.Reset() // a unit attention for every session of the volume
		}
		var after func()
		if fn == tmfTargetColdReset {
			after = func() { c.nc.Close() } // a cold reset ends the connection
		}
		respond(tmfComplete, c.abort(all), after)
	case tmfClearACA:
		respond(tmfNotSupported, nil, nil)
	case tmfTaskReassign:
		respond(tmfReassignUnsupp, nil, nil)
	default:
		respond(tmfNotSupported, nil, nil)
	}
	return nil
}

// abort aborts tasks: those waiting for data are dropped now; the ones in
// the backend are returned, to be waited for.
func (c *conn) abort(ts []*task) (executing []*task) {
	for _, t := range ts {
		t.aborted.Store(true)
		if t.executing {
			executing = append(executing, t)
			continue
		}
		c.complete(t, scsi.Result{Status: scsi.StatusTaskAborted})
	}
	return executing
}

// abortTasks aborts every task but the one running except (scsi.PR's
// AbortTasks: a PREEMPT AND ABORT preempted this nexus). It may run on any
// goroutine, so it only marks the tasks: one not started yet never starts
// (execute; the store to aborted before the load of started here, and the
// store to started before the load of aborted there, leave no task
// unaccounted), and the channel closes once the started ones left the
// backend (a reservation command never enters it: see scsi.PR.AbortTasks).
func (c *conn) abortTasks(except *scsi.Command) (int, <-chan struct{}) {
	c.mu.Lock()
	n := 0
	var started []chan struct{} // not the tasks: they are reused once released
	for _, t := range c.tasks {
		if except != nil && t.cmd == except {
			continue
		}
		t.aborted.Store(true)
		n++
		if t.started.Load() && !t.cmd.Reserves() {
			started = append(started, t.doneChan())
		}
	}
	c.mu.Unlock()
	done := make(chan struct{})
	if len(started) == 0 {
		close(done)
		return n, done
	}
	go func() {
		for _, ch := range started {
			<-ch
		}
		close(done)
	}()
	return n, done
}

// textRequest answers SendTargets (RFC 7143 Appendix C); a long answer goes
// in pieces of the initiator's MaxRecvDataSegmentLength.
func (c *conn) textRequest(p *pdu) {
	if !c.acceptCmdSN(p) {
		return
	}
	if p.bhs[1]&0x40 != 0 { // C: the initiator continues its text: not supported
		c.reject(p, rejectNotSupported)
		return
	}
	var out []byte
	if ttt := p.u32(20); ttt != reservedTag {
		rest, ok := c.textPending[ttt]
		if !ok {
			c.reject(p, rejectInvalidField)
			return
		}
		delete(c.textPending, ttt)
		out = rest
	} else {
		keys, err := parseText(p.data)
		if err != nil {
			c.log.Warn("iscsi: bad text request", "err", err)
			c.reject(p, rejectInvalidField)
			return
		}
		for _, x := range keys {
			switch x.k {
			case "SendTargets":
				out = append(out, c.sendTargets(x.v)...)
			case "MaxRecvDataSegmentLength":
				// Declarative; the value negotiated at login stays.
			default:
				out = appendText(out, x.k, "NotUnderstood")
			}
		}
	}
	r := &pdu{}
	r.bhs[0] = opTextResp
	r.put32(16, p.itt())
	copy(r.bhs[8:16], p.bhs[8:16])
	if len(out) > c.peerMaxData {
		r.bhs[1] = 0x40 // C
		c.nextTTT++
		if c.nextTTT == reservedTag {
			c.nextTTT = 0
		}
		if len(c.textPending) >= 4 {
			clear(c.textPending) // an initiator that never fetches the rest
		}
		c.textPending[c.nextTTT] = out[c.peerMaxData:]
		r.put32(20, c.nextTTT)
		out = out[:c.peerMaxData]
	} else {
		r.bhs[1] = 0x80 // F
		r.put32(20, reservedTag)
	}
	r.data = out
	c.send(true, r)
}

// sendTargets lists targets with their portal: every volume for "All" in a
// discovery session, else the one named (or this session's).
func (c *conn) sendTargets(v string) []byte {
	var names []string
	switch {
	case v == "All" && c.discovery:
		ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.LoginTimeout)
		vols, err := c.s.cfg.Exports.List(ctx)
		cancel()
		if err != nil {
			c.log.Warn("iscsi: SendTargets: listing volumes failed", "err", err)
		}
		for _, vol := range vols {
			names = append(names, TargetName(c.s.cfg.Cluster, vol))
		}
		sort.Strings(names)
	case v == "" || v == "All":
		if !c.discovery {
			names = []string{c.target}
		}
	default:
		if vol, ok := c.s.volumeOf(v); ok {
			ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.LoginTimeout)
			_, err := c.s.cfg.Exports.Describe(ctx, vol)
			cancel()
			if err == nil {
				names = []string{v}
			}
		}
	}
	portals := []string{c.portal()}
	if c.s.cfg.Redirect != nil {
		ctx, cancel := context.WithTimeout(c.s.ctx, c.s.cfg.LoginTimeout)
		ps, err := c.s.cfg.Redirect.Portals(ctx)
		cancel()
		if err != nil {
			c.log.Warn("iscsi: SendTargets: listing the access nodes' portals failed", "err", err)
		}
		portals = portals[:0]
		for _, p := range ps {
			portals = append(portals, p+",1")
		}
	}
	var out []byte
	for _, n := range names {
		out = appendText(out, "TargetName", n)
		for _, p := range portals {
			out = appendText(out, "TargetAddress", p)
		}
	}
	return out
}

// portal is this connection's local address as a TargetAddress value.
func (c *conn) portal() string {
	if a, ok := c.nc.LocalAddr().(*net.TCPAddr); ok {
		return net.JoinHostPort(a.IP.String(), strconv.Itoa(a.Port)) + ",1"
	}
	return c.nc.LocalAddr().String() + ",1"
}

// Logout reasons and responses (RFC 7143 11.14, 11.15).
const (
	logoutCloseSession    = 0
	logoutCloseConnection = 1
	logoutOK              = 0
	logoutNoRecovery      = 2
)

// logout answers a Logout Request. Closing the session or this connection
// waits for the commands in flight, answers, and ends the reader.
func (c *conn) logout(p *pdu) error {
	if !c.acceptCmdSN(p) {
		return nil
	}
	r := &pdu{}
	r.bhs[0] = opLogoutResp
	r.bhs[1] = 0x80
	r.put32(16, p.itt())
	switch p.bhs[1] & 0x7f {
	case logoutCloseSession, logoutCloseConnection:
		c.dropIdle()
		c.waitTasks()
		r.bhs[2] = logoutOK
		c.send(true, r)
		return errLogout
	default:
		r.bhs[2] = logoutNoRecovery
		c.send(true, r)
		return nil
	}
}
