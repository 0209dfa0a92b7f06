package access

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/pkg/api"
)

// anaInterval is how often an access node heartbeats to the MDS (and
// sooner when a host connects or leaves).
const anaInterval = time.Second

// registerAccessNode registers this NVMe/TCP target with the MDS under the
// address hosts reach it on, and returns its id.
func (n *Node) registerAccessNode(addr, name string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := n.mds.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: addr, Name: name})
	if err != nil {
		return 0, fmt.Errorf("registering the NVMe/TCP access node %s with the MDS: %w", addr, err)
	}
	return resp.Id, nil
}

// anaLoop heartbeats to the MDS with the hosts connected here and installs
// the paths it answers with, until stop closes. Without an answer the last
// paths stay.
func (n *Node) anaLoop(id uint64, srv *nvmf.Server, kick <-chan struct{}, stop <-chan struct{}) {
	t := time.NewTicker(anaInterval)
	defer t.Stop()
	var last uint64
	failing := false
	for {
		hosts := srv.Hosts()
		req := &api.AccessNodeHeartbeatRequest{Id: id}
		for _, h := range hosts {
			req.Hosts = append(req.Hosts, &api.NVMfHost{Subsystem: h.Subsystem, Host: h.Host, Nsids: h.NSIDs})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := n.mds.AccessNodeHeartbeat(ctx, req)
		cancel()
		switch {
		case err != nil:
			if !failing {
				n.log.Warn("nvmf: access node heartbeat failed; keeping the last ANA states", "access_node", id, "err", err)
			}
			failing = true
		default:
			if failing {
				n.log.Info("nvmf: access node heartbeat works again", "access_node", id)
			}
			failing = false
			if resp.Revision != last {
				last = resp.Revision
				srv.SetPaths(pathsOf(id, resp))
			}
		}
		select {
		case <-stop:
			return
		case <-kick:
		case <-t.C:
		}
	}
}

// pathsOf turns the MDS's answer into this node's ANA states.
func pathsOf(id uint64, resp *api.AccessNodeHeartbeatResponse) nvmf.Paths {
	p := nvmf.Paths{States: map[nvmf.PathKey]nvmf.ANAState{}}
	for _, an := range resp.Nodes {
		p.Ports = append(p.Ports, nvmf.Port{ID: an.Id, Addr: an.Addr})
	}
	for _, a := range resp.Assignments {
		st := nvmf.ANAInaccessible
		switch {
		case a.Optimized == id:
			st = nvmf.ANAOptimized
		case slices.Contains(a.NonOptimized, id):
			st = nvmf.ANANonOptimized
		}
		p.States[nvmf.PathKey{Subsystem: a.Subsystem, Host: a.Host, NSID: a.Nsid}] = st
	}
	return p
}

// advertised is the address hosts reach ln on: adv if set, else ln's.
func advertised(adv string, ln net.Listener) string {
	if adv != "" {
		return adv
	}
	return ln.Addr().String()
}
