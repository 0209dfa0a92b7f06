package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Node is the CSI node service.
type Node struct {
	csi.UnimplementedNodeServer
	d        *Driver
	sock     string       // the NBD front end's Unix socket
	nvmfAddr string       // its NVMe/TCP target on loopback; "" when the kernel has no nvme-tcp
	portal   string       // its iSCSI portal on loopback; "" when the kernel has no iSCSI initiator
	front    *access.Node // the front end every stage attaches to
	method   string       // the default attach: nvmf, nbd or nbdfuse
	hostNQN  string       // the host NQN NVMe/TCP stages connect as; "": nvme-cli's default (unknown)
	// initiatorIQN is the iSCSI initiator name iscsid logs in as
	// (registered with the node); "": unknown.
	initiatorIQN string
	// maxVolumes is NodeGetInfo's attach limit: Config.MaxVolumes, else
	// the number of /dev/nbdN devices for kernel NBD, else DefaultMaxVolumes.
	maxVolumes int64

	// mu serializes node operations; it guards fuse and the state files.
	mu   sync.Mutex
	fuse map[string]fuseProc // volume → its nbdfuse child
}

type fuseProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func startNode(d *Driver) (*Node, error) {
	cfg := d.cfg
	if cfg.NodeID == "" {
		return nil, errors.New("csi: node mode needs a node id")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("csi: node mode needs a state directory")
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "volumes"), 0o700); err != nil {
		return nil, err
	}
	n := &Node{d: d, sock: filepath.Join(cfg.StateDir, "nbd.sock"), fuse: map[string]fuseProc{}}
	nvme, iscsiOK := false, false
	switch cfg.Attach {
	case "", ProtocolAuto:
		nvme, iscsiOK = nvmeTCP(), iscsiKernel()
		switch {
		case nvme:
			n.method = ProtocolNVMf
		case kernelNBD():
			n.method = ProtocolNBD
		case iscsiOK:
			n.method = ProtocolISCSI
		default:
			n.method = ProtocolNbdfuse
		}
	case ProtocolNVMf:
		if nvme = nvmeTCP(); !nvme {
			return nil, errors.New("csi: attach nvmf: this host has no nvme-cli or no nvme-tcp kernel module")
		}
		n.method = cfg.Attach
	case ProtocolISCSI:
		if iscsiOK = iscsiKernel(); !iscsiOK {
			return nil, errors.New("csi: attach iscsi: this host has no iscsiadm or no iscsi_tcp kernel module")
		}
		n.method = cfg.Attach
	case ProtocolNBD, ProtocolNbdfuse:
		n.method = cfg.Attach
	default:
		return nil, fmt.Errorf("csi: attach %q: want auto, nvmf, nbd, iscsi or nbdfuse", cfg.Attach)
	}
	if nvme {
		n.hostNQN = nodeHostNQN(cfg.HostNQN, hostNQNFile, d.log)
	}
	if iscsiOK {
		n.initiatorIQN = nodeInitiatorIQN(cfg.InitiatorIQN, initiatorNameFile, d.log)
	}
	n.maxVolumes = cfg.MaxVolumes
	if n.maxVolumes <= 0 {
		n.maxVolumes = DefaultMaxVolumes
		if n.method == ProtocolNBD {
			devs, _ := filepath.Glob("/sys/block/nbd*")
			n.maxVolumes = int64(len(devs))
		}
	}
	// The MDS enforces the limit: ControllerPublishVolume beyond it is
	// ResourceExhausted.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := d.mds.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: cfg.NodeID, Zone: cfg.Zone, Server: cfg.Server, MaxVolumes: n.maxVolumes,
		HostNqn: n.hostNQN, InitiatorIqn: n.initiatorIQN}}); err != nil {
		return nil, fmt.Errorf("csi: registering node %q with the MDS: %w", cfg.NodeID, err)
	}
	acfg := access.Config{
		MDS: cfg.MDS, MDSTLS: cfg.MDSTLS, DataTLS: cfg.DataTLS, ClientName: "csi@" + cfg.NodeID, Logger: d.log,
		NBD: access.NBDConfig{Socket: n.sock, Node: cfg.NodeID},
	}
	if nvme {
		// Loopback only: the kernel of this node is the one host.
		acfg.NVMf = access.NVMfConfig{Listen: "127.0.0.1:0"}
	}
	if iscsiOK {
		// Loopback too; the targets' CHAP is for remote initiators.
		acfg.ISCSI = access.ISCSIConfig{Listen: "127.0.0.1:0", Cluster: iscsiCluster, IgnoreTargetCHAP: true}
	}
	front, err := access.Start(acfg)
	if err != nil {
		return nil, fmt.Errorf("csi: front end: %w", err)
	}
	n.front = front
	if nvme {
		n.nvmfAddr = tcpAddr(front.Addrs())
	}
	if iscsiOK {
		n.portal = front.ISCSIPortal().String()
	}
	d.log.Info("csi node ready", "node", cfg.NodeID, "host_nqn", n.hostNQN, "initiator_iqn", n.initiatorIQN, "attach", n.method, "nbd_socket", n.sock, "nvmf", n.nvmfAddr, "iscsi", n.portal)
	return n, nil
}

func (n *Node) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	_ = n.front.Close()
}

func (n *Node) volDir(vol string) string { return filepath.Join(n.d.cfg.StateDir, "volumes", vol) }
func (n *Node) statePath(vol string) string {
	return filepath.Join(n.volDir(vol), "stage.json")
}

func (n *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (n *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: n.d.cfg.NodeID, MaxVolumesPerNode: n.maxVolumes}
	if n.d.cfg.Zone != "" {
		resp.AccessibleTopology = &csi.Topology{Segments: map[string]string{TopologyZoneKey: n.d.cfg.Zone}}
	}
	return resp, nil
}

// volumeExists asks the MDS; an id that cannot be a volume name is NotFound.
func (n *Node) volumeExists(ctx context.Context, id string) error {
	_, err := n.d.mds.GetVolume(ctx, &api.GetVolumeRequest{Name: id})
	switch status.Code(err) {
	case codes.OK:
		return nil
	case codes.NotFound, codes.InvalidArgument:
		return status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	return mdsErr("GetVolume", err)
}

func (n *Node) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	switch {
	case req.VolumeId == "":
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	case req.StagingTargetPath == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path missing")
	case req.VolumeCapability == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability missing")
	}
	if err := checkCap(req.VolumeCapability); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := n.volumeExists(ctx, req.VolumeId); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if st, err := readState(n.statePath(req.VolumeId)); err == nil {
		if st.StagingPath != req.StagingTargetPath {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is staged at %s already", req.VolumeId, st.StagingPath)
		}
		if st.Block != isBlock(req.VolumeCapability) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is staged with another access type", req.VolumeId)
		}
		return &csi.NodeStageVolumeResponse{}, nil // staged already
	}
	st := &stageState{Volume: req.VolumeId, StagingPath: req.StagingTargetPath, Block: isBlock(req.VolumeCapability),
		ReadOnly: readOnlyMode(req.VolumeCapability) || req.PublishContext["readOnly"] == "true"}
	if !st.Block {
		st.FsType = req.VolumeCapability.GetMount().GetFsType()
		if st.FsType == "" {
			st.FsType = req.VolumeContext[ParamFsType]
		}
		if st.FsType == "" {
			st.FsType = "ext4"
		}
	}
	method := n.method
	proto := req.VolumeContext[ParamProtocol]
	if p := req.PublishContext[ParamProtocol]; p != "" {
		proto = p // the volume's mutable parameter (ControllerModifyVolume)
	}
	switch p := proto; p {
	case ProtocolNBD, ProtocolNbdfuse:
		method = p
	case ProtocolNVMf:
		if n.nvmfAddr == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q asks for NVMe/TCP, which this node's kernel lacks (nvme-cli, nvme-tcp)", req.VolumeId)
		}
		method = p
	case ProtocolISCSI:
		if n.portal == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q asks for iSCSI, which this node lacks (iscsiadm, iscsi_tcp)", req.VolumeId)
		}
		method = p
	}
	dir := n.volDir(req.VolumeId)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	var err error
	switch method {
	case ProtocolNVMf:
		if d := n.d.cfg.NVMfDiscovery; d != "" {
			var paths []string
			if paths, err = nvmfPaths(ctx, d, n.hostNQN, nvmf.VolumeNQNPrefix+st.Volume); err == nil {
				err = attachNVMfPaths(ctx, st, paths, n.hostNQN)
			}
			break
		}
		if t := n.d.cfg.NVMfTarget; t != "" {
			err = attachNVMfAt(ctx, st, t, n.hostNQN)
			break
		}
		err = n.attachNVMf(ctx, st)
	case ProtocolNBD:
		err = n.attachNBD(ctx, st)
	case ProtocolISCSI:
		err = attachISCSIAt(ctx, st, n.portal, iscsi.TargetName(iscsiCluster, st.Volume))
	default:
		err = n.attachNbdfuse(ctx, st, dir)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "attaching volume %q: %v", req.VolumeId, err)
	}
	fail := func(err error) (*csi.NodeStageVolumeResponse, error) {
		_ = unmount(context.Background(), st.StagingPath)
		if derr := n.detach(context.Background(), st); derr != nil {
			n.d.log.Info("detaching after a failed stage", "volume", st.Volume, "err", derr)
		}
		_ = os.RemoveAll(dir)
		return nil, status.Errorf(codes.Internal, "staging volume %q: %v", req.VolumeId, err)
	}
	if !st.Block {
		if err := formatAndMount(ctx, st, req.VolumeCapability.GetMount().GetMountFlags()); err != nil {
			return fail(err)
		}
	}
	if err := writeState(n.statePath(req.VolumeId), st); err != nil {
		return fail(err)
	}
	n.d.log.Info("volume staged", "volume", st.Volume, "device", st.Device, "method", st.Method, "path", st.StagingPath)
	return &csi.NodeStageVolumeResponse{}, nil
}

// formatAndMount makes the file system st.FsType on st.Device when the
// device is blank (the first MiB zeroes), grows an ext4 found there to the
// device, and mounts it on st.StagingPath (read-only with st.ReadOnly, with
// flags added). It records the type found in st.FsType.
func formatAndMount(ctx context.Context, st *stageState, flags []string) error {
	fs, err := hasFS(ctx, st.Device)
	if err != nil {
		return err
	}
	switch {
	case fs == "" && st.ReadOnly:
		return fmt.Errorf("the volume holds no file system and is read-only")
	case fs == "":
		if ok, err := blank(st.Device); err != nil || !ok {
			return fmt.Errorf("%s holds data but no file system blkid knows; not formatting it (%v)", st.Device, err)
		}
		if err := mkfs(ctx, st.FsType, st.Device); err != nil {
			return err
		}
	default:
		st.FsType = fs
		if fs == "ext4" && !st.ReadOnly {
			if err := growExt4Offline(ctx, st.Device); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(st.StagingPath, 0o750); err != nil {
		return err
	}
	opts := slices.Clone(flags)
	args := []string{"-t", st.FsType}
	if st.ReadOnly {
		opts = append(opts, "ro")
		if st.FsType == "ext4" {
			opts = append(opts, "noload")
		} else {
			opts = append(opts, "norecovery")
		}
	}
	if len(opts) > 0 {
		args = append(args, "-o", joinComma(opts))
	}
	_, err = run(ctx, "mount", append(args, st.Device, st.StagingPath)...)
	return err
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

func (n *Node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	switch {
	case req.VolumeId == "":
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	case req.StagingTargetPath == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path missing")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := readState(n.statePath(req.VolumeId))
	if errors.Is(err, os.ErrNotExist) {
		// Not staged (or unstaged already): make sure nothing is mounted there.
		if err := unmount(ctx, req.StagingTargetPath); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := unmount(ctx, st.StagingPath); err != nil {
		return nil, status.Errorf(codes.Internal, "unmounting %s: %v", st.StagingPath, err)
	}
	if err := n.detach(ctx, st); err != nil {
		return nil, status.Errorf(codes.Internal, "detaching %s: %v", st.Device, err)
	}
	if err := os.RemoveAll(n.volDir(req.VolumeId)); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	n.d.log.Info("volume unstaged", "volume", st.Volume, "device", st.Device)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (n *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	switch {
	case req.VolumeId == "":
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	case req.TargetPath == "":
		return nil, status.Error(codes.InvalidArgument, "target path missing")
	case req.StagingTargetPath == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path missing")
	case req.VolumeCapability == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability missing")
	}
	if err := checkCap(req.VolumeCapability); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := readState(n.statePath(req.VolumeId))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if verr := n.volumeExists(ctx, req.VolumeId); verr != nil {
				return nil, verr
			}
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged on this node", req.VolumeId)
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	if st.Block != isBlock(req.VolumeCapability) {
		return nil, status.Errorf(codes.InvalidArgument, "volume %q was staged with another access type", req.VolumeId)
	}
	if isMountPoint(req.TargetPath) {
		return &csi.NodePublishVolumeResponse{}, nil // published already
	}
	if singlePublish(req.VolumeCapability) {
		for _, p := range st.Targets {
			if p != req.TargetPath && isMountPoint(p) {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %q (single-node single-writer) is published at %s already", req.VolumeId, p)
			}
		}
	}
	src := st.StagingPath
	if st.Block {
		src = st.Device
		if err := os.MkdirAll(filepath.Dir(req.TargetPath), 0o750); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		f, err := os.OpenFile(req.TargetPath, os.O_CREATE, 0o600)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		f.Close()
	} else if err := os.MkdirAll(req.TargetPath, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := unix.Mount(src, req.TargetPath, "", unix.MS_BIND, ""); err != nil {
		return nil, status.Errorf(codes.Internal, "bind-mounting %s on %s: %v", src, req.TargetPath, err)
	}
	if req.Readonly {
		if err := unix.Mount("", req.TargetPath, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(req.TargetPath, 0)
			return nil, status.Errorf(codes.Internal, "remounting %s read-only: %v", req.TargetPath, err)
		}
	}
	if !slices.Contains(st.Targets, req.TargetPath) {
		st.Targets = append(st.Targets, req.TargetPath)
		if err := writeState(n.statePath(req.VolumeId), st); err != nil {
			_ = unix.Unmount(req.TargetPath, 0)
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case req.VolumeId == "":
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	case req.TargetPath == "":
		return nil, status.Error(codes.InvalidArgument, "target path missing")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := unmount(ctx, req.TargetPath); err != nil {
		return nil, status.Errorf(codes.Internal, "unmounting %s: %v", req.TargetPath, err)
	}
	if err := os.Remove(req.TargetPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if st, err := readState(n.statePath(req.VolumeId)); err == nil && slices.Contains(st.Targets, req.TargetPath) {
		st.Targets = slices.DeleteFunc(st.Targets, func(p string) bool { return p == req.TargetPath })
		if err := writeState(n.statePath(req.VolumeId), st); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// staged finds the stage of a volume whose path is its staging or a
// publish path; NotFound when the volume is not staged here or the path does
// not exist.
func (n *Node) staged(ctx context.Context, vol, path string) (*stageState, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, status.Errorf(codes.NotFound, "path %s: %v", path, err)
	}
	st, err := readState(n.statePath(vol))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if verr := n.volumeExists(ctx, vol); verr != nil {
				return nil, verr
			}
			return nil, status.Errorf(codes.NotFound, "volume %q is not staged on this node", vol)
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	return st, nil
}

func (n *Node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	switch {
	case req.VolumeId == "":
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	case req.VolumePath == "":
		return nil, status.Error(codes.InvalidArgument, "volume path missing")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := n.staged(ctx, req.VolumeId, req.VolumePath)
	if err != nil {
		return nil, err
	}
	if st.Block {
		size, err := deviceSize(st.Device)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(req.VolumePath, &fs); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	bs := int64(fs.Bsize)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(fs.Blocks) * bs, Available: int64(fs.Bavail) * bs, Used: int64(fs.Blocks-fs.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree), Used: int64(fs.Files - fs.Ffree)},
	}}, nil
}

// NodeGetStorageHealth reports the node's path to the cluster: UNREACHABLE
// when the MDS does not answer (no volume can be attached or grown here).
// The data path's health is per volume (NodeGetVolumeHealth).
func (n *Node) NodeGetStorageHealth(ctx context.Context, _ *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp := &csi.NodeGetStorageHealthResponse{}
	if _, err := n.d.mds.ListPools(ctx, &api.ListPoolsRequest{}); err != nil {
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: csi.StorageHealthErrorType_STORAGE_UNREACHABLE, Reason: "MDSUnreachable",
			Message: fmt.Sprintf("the MDS does not answer: %v", err)})
	}
	return resp, nil
}

// NodeGetVolumeHealth reports INACCESSIBLE when the device or mount a stage made is gone.
func (n *Node) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.volumeExists(ctx, req.VolumeId); err != nil {
		return nil, err
	}
	h := &csi.VolumeHealth{VolumeId: req.VolumeId}
	bad := func(msg string) {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "NotAttached", Message: msg})
	}
	st, err := readState(n.statePath(req.VolumeId))
	switch {
	case errors.Is(err, os.ErrNotExist):
		if req.StagingTargetPath != "" || req.VolumePublishPath != "" {
			bad("the volume is not staged on this node")
		}
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	default:
		if _, err := deviceSize(st.Device); err != nil {
			bad(fmt.Sprintf("device %s: %v", st.Device, err))
		} else if !st.Block && !isMountPoint(st.StagingPath) {
			bad("the staging path " + st.StagingPath + " is not mounted")
		}
		if p := req.VolumePublishPath; p != "" && !isMountPoint(p) {
			bad("the publish path " + p + " is not mounted")
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// NodeExpandVolume grows the file system to the volume's size, online: the
// staged device first learns the new size — NVMe/TCP by itself (the target's
// namespace notice; we wait for it), kernel NBD by NBD_SET_SIZE, a loop
// device over nbdfuse not at all (nbdfuse keeps the size of its connect: the
// volume grows at its next stage) — then resize2fs or xfs_growfs on the
// mounted file system.
func (n *Node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	switch {
	case req.VolumeId == "":
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	case req.VolumePath == "":
		return nil, status.Error(codes.InvalidArgument, "volume path missing")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := n.staged(ctx, req.VolumeId, req.VolumePath)
	if err != nil {
		return nil, err
	}
	v, err := n.d.mds.GetVolume(ctx, &api.GetVolumeRequest{Name: req.VolumeId})
	if err != nil {
		return nil, mdsErr("GetVolume", err)
	}
	volSize, want := int64(v.GetVolume().GetSize()), req.CapacityRange.GetRequiredBytes()
	if want > volSize {
		return nil, status.Errorf(codes.OutOfRange, "volume %q has %d bytes, less than the %d required: expand it first (ControllerExpandVolume)", req.VolumeId, volSize, want)
	}
	if want == 0 {
		want = volSize
	}
	size, err := growDevice(ctx, Attached{Method: st.Method, Device: st.Device, NBDIoctl: st.NBDIoctl}, want, volSize)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "volume %q: %v", req.VolumeId, err)
	}
	if !st.Block && !st.ReadOnly {
		if err := growFS(ctx, st.FsType, st.Device, st.StagingPath); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
