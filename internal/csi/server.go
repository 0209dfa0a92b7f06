package csi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// DriverName is the CSI driver name: the CSIDriver object's name and the
// StorageClass's provisioner.
const DriverName = "csi.basalt.io"

// TopologyZoneKey is the topology segment NodeGetInfo reports the node's zone under.
const TopologyZoneKey = "topology.basalt.io/zone"

// DefaultMaxVolumes is a node's attach limit when neither Config.MaxVolumes
// nor the NBD device count gives one: each attached volume holds a client
// (sessions, buffers) in the node plugin.
const DefaultMaxVolumes = 128

// Modes of the plugin.
const (
	ModeController = "controller"
	ModeNode       = "node"
	ModeAll        = "all"
)

// Config configures Serve.
type Config struct {
	// Endpoint is where to serve CSI: a Unix socket (unix:///path or a
	// path), or tcp://host:port. TCP is for tests and loopback only: CSI
	// has no authentication, so anyone who reaches the port can stage,
	// mount and delete volumes (a kubelet always uses the Unix socket).
	Endpoint string
	// MDS addresses; required.
	MDS []string
	// MDSTLS is the TLS configuration for the MDS: an admin certificate for
	// the controller (it creates and deletes volumes), an access or admin
	// one for a node plugin (docs/security.md). nil only for an --insecure MDS.
	MDSTLS *tls.Config
	// DataTLS is the same identity toward chunkservers (the controller's
	// fencing open, the node plugin's front end); nil without TLS.
	DataTLS *tls.Config
	// Mode: controller, node or all (both, as csi-sanity wants).
	Mode string
	// DriverName, default DriverName.
	DriverName string
	// NodeID is the node's id (the Kubernetes node name); node mode. Zone and
	// Server are registered with it.
	NodeID, Zone, Server string
	// HostNQN is the NVMe host NQN this node's kernel connects as (NVMe/TCP
	// stages pass it to nvme-cli); node mode. It is registered with the node,
	// and an access node lets only the host NQN of a volume's attachment
	// write it (docs/csi.md). Default: /etc/nvme/hostnqn; none: unknown.
	HostNQN string
	// InitiatorIQN is the iSCSI initiator name this node's iscsid logs in
	// as; node mode. It is registered with the node, and an access node
	// lets only the initiator name of a volume's attachment write it
	// (docs/csi.md). Default: open-iscsi's /etc/iscsi/initiatorname.iscsi,
	// which is what the logins use, so set it only when the plugin cannot
	// read that file; none: unknown.
	InitiatorIQN string
	// StateDir holds the node plugin's NBD socket and per-volume state; node mode.
	StateDir string
	// Attach: auto (NVMe/TCP when nvme-cli and the nvme-tcp module are
	// there, else kernel NBD when /dev/nbd0 and nbd-client exist, else
	// nbdfuse and a loop device), nvmf, nbd or nbdfuse.
	Attach string
	// NBDTarget, if set, is the NBD server (host:port) of an access node
	// (`basalt nbd` with --tls-policy allow: the kernel's nbd-client cannot
	// do TLS): a kernel NBD stage connects there instead of to the plugin's
	// own front end — for a host whose kernel reaches the access node but
	// not the chunkservers.
	NBDTarget string
	// NVMfTarget, if set, is the NVMe/TCP target (host:port) of an access
	// node (`basalt nvmf`): an NVMe/TCP stage connects there instead of to
	// the plugin's own loopback target — for a host whose kernel reaches
	// the access node but not the chunkservers. NVMfDiscovery wins.
	NVMfTarget string
	// NVMfDiscovery, if set, is the discovery controller (host:port) of the
	// cluster's NVMe/TCP access nodes (`basalt nvmf --multipath`): an NVMe/TCP
	// stage connects to every path its discovery log lists for the volume
	// (native NVMe multipath, the MDS choosing the optimized path) instead
	// of to the plugin's own loopback target.
	NVMfDiscovery string
	// MaxVolumes is the node's attach limit NodeGetInfo reports (the
	// scheduler places no more volumes here); 0: the number of NBD devices
	// for kernel NBD, else DefaultMaxVolumes.
	MaxVolumes int64
	// MDSClient, if set, is used instead of dialing MDS.
	MDSClient *mdsclient.Client
	Logger    *slog.Logger
}

// Driver is a running CSI plugin.
type Driver struct {
	cfg  Config
	log  *slog.Logger
	mds  *mdsclient.Client
	srv  *grpc.Server
	lis  net.Listener
	node *Node
}

// Start listens on cfg.Endpoint and serves the services cfg.Mode names until Close.
func Start(cfg Config) (*Driver, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DriverName == "" {
		cfg.DriverName = DriverName
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAll
	}
	if cfg.Mode != ModeController && cfg.Mode != ModeNode && cfg.Mode != ModeAll {
		return nil, fmt.Errorf("csi: mode %q: want controller, node or all", cfg.Mode)
	}
	d := &Driver{cfg: cfg, log: cfg.Logger, mds: cfg.MDSClient}
	if d.mds == nil {
		mc, err := mdsclient.Dial(cfg.MDS, cfg.MDSTLS)
		if err != nil {
			return nil, err
		}
		d.mds = mc
	}
	lis, err := listen(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	if lis.Addr().Network() == "tcp" {
		d.log.Warn("csi: serving on TCP: CSI has no authentication, anyone who reaches the port controls the volumes; for tests and loopback only",
			"endpoint", lis.Addr().String())
	}
	d.lis = lis
	d.srv = grpc.NewServer(grpc.UnaryInterceptor(d.logCalls))
	csi.RegisterIdentityServer(d.srv, &identity{d: d})
	if cfg.Mode != ModeNode {
		csi.RegisterControllerServer(d.srv, &controller{d: d})
	}
	if cfg.Mode != ModeController {
		n, err := startNode(d)
		if err != nil {
			lis.Close()
			return nil, err
		}
		d.node = n
		csi.RegisterNodeServer(d.srv, n)
	}
	go func() { _ = d.srv.Serve(lis) }()
	d.log.Info("csi plugin serving", "endpoint", lis.Addr().String(), "mode", cfg.Mode, "driver", cfg.DriverName, "node", cfg.NodeID)
	return d, nil
}

// listen opens the endpoint: unix:///path (or a bare path), or tcp://host:port.
func listen(endpoint string) (net.Listener, error) {
	if addr, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("csi: endpoint %q: want tcp://host:port: %w", endpoint, err)
		}
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("csi: listen %s: %w", addr, err)
		}
		return lis, nil
	}
	path := strings.TrimPrefix(endpoint, "unix://")
	if path == "" {
		return nil, errors.New("csi: no endpoint")
	}
	if strings.Contains(path, "://") {
		return nil, fmt.Errorf("csi: endpoint %q: want unix:///path or tcp://host:port", endpoint)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	_ = os.Remove(path) // a stale socket of a previous run
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("csi: listen %s: %w", path, err)
	}
	return lis, nil
}

// Addr is the address the plugin serves on (a TCP endpoint's port when it
// asked for port 0).
func (d *Driver) Addr() net.Addr { return d.lis.Addr() }

// Close stops serving. Attached volumes stay attached only as long as the
// process lives: the NBD front end serving them stops with it.
func (d *Driver) Close() {
	d.srv.Stop()
	if d.node != nil {
		d.node.close()
	}
	if d.cfg.MDSClient == nil {
		d.mds.Close()
	}
}

// logCalls logs every call that failed, and every call at Debug.
func (d *Driver) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	if err != nil {
		d.log.Info("csi call failed", "method", method, "code", status.Code(err), "err", err, "took", time.Since(start))
	} else {
		d.log.Debug("csi call", "method", method, "took", time.Since(start))
	}
	return resp, err
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// identity is the CSI identity service.
type identity struct {
	csi.UnimplementedIdentityServer
	d *Driver
}

func (i *identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.d.cfg.DriverName, VendorVersion: version()}, nil
}

func (i *identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	var caps []*csi.PluginCapability
	if i.d.cfg.Mode != ModeNode {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}})
	}
	// ONLINE: a device attached over NVMe/TCP or kernel NBD learns the new
	// size while mounted (NodeExpandVolume). One over nbdfuse + loop keeps
	// its size until staged again: its NodeExpandVolume fails Unavailable
	// (the kubelet retries) until the pod restarts, and the stage grows the
	// file system offline (docs/csi.md).
	caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}})
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe is ready only when the MDS answers.
func (i *identity) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := i.d.mds.ListPools(ctx, &api.ListPoolsRequest{}); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "the MDS does not answer: %v", err)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
