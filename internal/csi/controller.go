package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// Volume sizes.
const (
	// DefaultVolumeSize is the size of a volume created with no capacity range.
	DefaultVolumeSize = 1 << 30
	volumeAlign       = 4096    // the MDS's unit
	maxVolumeSize     = 1 << 52 // the MDS's limit (4 PiB)
)

// tokenPrefix marks a ListVolumes starting token: the name of the first
// volume of the next page.
const tokenPrefix = "next:"

// controller is the CSI controller service.
type controller struct {
	csi.UnimplementedControllerServer
	d *Driver
}

func (c *controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// mdsErr turns an MDS error into the CSI answer: the MDS's own gRPC code
// (NotFound, InvalidArgument, ...) is kept, with the call named.
func mdsErr(what string, err error) error {
	if s, ok := status.FromError(err); ok {
		return status.Errorf(s.Code(), "%s: %s", what, s.Message())
	}
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}

// sizeFor picks a volume size for a capacity range: the required bytes
// rounded up to 4 KiB, or the default (capped by the limit) when none is
// required.
func sizeFor(r *csi.CapacityRange) (uint64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity range: negative bytes")
	}
	if lim > 0 && req > lim {
		return 0, status.Errorf(codes.InvalidArgument, "capacity range: required %d > limit %d", req, lim)
	}
	size := uint64(req)
	if size == 0 {
		size = DefaultVolumeSize
		if lim > 0 && uint64(lim) < size {
			size = uint64(lim) / volumeAlign * volumeAlign
		}
	}
	size = (size + volumeAlign - 1) / volumeAlign * volumeAlign
	if size == 0 || (lim > 0 && size > uint64(lim)) {
		return 0, status.Errorf(codes.OutOfRange, "capacity range [%d, %d]: no multiple of 4096 bytes fits", req, lim)
	}
	if size > maxVolumeSize {
		return 0, status.Errorf(codes.OutOfRange, "capacity %d: more than the 4 PiB a volume may have", size)
	}
	return size, nil
}

// fits: an existing volume of size satisfies the range.
func fits(size uint64, r *csi.CapacityRange) bool {
	return size >= uint64(r.GetRequiredBytes()) && (r.GetLimitBytes() == 0 || size <= uint64(r.GetLimitBytes()))
}

func volumeContext(params map[string]string, v *api.Volume) map[string]string {
	ctx := map[string]string{ParamPool: v.PoolName}
	if fs := params[ParamFsType]; fs != "" {
		ctx[ParamFsType] = fs
	}
	if p := params[ParamProtocol]; p != "" {
		ctx[ParamProtocol] = p
	}
	return ctx
}

// ValidateParameters checks StorageClass parameters as CreateVolume does:
// pool, fsType (ext4, xfs), protocol (auto, nvmf, nbd, iscsi, nbdfuse) and the
// csi.storage.k8s.io/ keys the sidecars pass; nil when CreateVolume takes them.
func ValidateParameters(params map[string]string) error { return checkParams(params) }

func checkParams(params map[string]string) error {
	for k, v := range params {
		switch k {
		case ParamPool:
		case ParamFsType:
			if !fsTypes[v] {
				return status.Errorf(codes.InvalidArgument, "parameter fsType=%q: ext4 or xfs", v)
			}
		case ParamProtocol:
			if v != ProtocolAuto && v != ProtocolNVMf && v != ProtocolNBD && v != ProtocolISCSI && v != ProtocolNbdfuse {
				return status.Errorf(codes.InvalidArgument, "parameter protocol=%q: auto, nvmf, nbd, iscsi or nbdfuse", v)
			}
		default:
			if !strings.HasPrefix(k, "csi.storage.k8s.io/") {
				return status.Errorf(codes.InvalidArgument, "unknown parameter %q (pool, fsType, protocol)", k)
			}
		}
	}
	return nil
}

func (c *controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "name missing")
	}
	if err := checkCaps(req.VolumeCapabilities); err != nil {
		return nil, err
	}
	if req.VolumeContentSource != nil {
		return nil, status.Error(codes.InvalidArgument, "volume content sources (snapshots, clones) are not supported yet")
	}
	if err := checkParams(req.Parameters); err != nil {
		return nil, err
	}
	if err := checkMutable(req.MutableParameters); err != nil {
		return nil, err
	}
	size, err := sizeFor(req.CapacityRange)
	if err != nil {
		return nil, err
	}
	pool := req.Parameters[ParamPool]
	name := VolumeName(req.Name)
	var vol *api.Volume
	resp, err := c.d.mds.CreateVolume(ctx, &api.CreateVolumeRequest{Name: name, Size: size, Pool: pool})
	switch {
	case err == nil:
		vol = resp.Volume
	case status.Code(err) == codes.AlreadyExists:
		// Idempotent by name: the same request again gets the same volume.
		g, gerr := c.d.mds.GetVolume(ctx, &api.GetVolumeRequest{Name: name})
		if gerr != nil {
			return nil, mdsErr("CreateVolume", gerr)
		}
		vol = g.Volume
		if !fits(vol.Size, req.CapacityRange) || (pool != "" && vol.PoolName != pool) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with %d bytes in pool %q", req.Name, vol.Size, vol.PoolName)
		}
	default:
		return nil, mdsErr("CreateVolume", err)
	}
	if len(req.MutableParameters) > 0 {
		if vol, err = c.setMutable(ctx, vol.Name, req.MutableParameters); err != nil {
			return nil, err
		}
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId: vol.Name, CapacityBytes: int64(vol.Size), VolumeContext: volumeContext(req.Parameters, vol),
	}}, nil
}

func (c *controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	_, err := c.d.mds.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: req.VolumeId})
	switch status.Code(err) {
	case codes.OK, codes.NotFound, codes.InvalidArgument: // an id that cannot name a volume names none
		return &csi.DeleteVolumeResponse{}, nil
	}
	return nil, mdsErr("DeleteVolume", err)
}

// volumeNameRE is the MDS's rule for volume names.
var volumeNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// VolumeName is the basalt volume (and CSI volume id) CreateVolume makes for
// a CSI volume name: the name itself when the MDS takes it (the
// provisioner's pvc-UUID always fits), else the name with every other
// character made '_', cut to 111 characters, and "-" and 16 hex digits of
// its SHA-256 added, so that the same name always gives the same volume and
// two names do not collide.
func VolumeName(name string) string {
	if volumeNameRE.MatchString(name) {
		return name
	}
	b := []byte(name)
	for i, ch := range b {
		if !(ch >= 'A' && ch <= 'Z' || ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '_' || ch == '-') {
			b[i] = '_'
		}
	}
	if len(b) > 111 {
		b = b[:111]
	}
	sum := sha256.Sum256([]byte(name))
	return string(b) + "-" + hex.EncodeToString(sum[:8])
}

// getVolume reads a volume; an id that is not a volume name is NotFound.
func (c *controller) getVolume(ctx context.Context, id string) (*api.Volume, error) {
	g, err := c.d.mds.GetVolume(ctx, &api.GetVolumeRequest{Name: id})
	if err != nil {
		if status.Code(err) == codes.InvalidArgument {
			return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
		}
		return nil, mdsErr("GetVolume", err)
	}
	return g.Volume, nil
}

func (c *controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	switch {
	case req.VolumeId == "":
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	case req.NodeId == "":
		return nil, status.Error(codes.InvalidArgument, "node id missing")
	case req.VolumeCapability == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability missing")
	}
	if err := checkCap(req.VolumeCapability); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	vol, err := c.getVolume(ctx, req.VolumeId)
	if err != nil {
		return nil, err
	}
	readOnly := req.Readonly || readOnlyMode(req.VolumeCapability)
	excl := exclusive(req.VolumeCapability, readOnly)
	// Fence before the record changes: if the fence fails the publish fails,
	// and its retry finds the old attachment still there and fences again.
	fenced := map[string]bool{}
	if excl {
		var writers []string
		for _, a := range vol.Attachments {
			if a.Node != req.NodeId && !a.ReadOnly {
				writers = append(writers, a.Node)
			}
		}
		if len(writers) > 0 {
			// Nothing is fenced for a publish that would be refused (the
			// node at its attach limit: ResourceExhausted).
			if _, err := c.d.mds.AttachVolume(ctx, &api.AttachVolumeRequest{Name: req.VolumeId, Node: req.NodeId,
				ReadOnly: readOnly, Exclusive: excl, CheckOnly: true}); err != nil {
				return nil, mdsErr("ControllerPublishVolume", err)
			}
			if err := c.fence(ctx, req.VolumeId, writers); err != nil {
				return nil, err
			}
			for _, n := range writers {
				fenced[n] = true
			}
		}
	}
	resp, err := c.d.mds.AttachVolume(ctx, &api.AttachVolumeRequest{Name: req.VolumeId, Node: req.NodeId, ReadOnly: readOnly, Exclusive: excl})
	if err != nil {
		return nil, mdsErr("ControllerPublishVolume", err)
	}
	// A writer that attached between the read and the record is fenced too.
	var late []string
	for _, n := range resp.Superseded {
		i := slices.IndexFunc(vol.Attachments, func(a *api.Attachment) bool { return a.Node == n })
		if !fenced[n] && (i < 0 || !vol.Attachments[i].ReadOnly) {
			late = append(late, n)
		}
	}
	if len(late) > 0 {
		if err := c.fence(ctx, req.VolumeId, late); err != nil {
			return nil, err
		}
	}
	pc := map[string]string{"readOnly": fmt.Sprint(readOnly)}
	if p := vol.Meta[metaProtocol]; p != "" {
		pc[ParamProtocol] = p // ControllerModifyVolume's choice, newer than the StorageClass's
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// fence makes sure the writer on the nodes named can land nothing more: a
// takeover open commits a newer epoch in every copyset of the volume
// (client.Open; docs/reliability.md "Writer takeover"), then closes again.
func (c *controller) fence(ctx context.Context, volume string, nodes []string) error {
	v, err := client.Open(ctx, client.Config{
		Volume: volume, ClientName: "csi-controller fencing " + strings.Join(nodes, ","),
		MDSClient: c.d.mds, Logger: c.d.log, DataTLS: c.d.cfg.DataTLS,
	})
	if err != nil {
		return status.Errorf(codes.Unavailable, "fencing the writer on %s: %v", strings.Join(nodes, ","), err)
	}
	epoch := v.Epoch()
	if err := v.Close(); err != nil {
		c.d.log.Info("closing the fencing session", "volume", volume, "err", err)
	}
	c.d.log.Info("fenced the previous writer", "volume", volume, "nodes", nodes, "epoch", epoch)
	return nil
}

func (c *controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	nodes := []string{req.NodeId}
	if req.NodeId == "" { // every node
		vol, err := c.getVolume(ctx, req.VolumeId)
		if status.Code(err) == codes.NotFound {
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		}
		if err != nil {
			return nil, err
		}
		nodes = nodes[:0]
		for _, a := range vol.Attachments {
			nodes = append(nodes, a.Node)
		}
	}
	for _, n := range nodes {
		_, err := c.d.mds.DetachVolume(ctx, &api.DetachVolumeRequest{Name: req.VolumeId, Node: n})
		switch status.Code(err) {
		case codes.OK, codes.NotFound, codes.InvalidArgument:
		default:
			return nil, mdsErr("ControllerUnpublishVolume", err)
		}
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (c *controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	if len(req.VolumeCapabilities) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	if _, err := c.getVolume(ctx, req.VolumeId); err != nil {
		return nil, err
	}
	if err := checkParams(req.Parameters); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	for _, cp := range req.VolumeCapabilities {
		if err := checkCap(cp); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.VolumeContext, VolumeCapabilities: req.VolumeCapabilities, Parameters: req.Parameters,
	}}, nil
}

func publishedNodes(v *api.Volume) []string {
	var ids []string
	for _, a := range v.Attachments {
		ids = append(ids, a.Node)
	}
	return ids
}

// ListVolumes pages through the volumes in name order; a token is the name
// of the next page's first volume, so deletions between pages skip nothing.
func (c *controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.MaxEntries < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries < 0")
	}
	from := ""
	if req.StartingToken != "" {
		if !strings.HasPrefix(req.StartingToken, tokenPrefix) || len(req.StartingToken) == len(tokenPrefix) {
			return nil, status.Errorf(codes.Aborted, "starting token %q is not one ListVolumes gave", req.StartingToken)
		}
		from = strings.TrimPrefix(req.StartingToken, tokenPrefix)
	}
	resp, err := c.d.mds.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil {
		return nil, mdsErr("ListVolumes", err)
	}
	out := &csi.ListVolumesResponse{}
	for _, v := range resp.Volumes { // sorted by name
		if v.Name < from {
			continue
		}
		if req.MaxEntries > 0 && len(out.Entries) == int(req.MaxEntries) {
			out.NextToken = tokenPrefix + v.Name
			break
		}
		out.Entries = append(out.Entries, &csi.ListVolumesResponse_Entry{
			Volume: &csi.Volume{VolumeId: v.Name, CapacityBytes: int64(v.Size), VolumeContext: map[string]string{ParamPool: v.PoolName}},
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: publishedNodes(v)},
		})
	}
	return out, nil
}

// GetCapacity is the pool's free space: what its chunkservers have free,
// divided by its replica count.
func (c *controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, cp := range req.VolumeCapabilities {
		if checkCap(cp) != nil {
			return &csi.GetCapacityResponse{}, nil // none for volumes we cannot make
		}
	}
	pools, err := c.d.mds.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil {
		return nil, mdsErr("ListPools", err)
	}
	name := req.Parameters[ParamPool]
	var pool *api.Pool
	for _, p := range pools.Pools {
		if p.Name == name || (name == "" && (len(pools.Pools) == 1 || p.Name == "default")) {
			pool = p
			break
		}
	}
	if pool == nil {
		return &csi.GetCapacityResponse{}, nil
	}
	cs, err := c.d.mds.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: pool.Id})
	if err != nil {
		return nil, mdsErr("GetCopysets", err)
	}
	var free uint64
	for _, s := range cs.Chunkservers {
		if s.Online && s.CapacityBytes > s.UsedBytes {
			free += s.CapacityBytes - s.UsedBytes
		}
	}
	if pool.Replicas > 0 {
		free /= uint64(pool.Replicas)
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: int64(free),
		MaximumVolumeSize: wrapperspb.Int64(maxVolumeSize),
		MinimumVolumeSize: wrapperspb.Int64(volumeAlign),
	}, nil
}

func (c *controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	if req.CapacityRange == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity range missing")
	}
	size, err := sizeFor(req.CapacityRange)
	if err != nil {
		return nil, err
	}
	vol, err := c.getVolume(ctx, req.VolumeId)
	if err != nil {
		return nil, err
	}
	nodeExpand := !isBlock(req.VolumeCapability)
	if size <= vol.Size {
		if !fits(vol.Size, req.CapacityRange) {
			return nil, status.Errorf(codes.OutOfRange, "volume %q has %d bytes; shrinking is not supported", req.VolumeId, vol.Size)
		}
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: int64(vol.Size), NodeExpansionRequired: nodeExpand}, nil
	}
	r, err := c.d.mds.ResizeVolume(ctx, &api.ResizeVolumeRequest{Name: req.VolumeId, Size: size})
	if err != nil {
		return nil, mdsErr("ResizeVolume", err)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: int64(r.Volume.Size), NodeExpansionRequired: nodeExpand}, nil
}

// The mutable parameters (VolumeAttributesClass): protocol, kept as the
// volume's metadata in the MDS under metaProtocol. A change takes effect at
// the volume's next stage: ControllerPublishVolume hands it to the node in
// the publish context, which NodeStageVolume prefers to the volume context.
const metaProtocol = "csi.basalt.io/protocol"

// checkMutable validates mutable parameters: protocol only.
func checkMutable(params map[string]string) error {
	for k, v := range params {
		if k != ParamProtocol {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %q is not supported (protocol)", k)
		}
		if err := checkParams(map[string]string{k: v}); err != nil {
			return err
		}
	}
	return nil
}

// setMutable stores valid mutable parameters with the volume.
func (c *controller) setMutable(ctx context.Context, name string, params map[string]string) (*api.Volume, error) {
	meta := map[string]string{}
	for k, v := range params {
		if k == ParamProtocol {
			meta[metaProtocol] = v
		}
	}
	r, err := c.d.mds.SetVolumeMeta(ctx, &api.SetVolumeMetaRequest{Name: name, Meta: meta})
	if err != nil {
		return nil, mdsErr("SetVolumeMeta", err)
	}
	return r.Volume, nil
}

// ControllerModifyVolume changes a volume's mutable parameters (a
// VolumeAttributesClass): an unknown key or value is InvalidArgument and
// changes nothing; setting what is set already succeeds again.
func (c *controller) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	if err := checkMutable(req.MutableParameters); err != nil {
		return nil, err
	}
	if _, err := c.getVolume(ctx, req.VolumeId); err != nil {
		return nil, err
	}
	if len(req.MutableParameters) == 0 {
		return &csi.ControllerModifyVolumeResponse{}, nil
	}
	if _, err := c.setMutable(ctx, req.VolumeId, req.MutableParameters); err != nil {
		return nil, err
	}
	c.d.log.Info("volume modified", "volume", req.VolumeId, "mutable_parameters", req.MutableParameters)
	return &csi.ControllerModifyVolumeResponse{}, nil
}

// ControllerGetVolume reports the volume and the nodes it is published to.
func (c *controller) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	vol, err := c.getVolume(ctx, req.VolumeId)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: &csi.Volume{VolumeId: vol.Name, CapacityBytes: int64(vol.Size), VolumeContext: map[string]string{ParamPool: vol.PoolName}},
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: publishedNodes(vol)},
	}, nil
}

// poolHealth is what is wrong with a pool: copysets without a majority
// online (IO to them stalls: INACCESSIBLE) or missing a member (DEGRADED).
// Empty: healthy.
func (c *controller) poolHealth(ctx context.Context, pool uint32) ([]*csi.VolumeHealth_VolumeHealthEntry, error) {
	cs, err := c.d.mds.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: pool})
	if err != nil {
		return nil, mdsErr("GetCopysets", err)
	}
	online := map[uint64]bool{}
	for _, s := range cs.Chunkservers {
		online[s.Id] = s.Online
	}
	var lost, degraded []uint32
	for _, set := range cs.Copysets {
		up := 0
		for _, m := range set.Members {
			if online[m] {
				up++
			}
		}
		switch {
		case up <= len(set.Members)/2:
			lost = append(lost, set.Id)
		case up < len(set.Members):
			degraded = append(degraded, set.Id)
		}
	}
	var out []*csi.VolumeHealth_VolumeHealthEntry
	if len(lost) > 0 {
		out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "CopysetNoQuorum",
			Message: fmt.Sprintf("%d copysets of the pool have no majority of members online (%v); IO to them stalls", len(lost), lost)})
	}
	if len(degraded) > 0 {
		out = append(out, &csi.VolumeHealth_VolumeHealthEntry{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: "CopysetDegraded",
			Message: fmt.Sprintf("%d copysets of the pool miss a member (still serving; re-replication heals them)", len(degraded))})
	}
	return out, nil
}

func (c *controller) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	if req.VolumeId == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id missing")
	}
	vol, err := c.getVolume(ctx, req.VolumeId)
	if err != nil {
		return nil, err
	}
	h, err := c.poolHealth(ctx, vol.PoolId)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: vol.Name, HealthStatuses: h}}, nil
}

// ControllerListVolumeHealth lists the volumes with a health problem, in
// name order, paged like ListVolumes.
func (c *controller) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	if req.MaxEntries < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries < 0")
	}
	from := ""
	if req.StartingToken != "" {
		if !strings.HasPrefix(req.StartingToken, tokenPrefix) || len(req.StartingToken) == len(tokenPrefix) {
			return nil, status.Errorf(codes.Aborted, "starting token %q is not one ControllerListVolumeHealth gave", req.StartingToken)
		}
		from = strings.TrimPrefix(req.StartingToken, tokenPrefix)
	}
	resp, err := c.d.mds.ListVolumes(ctx, &api.ListVolumesRequest{})
	if err != nil {
		return nil, mdsErr("ListVolumes", err)
	}
	pools := map[uint32][]*csi.VolumeHealth_VolumeHealthEntry{}
	out := &csi.ControllerListVolumeHealthResponse{}
	for _, v := range resp.Volumes {
		if v.Name < from {
			continue
		}
		h, ok := pools[v.PoolId]
		if !ok {
			if h, err = c.poolHealth(ctx, v.PoolId); err != nil {
				return nil, err
			}
			pools[v.PoolId] = h
		}
		if len(h) == 0 {
			continue
		}
		if req.MaxEntries > 0 && len(out.Entries) == int(req.MaxEntries) {
			out.NextToken = tokenPrefix + v.Name
			break
		}
		out.Entries = append(out.Entries, &csi.VolumeHealth{VolumeId: v.Name, HealthStatuses: h})
	}
	return out, nil
}
