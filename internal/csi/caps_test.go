package csi

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSizeFor(t *testing.T) {
	for _, c := range []struct {
		req, lim int64
		want     uint64
		code     codes.Code
	}{
		{0, 0, DefaultVolumeSize, codes.OK},
		{1, 0, 4096, codes.OK},
		{4097, 0, 8192, codes.OK},
		{0, 1 << 20, 1 << 20, codes.OK},
		{0, 5000, 4096, codes.OK},
		{1 << 20, 1 << 20, 1 << 20, codes.OK},
		{4097, 5000, 0, codes.OutOfRange}, // no multiple of 4 KiB in range
		{0, 100, 0, codes.OutOfRange},     // limit below 4 KiB
		{2 << 20, 1 << 20, 0, codes.InvalidArgument},
		{-1, 0, 0, codes.InvalidArgument},
		{1 << 53, 0, 0, codes.OutOfRange},
	} {
		got, err := sizeFor(&csi.CapacityRange{RequiredBytes: c.req, LimitBytes: c.lim})
		if status.Code(err) != c.code || got != c.want {
			t.Errorf("sizeFor(%d, %d) = %d, %v; want %d, %v", c.req, c.lim, got, err, c.want, c.code)
		}
	}
}

func TestCheckCap(t *testing.T) {
	mode := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability_AccessMode {
		return &csi.VolumeCapability_AccessMode{Mode: m}
	}
	mount := func(fs string, m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}, AccessMode: mode(m)}
	}
	block := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: mode(m)}
	}
	ok := []*csi.VolumeCapability{
		mount("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		mount("xfs", csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY),
		block(csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER),
		block(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY),
		block(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
	}
	bad := []*csi.VolumeCapability{
		nil,
		{AccessMode: mode(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		mount("zfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		mount("ext4", csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER), // a shared file system
		mount("", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
		block(csi.VolumeCapability_AccessMode_UNKNOWN),
	}
	for _, c := range ok {
		if err := checkCap(c); err != nil {
			t.Errorf("checkCap(%v): %v", c, err)
		}
	}
	for _, c := range bad {
		if err := checkCap(c); err == nil {
			t.Errorf("checkCap(%v) accepted it", c)
		}
	}
	if !exclusive(mount("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), false) ||
		exclusive(mount("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), true) ||
		exclusive(block(csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER), false) {
		t.Error("exclusive: only a writable single-node-writer publish supersedes other nodes")
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/a\040b/c\011`); got != "/a b/c\t" {
		t.Fatalf("unescapeMount = %q", got)
	}
}
