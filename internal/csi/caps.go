package csi

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Volume context keys and StorageClass parameters.
const (
	ParamPool     = "pool"
	ParamFsType   = "fsType"
	ParamProtocol = "protocol"
)

// Protocols a node attaches with (ParamProtocol).
const (
	ProtocolAuto    = "auto"
	ProtocolNBD     = "nbd"
	ProtocolNbdfuse = "nbdfuse"
	ProtocolNVMf    = "nvmf"  // NVMe/TCP to the node plugin's own target
	ProtocolISCSI   = "iscsi" // iSCSI (open-iscsi) to the node plugin's own target
)

// fsTypes are the file systems NodeStageVolume makes and grows.
var fsTypes = map[string]bool{"ext4": true, "xfs": true}

// checkCap validates one volume capability: an access type (mount with a
// file system we make, or block) and an access mode we serve. A file system
// is never shared by writers on several nodes; a block volume may be
// attached by many (a shared-disk database): one writer at a time — the
// latest node to write takes the writer epoch and fences the one before —
// and readers.
func checkCap(c *csi.VolumeCapability) error {
	if c == nil {
		return fmt.Errorf("volume capability missing")
	}
	block := false
	switch t := c.AccessType.(type) {
	case *csi.VolumeCapability_Block:
		block = true
	case *csi.VolumeCapability_Mount:
		if fs := t.Mount.GetFsType(); fs != "" && !fsTypes[fs] {
			return fmt.Errorf("file system %q is not supported (ext4, xfs)", fs)
		}
	default:
		return fmt.Errorf("volume capability has no access type (mount or block)")
	}
	switch m := c.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		// ReadWriteOncePod and ReadWriteOnce with the node capability
		// SINGLE_NODE_MULTI_WRITER: one node attaches, as SINGLE_NODE_WRITER
		// (the fence is per node; pods on that node share its one
		// attachment); SINGLE_NODE_SINGLE_WRITER also allows one publish.
	case csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		// Kubernetes' ReadWriteMany: every node may attach, the one that
		// writes holds the writer epoch and fences the one before.
		if !block {
			return fmt.Errorf("access mode %s needs volumeMode Block (a file system cannot be shared by several nodes)", m)
		}
	default:
		return fmt.Errorf("access mode %s is not supported", m)
	}
	return nil
}

func checkCaps(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume capabilities missing")
	}
	for _, c := range caps {
		if err := checkCap(c); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// exclusive: a writable publish in a single-node mode, which supersedes
// every other node.
func exclusive(c *csi.VolumeCapability, readOnly bool) bool {
	if readOnly {
		return false
	}
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return true
	}
	return false
}

// singlePublish: the access mode allows one publish (one pod) at a time.
func singlePublish(c *csi.VolumeCapability) bool {
	return c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
}

func isBlock(c *csi.VolumeCapability) bool {
	_, ok := c.GetAccessType().(*csi.VolumeCapability_Block)
	return ok
}

// readOnlyMode: the access mode allows no writes.
func readOnlyMode(c *csi.VolumeCapability) bool {
	m := c.GetAccessMode().GetMode()
	return m == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY || m == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}
