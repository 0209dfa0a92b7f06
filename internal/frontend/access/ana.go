package access

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/pkg/api"
)

// anaInterval is how often an access node heartbeats to the MDS (and
// sooner when a host connects or leaves).
const anaInterval = time.Second

// registration is what this node registered with the MDS as an access node.
type registration struct {
	nvmf, iscsi string // the NVMe/TCP address and iSCSI portal hosts reach; "": not announced
	loop        bool   // heartbeatLoop runs
}

// announce registers this node with the MDS under the addresses announced
// so far (a second call, for the second protocol, keeps the id: the MDS
// matches either address) and starts the heartbeats once.
func (n *Node) announce(name string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := n.mds.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: n.reg.nvmf, IscsiPortal: n.reg.iscsi, Name: name})
	if err != nil {
		return 0, fmt.Errorf("registering the access node (NVMe/TCP %q, iSCSI portal %q) with the MDS: %w", n.reg.nvmf, n.reg.iscsi, err)
	}
	if !n.reg.loop {
		n.reg.loop = true
		go n.heartbeatLoop(resp.Id, n.kickANA, n.stopANA)
	}
	return resp.Id, nil
}

// heartbeatLoop heartbeats to the MDS (with the NVMe/TCP hosts connected
// here, if this node serves NVMe/TCP in multipath) and installs the ANA
// paths it answers with, until stop closes. Without an answer the last
// paths stay.
func (n *Node) heartbeatLoop(id uint64, kick <-chan struct{}, stop <-chan struct{}) {
	t := time.NewTicker(anaInterval)
	defer t.Stop()
	var last uint64
	failing := false
	for {
		req := &api.AccessNodeHeartbeatRequest{Id: id}
		srv, isrv := n.announced()
		if srv != nil {
			for _, h := range srv.Hosts() {
				req.Hosts = append(req.Hosts, &api.NVMfHost{Subsystem: h.Subsystem, Host: h.Host, Nsids: h.NSIDs})
			}
		}
		if isrv != nil {
			for _, s := range isrv.Sessions() {
				req.IscsiSessions = append(req.IscsiSessions, &api.ISCSISession{Initiator: s.Initiator, Target: s.Target,
					Remote: s.Remote, Isid: hex.EncodeToString(s.ISID[:]), Tsih: uint32(s.TSIH), SinceUnixMs: s.Since.UnixMilli(),
					HeaderDigest: s.HeaderDigest, DataDigest: s.DataDigest})
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := n.mds.AccessNodeHeartbeat(ctx, req)
		cancel()
		switch {
		case err != nil:
			if !failing {
				n.log.Warn("access node heartbeat failed; the MDS may count this node offline (redirectors skip it), ANA states stay as last set", "access_node", id, "err", err)
			}
			failing = true
		default:
			if failing {
				n.log.Info("access node heartbeat works again", "access_node", id)
			}
			failing = false
			if srv != nil && resp.Revision != last {
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

// announced returns the NVMe/TCP server whose ANA paths the MDS assigns and
// the iSCSI server whose sessions the heartbeats report, each nil if none.
func (n *Node) announced() (*nvmf.Server, *iscsi.Server) {
	n.regMu.Lock()
	defer n.regMu.Unlock()
	return n.anaSrv, n.iscsiSrv
}

// pathsOf turns the MDS's answer into this node's ANA states.
func pathsOf(id uint64, resp *api.AccessNodeHeartbeatResponse) nvmf.Paths {
	p := nvmf.Paths{States: map[nvmf.PathKey]nvmf.ANAState{}, Groups: map[string][]string{}}
	for _, s := range resp.Subsystems {
		if len(s.Volumes) > 0 {
			p.Groups[s.Nqn] = s.Volumes
		}
	}
	for _, an := range resp.Nodes {
		if an.Addr != "" { // not an iSCSI portal alone
			p.Ports = append(p.Ports, nvmf.Port{ID: an.Id, Addr: an.Addr})
		}
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
