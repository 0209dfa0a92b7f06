package nvmf

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sort"

	"github.com/basalt-storage/basalt/internal/frontend"
)

// ANAState is a path's Asymmetric Namespace Access state, as the ANA log
// page codes it.
type ANAState uint8

// ANA states (NVMe base specification, Asymmetric Namespace Access).
const (
	ANAOptimized    ANAState = 0x01
	ANANonOptimized ANAState = 0x02
	ANAInaccessible ANAState = 0x03
)

func (s ANAState) String() string {
	switch s {
	case ANAOptimized:
		return "optimized"
	case ANANonOptimized:
		return "non-optimized"
	case ANAInaccessible:
		return "inaccessible"
	}
	return "unknown"
}

// PathKey names one host's view of one namespace of a subsystem.
type PathKey struct {
	Subsystem string
	Host      string
	NSID      uint32
}

// Port is one access node serving the same subsystems: the discovery log
// lists each subsystem once per port.
type Port struct {
	ID   uint64 // the access node's id (PORTID in the discovery log)
	Addr string // host:port
}

// Paths is what the MDS assigned (Config.Multipath): the live access nodes
// and this node's ANA state per (subsystem, host, namespace). A key that is
// absent is non-optimized: usable, and not preferred by a host that has an
// optimized path.
type Paths struct {
	Ports  []Port
	States map[PathKey]ANAState
	// Groups are the subsystems of several namespaces (NQN → volumes in
	// NSID order), defined in the MDS; every volume also has its own
	// subsystem, VolumeNQNPrefix+NAME.
	Groups map[string][]string
}

// HostNamespaces is one host connected to a subsystem on this node.
type HostNamespaces struct {
	Subsystem string
	Host      string
	NSIDs     []uint32
}

// aenANAChange is the completion dword 0 of an Asynchronous Event Request
// reporting an ANA change: type notice (2), information 0x03, log page 0x0C.
const aenANAChange = 0x2 | 0x03<<8 | logANA<<16

// aenANAEnabled is the Asynchronous Event Configuration bit (feature 0x0B)
// that enables ANA change notices; OAES advertises it in Identify.
const aenANAEnabled = 1 << 11

// SetPaths installs new assignments. Controllers whose namespace changed
// state send an ANA change notice (or keep it until the host sends an
// Asynchronous Event Request).
func (s *Server) SetPaths(p Paths) {
	s.mu.Lock()
	old := s.paths
	s.paths = p
	type change struct {
		c  *controller
		ns *namespace
		st ANAState
	}
	var changes []change
	var regroup []*controller // controllers of a group whose volumes changed
	for _, c := range s.ctrls {
		if !c.discovery && !slices.Equal(old.Groups[c.subNQN], p.Groups[c.subNQN]) {
			regroup = append(regroup, c)
		}
		for _, ns := range c.namespaces() {
			if ns == nil {
				continue
			}
			k := PathKey{c.subNQN, c.hostNQN, ns.nsid}
			if st := stateIn(p, k); stateIn(old, k) != st {
				changes = append(changes, change{c, ns, st})
			}
		}
	}
	if len(changes) > 0 {
		s.anaChange++
	}
	s.mu.Unlock()
	s.kickDiscovery() // the ports or groups may have changed
	for _, c := range regroup {
		go c.regroup()
	}
	notified := map[*controller]bool{}
	for _, ch := range changes {
		s.log.Info("nvmf: ANA state changed", "cntlid", ch.c.id, "subnqn", ch.c.subNQN, "hostnqn", ch.c.hostNQN,
			"nsid", ch.ns.nsid, "state", ch.st.String())
		if ch.st == ANAInaccessible {
			ch.c.dropAttachment(ch.ns, nil) // another node writes now; ours would only be fenced
		}
		if !notified[ch.c] {
			notified[ch.c] = true
			ch.c.notifyANA()
		}
	}
}

func stateIn(p Paths, k PathKey) ANAState {
	if st, ok := p.States[k]; ok {
		return st
	}
	return ANANonOptimized
}

// anaState is the state of c's namespace nsid on this node.
func (s *Server) anaState(c *controller, nsid uint32) ANAState {
	if !s.cfg.Multipath {
		return ANAOptimized
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return stateIn(s.paths, PathKey{c.subNQN, c.hostNQN, nsid})
}

// Hosts lists the hosts connected to I/O subsystems on this node, for the
// MDS to assign their paths.
func (s *Server) Hosts() []HostNamespaces {
	s.mu.Lock()
	seen := map[[2]string]bool{}
	var out []HostNamespaces
	for _, c := range s.ctrls {
		k := [2]string{c.subNQN, c.hostNQN}
		if c.discovery || seen[k] {
			continue
		}
		seen[k] = true
		h := HostNamespaces{Subsystem: c.subNQN, Host: c.hostNQN}
		for _, ns := range c.namespaces() {
			if ns != nil {
				h.NSIDs = append(h.NSIDs, ns.nsid)
			}
		}
		out = append(out, h)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Subsystem != out[j].Subsystem {
			return out[i].Subsystem < out[j].Subsystem
		}
		return out[i].Host < out[j].Host
	})
	return out
}

// ports returns the access nodes the discovery log lists (multipath), or
// nil: this node alone; the NQNs of the group subsystems, sorted; and the
// volumes in a group (not listed under their own subsystem).
func (s *Server) ports() ([]Port, []string, map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var groups []string
	for nqn, vols := range s.paths.Groups {
		if len(vols) > 0 {
			groups = append(groups, nqn)
		}
	}
	slices.Sort(groups)
	return slices.Clone(s.paths.Ports), groups, s.groupedLocked()
}

// notifyANA records an ANA change for the host and delivers it if it can.
// A change while the host has not (yet) enabled ANA notices waits for
// that: a host that read the ANA log before a change and enabled notices
// after it must still hear of it.
func (c *controller) notifyANA() {
	c.mu.Lock()
	c.anaPending = true
	cmd, dw0 := c.deliverLocked()
	c.mu.Unlock()
	if cmd != nil {
		cmd.c.complete(cmd, scSuccess, dw0, 0)
	}
}

// deliverLocked takes an AER for a pending event, if one is held, its
// notices are enabled and not masked (from one sent until the host reads
// the event's log page without RAE): an ANA change first, then a namespace
// change, then a discovery log change, then reservation notifications
// (which no AEC bit turns off: feature 82h masks their types). It returns the command and its completion dword 0; the caller
// holds c.mu and completes the command after unlocking.
func (c *controller) deliverLocked() (*command, uint32) {
	if len(c.aers) == 0 {
		return nil, 0
	}
	var dw0 uint32
	switch {
	case c.anaPending && !c.anaMasked && c.aecfg&aenANAEnabled != 0:
		dw0 = aenANAChange
		c.anaPending, c.anaMasked = false, true
	case c.nsPending && !c.nsMasked && c.aecfg&aenNSEnabled != 0:
		dw0 = aenNSChanged
		c.nsPending, c.nsMasked = false, true
	case c.discGen > c.discRead && !c.discMasked && c.aecfg&aenDiscEnabled != 0:
		dw0 = aenDiscChange
		c.discMasked = true
	case len(c.resvLog) > 0 && !c.resvMasked:
		dw0 = aenResvLog
		c.resvMasked = true
	default:
		return nil, 0
	}
	cmd := c.aers[0]
	c.aers = c.aers[1:]
	return cmd, dw0
}

// asyncEvent holds an Asynchronous Event Request until there is an event.
func (c *conn) asyncEvent(cmd *command) {
	ctrl := c.ctrl
	ctrl.mu.Lock()
	if len(ctrl.aers) > 3 {
		ctrl.mu.Unlock()
		c.complete(cmd, scAERLimit|dnr, 0, 0)
		return
	}
	ctrl.aers = append(ctrl.aers, cmd)
	deliver, dw0 := ctrl.deliverLocked()
	ctrl.mu.Unlock()
	if deliver != nil {
		c.complete(deliver, scSuccess, dw0, 0)
	}
}

// anaLog builds the ANA log page of c: one ANA group per namespace (group
// id = NSID), each in the state of c's host's path through this node.
// rgo: groups only, no NSID lists.
func (s *Server) anaLog(c *controller, rgo bool) []byte {
	s.mu.Lock()
	chg := s.anaChange
	s.mu.Unlock()
	var nss []*namespace
	for _, ns := range c.namespaces() {
		if ns != nil {
			nss = append(nss, ns)
		}
	}
	page := make([]byte, 16, 16+len(nss)*36)
	binary.LittleEndian.PutUint64(page[0:], chg)
	binary.LittleEndian.PutUint16(page[8:], uint16(len(nss)))
	for _, ns := range nss {
		g := make([]byte, 32, 36)
		binary.LittleEndian.PutUint32(g[0:], ns.nsid) // ANA group id
		binary.LittleEndian.PutUint64(g[8:], chg)
		g[16] = byte(s.anaState(c, ns.nsid))
		if !rgo {
			binary.LittleEndian.PutUint32(g[4:], 1) // one namespace: its own
			g = binary.LittleEndian.AppendUint32(g, ns.nsid)
		}
		page = append(page, g...)
	}
	return page
}

// attachment returns ns's attachment, attaching its volume first if it has
// none (Config.Multipath attaches at the first I/O command, so that only
// the node the host uses takes the volume's writer role).
func (c *controller) attachment(ns *namespace) (*frontend.Attachment, error) {
	ns.attMu.Lock()
	defer ns.attMu.Unlock()
	c.mu.Lock()
	att := ns.att
	c.mu.Unlock()
	if att != nil {
		return att, nil
	}
	ctx, cancel := context.WithTimeout(c.s.conns.Context(), c.s.cfg.ConnectTimeout)
	att, err := c.s.cfg.Exports.Attach(ctx, ns.volume)
	cancel()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		att.Detach()
		return nil, frontend.ErrShuttingDown
	}
	ns.att = att
	c.mu.Unlock()
	c.s.log.Info("nvmf: volume attached", "cntlid", c.id, "nsid", ns.nsid, "volume", ns.volume, "hostnqn", c.hostNQN)
	return att, nil
}

// dropAttachment retires ns's attachment (att, or any when nil) after a
// fenced IO or a move to inaccessible: the next I/O command attaches anew.
// Retired attachments are detached with the controller's last connection.
func (c *controller) dropAttachment(ns *namespace, att *frontend.Attachment) {
	if !c.s.cfg.Multipath {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns.att == nil || (att != nil && ns.att != att) {
		return
	}
	ns.retired = append(ns.retired, ns.att)
	ns.att = nil
}

// isFenced reports a classified IO error meaning another writer took over.
func isFenced(err error) bool { return errors.Is(err, frontend.ErrFenced) }
