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
	var changed []*controller
	for _, c := range s.ctrls {
		if c.discovery {
			continue
		}
		k := PathKey{c.subNQN, c.hostNQN, 1}
		if stateIn(old, k) != stateIn(p, k) {
			changed = append(changed, c)
		}
	}
	if len(changed) > 0 {
		s.anaChange++
	}
	s.mu.Unlock()
	for _, c := range changed {
		st := s.anaState(c)
		s.log.Info("nvmf: ANA state changed", "cntlid", c.id, "subnqn", c.subNQN, "hostnqn", c.hostNQN, "state", st.String())
		if st == ANAInaccessible {
			c.dropAttachment(nil) // another node writes now; ours would only be fenced
		}
		c.notifyANA()
	}
}

func stateIn(p Paths, k PathKey) ANAState {
	if st, ok := p.States[k]; ok {
		return st
	}
	return ANANonOptimized
}

// anaState is c's namespace's state on this node.
func (s *Server) anaState(c *controller) ANAState {
	if !s.cfg.Multipath {
		return ANAOptimized
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return stateIn(s.paths, PathKey{c.subNQN, c.hostNQN, 1})
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
		out = append(out, HostNamespaces{Subsystem: c.subNQN, Host: c.hostNQN, NSIDs: []uint32{1}})
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
// nil: this node alone.
func (s *Server) ports() []Port {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.paths.Ports)
}

// notifyANA completes an outstanding Asynchronous Event Request with an ANA
// change notice, or keeps the notice for the next one. Notices are masked
// from one sent until the host reads the ANA log page without RAE.
func (c *controller) notifyANA() {
	c.mu.Lock()
	if c.aecfg&aenANAEnabled == 0 || c.anaMasked {
		c.mu.Unlock()
		return
	}
	if len(c.aers) == 0 {
		c.anaPending = true
		c.mu.Unlock()
		return
	}
	cmd := c.aers[0]
	c.aers = c.aers[1:]
	c.anaMasked = true
	c.mu.Unlock()
	cmd.c.complete(cmd, scSuccess, aenANAChange, 0)
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
	if ctrl.anaPending && !ctrl.anaMasked {
		ctrl.anaPending, ctrl.anaMasked = false, true
		ctrl.mu.Unlock()
		c.complete(cmd, scSuccess, aenANAChange, 0)
		return
	}
	ctrl.aers = append(ctrl.aers, cmd)
	ctrl.mu.Unlock()
}

// anaLog builds the ANA log page of c: one ANA group per namespace (group
// id = NSID; today namespace 1), in c's state on this node. rgo: groups
// only, no NSID lists.
func (s *Server) anaLog(c *controller, rgo bool) []byte {
	st := s.anaState(c)
	s.mu.Lock()
	chg := s.anaChange
	s.mu.Unlock()
	page := make([]byte, 16+32+4)
	binary.LittleEndian.PutUint64(page[0:], chg)
	binary.LittleEndian.PutUint16(page[8:], 1) // one group
	g := page[16:]
	binary.LittleEndian.PutUint32(g[0:], 1) // group 1
	binary.LittleEndian.PutUint64(g[8:], chg)
	g[16] = byte(st)
	if rgo {
		return page[:48]
	}
	binary.LittleEndian.PutUint32(g[4:], 1)  // one namespace:
	binary.LittleEndian.PutUint32(g[32:], 1) // NSID 1
	return page
}

// attachment returns c's attachment, attaching the volume first if c has
// none (Config.Multipath attaches at the first I/O command, so that only
// the node the host uses takes the volume's writer role).
func (c *controller) attachment() (*frontend.Attachment, error) {
	c.attMu.Lock()
	defer c.attMu.Unlock()
	c.mu.Lock()
	att := c.att
	c.mu.Unlock()
	if att != nil {
		return att, nil
	}
	ctx, cancel := context.WithTimeout(c.s.conns.Context(), c.s.cfg.ConnectTimeout)
	att, err := c.s.cfg.Exports.Attach(ctx, c.volume)
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
	c.att = att
	c.mu.Unlock()
	c.s.log.Info("nvmf: volume attached", "cntlid", c.id, "volume", c.volume, "hostnqn", c.hostNQN)
	return att, nil
}

// dropAttachment retires c's attachment (att, or any when nil) after a
// fenced IO or a move to inaccessible: the next I/O command attaches anew.
// Retired attachments are detached with the controller's last connection.
func (c *controller) dropAttachment(att *frontend.Attachment) {
	if !c.s.cfg.Multipath {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.att == nil || (att != nil && c.att != att) {
		return
	}
	c.retired = append(c.retired, c.att)
	c.att = nil
}

// isFenced reports a classified IO error meaning another writer took over.
func isFenced(err error) bool { return errors.Is(err, frontend.ErrFenced) }
