package nvmf

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"time"
)

// Discovery log change notices. A host that keeps its discovery controller
// (`nvme discover --persistent`, `nvme connect-all --persistent`) enables
// them (Asynchronous Event Configuration bit 31, advertised in the
// discovery controller's OAES) and holds an Asynchronous Event Request;
// when the log that host would read changes — an access node joins or
// leaves, a group subsystem is defined or edited (SetPaths), a volume is
// created or deleted, an allow-list changes — the controller completes the
// AER with a Discovery Log Page Change notice and bumps the log's
// generation counter. Further notices wait until the host reads the log
// (without RAE). Linux passes the notice to user space as a uevent
// (NVME_AEN=0x70f002), on which nvme-cli's udev rule runs `nvme
// connect-all` through the same controller.
//
// SetPaths rebuilds the logs of the controllers that enabled the notices at
// once; volumes and allow-lists are not pushed to the access node, so a
// loop rebuilds them every Config.DiscoveryCheck as well.

// aenDiscChange is the completion dword 0 of an Asynchronous Event Request
// reporting a discovery log change: type notice (2), information 0xF0
// (Discovery Log Page Change), log page 0x70.
const aenDiscChange = 0x2 | 0xf0<<8 | logDiscovery<<16

// aenDiscEnabled is the Asynchronous Event Configuration bit (feature 0x0B)
// that enables Discovery Log Page Change notices; a discovery controller's
// OAES advertises it.
const aenDiscEnabled = 1 << 31

// Discovery log record subtypes and entry flags (EFLAGS).
const (
	subtypeNVM         = 2 // an NVM subsystem
	subtypeCurrentDisc = 3 // the discovery subsystem returning the log
	// eflagsDupRetInfo: every record with it set gives the same log;
	// eflagsEPCSD: the discovery controller keeps explicit persistent
	// connections (Keep Alive, change notices).
	eflagsDupRetInfo = 1 << 0
	eflagsEPCSD      = 1 << 1
)

// discoveryLog returns the discovery log page of c, a discovery controller
// whose host reached this node at local (the address the log gives without
// Config.AdvertiseAddr or ports): every subsystem the host may connect to
// (mayConnect), once per access node, then the current discovery subsystem
// once per access node (SUBTYPE 3, TP 8013: every access node's discovery
// controller gives the same log, so each record has DUPRETINFO, and each
// keeps persistent connections with change notices, EPCSD; a TP 8013 host
// reads EPCSD there and finds the other nodes to rediscover through).
// names are the volumes (Exports.List). GENCTR counts the changes of this
// log the controller has seen, by its host's reads or by
// refreshDiscovery's rebuilds. An allow-list that cannot be read leaves
// its subsystem out of a host's read (with the error), and makes a rebuild
// return only the error: no change is known.
func (s *Server) discoveryLog(ctx context.Context, c *controller, names []string, read bool) ([]byte, error) {
	ports, groups, grouped := s.ports() // Multipath: every live access node, group subsystems
	nqns := make([]string, 0, len(names)+len(groups))
	var denyErr error
	add := func(nqn string, vols []string) {
		ok, err := s.mayConnect(ctx, c.hostNQN, vols)
		if err != nil {
			denyErr = err
		}
		if ok {
			nqns = append(nqns, nqn)
		}
	}
	for _, n := range names {
		if !grouped[n] {
			add(VolumeNQNPrefix+n, []string{n})
		}
	}
	for _, g := range groups {
		if vols, ok := s.subsystemVolumes(g); ok {
			add(g, vols)
		}
	}
	if len(ports) == 0 {
		addr := s.cfg.AdvertiseAddr
		if addr == "" {
			addr = c.local
		}
		ports = []Port{{ID: 1, Addr: addr}}
	}
	n := (len(nqns) + 1) * len(ports)
	page := make([]byte, 1024*(1+n))
	h := fnv.New64a()
	for _, n := range nqns {
		h.Write([]byte(n + "\x00"))
	}
	for _, p := range ports {
		fmt.Fprintf(h, "%d %s\x00", p.ID, p.Addr)
	}
	if denyErr != nil && !read {
		return nil, denyErr // no change, as far as anyone knows
	}
	binary.LittleEndian.PutUint64(page[0:], c.discoverySeen(h.Sum64()|1))
	binary.LittleEndian.PutUint64(page[8:], uint64(n))
	i := 0
	for _, nqn := range append(nqns, DiscoveryNQN) {
		for _, p := range ports {
			host, port, err := net.SplitHostPort(p.Addr)
			if err != nil {
				host, port = p.Addr, strconv.Itoa(4420)
			}
			adrfam := byte(1)
			if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
				adrfam = 2
			}
			i++
			e := page[1024*i:]
			// TCP, address family, subtype; TREQ: no secure channel
			// requirement, SQ flow control disable supported (a Connect may
			// set CATTR bit 2; nvmet says the same, and nvme connect-all then
			// asks for it).
			e[0], e[1], e[2], e[3] = 3, adrfam, subtypeNVM, treqNoSQFlow
			if nqn == DiscoveryNQN {
				e[2] = subtypeCurrentDisc
				binary.LittleEndian.PutUint16(e[10:], eflagsDupRetInfo|eflagsEPCSD)
			}
			binary.LittleEndian.PutUint16(e[4:], uint16(p.ID))
			binary.LittleEndian.PutUint16(e[6:], 0xffff)
			binary.LittleEndian.PutUint16(e[8:], 32)
			pad(e[32:64], port)
			copy(e[256:512], nqn)
			pad(e[512:768], host)
		}
	}
	return page, denyErr
}

// discoverySeen records that c's discovery log now has the content whose
// hash is sum and returns the generation counter for it: a change bumps
// it. A change the host has not read (without RAE) is notified once the
// host enabled notices, holds an AER and read the last notice's log.
func (c *controller) discoverySeen(sum uint64) uint64 {
	c.mu.Lock()
	if c.discSum != 0 && c.discSum != sum {
		c.discGen++
	}
	c.discSum = sum
	gen := c.discGen
	d, dw0 := c.deliverLocked()
	c.mu.Unlock()
	if d != nil {
		d.c.complete(d, scSuccess, dw0, 0)
	}
	return gen
}

// controllers returns the discovery controllers, or the I/O controllers,
// connected now.
func (s *Server) controllers(discovery bool) []*controller {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ctrls []*controller
	for _, c := range s.ctrls {
		if c.discovery == discovery {
			ctrls = append(ctrls, c)
		}
	}
	return ctrls
}

// refreshDiscovery rebuilds the discovery log of every discovery
// controller whose host enabled change notices, notifying those whose log
// changed.
func (s *Server) refreshDiscovery() {
	ctrls := s.controllers(true)
	var names []string
	listed := false
	for _, c := range ctrls {
		c.mu.Lock()
		on := c.aecfg&aenDiscEnabled != 0 && !c.dead
		c.mu.Unlock()
		if !on {
			continue
		}
		ctx, cancel := context.WithTimeout(s.conns.Context(), s.cfg.ConnectTimeout)
		if !listed {
			var err error
			if names, err = s.cfg.Exports.List(ctx); err != nil {
				cancel()
				s.log.Warn("nvmf: listing volumes to look for discovery log changes", "err", err)
				return // a failed list is no change: try at the next round
			}
			listed = true
		}
		if _, err := s.discoveryLog(ctx, c, names, false); err != nil {
			s.log.Warn("nvmf: an allow-list cannot be read to look for discovery log changes", "cntlid", c.id, "err", err)
		}
		cancel()
	}
}

// watchDiscovery runs refreshDiscovery every Config.DiscoveryCheck and when
// SetPaths kicks it, until the server shuts down.
func (s *Server) watchDiscovery() {
	t := time.NewTicker(s.cfg.DiscoveryCheck)
	defer t.Stop()
	done := s.conns.Context().Done()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		case <-s.discKick:
		}
		s.refreshDiscovery()
	}
}

// kickDiscovery asks watchDiscovery for a refresh now.
func (s *Server) kickDiscovery() {
	select {
	case s.discKick <- struct{}{}:
	default:
	}
}
