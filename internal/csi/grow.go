package csi

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Attached is a volume's block device on this node and how it got there.
type Attached struct {
	Method   string // ProtocolNVMf, ProtocolNBD, ProtocolISCSI or ProtocolNbdfuse
	Device   string // /dev/nvmeXnY, /dev/nbdN, /dev/sdX, /dev/loopN
	NBDIoctl bool   // nbd: configured by ioctl (nbd-client -nonetlink)
}

// nbdSetSize is Linux's NBD_SET_SIZE ioctl, _IO(0xab, 2).
const nbdSetSize = 0xab<<8 | 2

// growWait bounds how long growDevice waits for an NVMe/TCP namespace to
// show the new size: the target re-reads sizes every 5 s
// (frontend.ExportsConfig.SizeCheck) and the kernel rescans on its notice.
const growWait = 2 * time.Minute

// growDevice makes the attached device show at least want bytes of the
// volume's volSize and returns the device's size. NVMe/TCP: the target notices the growth and
// the kernel rescans; we wait for it. Kernel NBD: NBD_SET_SIZE tells the
// kernel (the NBD front end then serves the added part). nbdfuse + loop
// cannot grow while attached: nbdfuse keeps the size of its connect.
func growDevice(ctx context.Context, a Attached, want, volSize int64) (int64, error) {
	cur, err := deviceSize(a.Device)
	if err != nil {
		return 0, err
	}
	if cur >= want {
		return cur, nil
	}
	switch a.Method {
	case ProtocolNVMf, ProtocolISCSI:
		// iSCSI: the target answers the next command with CAPACITY DATA
		// HAS CHANGED, but the kernel only logs that; a rescan makes it
		// read the capacity again.
		deadline := time.Now().Add(growWait)
		for cur < want {
			if a.Method == ProtocolISCSI {
				if err := rescanSCSI(a.Device); err != nil {
					return cur, fmt.Errorf("rescanning %s: %w", a.Device, err)
				}
			}
			if time.Now().After(deadline) {
				return cur, fmt.Errorf("%s shows %d bytes %v after the volume grew to %d", a.Device, cur, growWait, volSize)
			}
			select {
			case <-ctx.Done():
				return cur, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			if cur, err = deviceSize(a.Device); err != nil {
				return 0, err
			}
		}
		return cur, nil
	case ProtocolNBD:
		if !a.NBDIoctl {
			return cur, fmt.Errorf("%s was connected over netlink, which takes no new size; it shows the grown volume after it is staged again", a.Device)
		}
		f, err := os.Open(a.Device)
		if err != nil {
			return cur, err
		}
		defer f.Close()
		if err := unix.IoctlSetInt(int(f.Fd()), nbdSetSize, int(volSize)); err != nil {
			return cur, fmt.Errorf("NBD_SET_SIZE %d on %s: %w", volSize, a.Device, err)
		}
		return deviceSize(a.Device)
	}
	return cur, fmt.Errorf("%s (%s) keeps the size it had when attached (%d bytes); it shows the grown volume after it is staged again", a.Device, a.Method, cur)
}

// GrowAttached is NodeExpandVolume's work on a device attached by hand (the
// `basalt csi grow-device` command): the device learns the volume's size,
// then the file system fsType mounted at path grows to it ("" fsType: a raw
// device).
func GrowAttached(ctx context.Context, a Attached, size int64, fsType, path string) (int64, error) {
	got, err := growDevice(ctx, a, size, size)
	if err != nil {
		return got, err
	}
	if fsType != "" {
		if err := growFS(ctx, fsType, a.Device, path); err != nil {
			return got, err
		}
	}
	return got, nil
}
