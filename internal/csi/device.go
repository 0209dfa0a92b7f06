package csi

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
)

// DeviceTarget says where a standalone attach (StageDevice, the `basalt csi
// stage-device` command) connects: the node plugin's own steps, run against
// a front end elsewhere — how a test runs them in a kernel that is not the
// plugin's (a QEMU guest).
type DeviceTarget struct {
	Method  string // ProtocolNVMf or ProtocolISCSI
	Addr    string // nvmf: the target's host:port; iscsi: the portal
	HostNQN string // nvmf: the host NQN to connect as ("": nvme-cli's default)
	Target  string // iscsi: the target name
	// Discovery (nvmf), if set, is a discovery controller (host:port, any
	// access node of the cluster): the attach connects to every path its
	// log lists for the volume (NVMe multipath), not to Addr.
	Discovery string
}

// StageDevice is NodeStageVolume's work on this host for volume at t —
// attach (nvme connect, or iscsiadm --login) and, when path is not empty,
// make fsType on the device if it is blank and mount it on path — and
// records what it made in the file state, for UnstageDevice. It returns the
// device.
func StageDevice(ctx context.Context, t DeviceTarget, volume, fsType, path string, readOnly bool, state string) (string, error) {
	st := &stageState{Volume: volume, StagingPath: path, Block: path == "", FsType: fsType, ReadOnly: readOnly}
	if st.FsType == "" {
		st.FsType = "ext4"
	}
	var err error
	switch t.Method {
	case ProtocolNVMf:
		if t.Discovery == "" {
			err = attachNVMfAt(ctx, st, t.Addr, t.HostNQN)
			break
		}
		var paths []string
		if paths, err = nvmfPaths(ctx, t.Discovery, t.HostNQN, nvmf.VolumeNQNPrefix+volume); err == nil {
			err = attachNVMfPaths(ctx, st, paths, t.HostNQN)
		}
	case ProtocolISCSI:
		err = attachISCSIAt(ctx, st, t.Addr, t.Target)
	case ProtocolNBD:
		err = attachNBDAt(ctx, st, t.Addr)
	default:
		err = fmt.Errorf("method %q: want nvmf, iscsi or nbd", t.Method)
	}
	if err != nil {
		return "", err
	}
	if !st.Block {
		err = formatAndMount(ctx, st, nil)
	}
	if err == nil {
		err = writeState(state, st)
	}
	if err != nil {
		if !st.Block {
			_ = unmount(context.Background(), path)
		}
		return "", errors.Join(err, (*Node)(nil).detach(context.Background(), st))
	}
	return st.Device, nil
}

// UnstageDevice is NodeUnstageVolume's work for what StageDevice recorded
// in the file state: unmount, then detach (nvme disconnect, or iscsiadm
// --logout and -o delete), waiting until the kernel lists the controller or
// session no more; then it removes state.
func UnstageDevice(ctx context.Context, state string) error {
	st, err := readState(state)
	if err != nil {
		return err
	}
	if !st.Block {
		if err := unmount(ctx, st.StagingPath); err != nil {
			return err
		}
	}
	if err := (*Node)(nil).detach(ctx, st); err != nil {
		return err
	}
	return os.Remove(state)
}
