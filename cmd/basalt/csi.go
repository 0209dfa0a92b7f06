package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/bench"
	"github.com/basalt-storage/basalt/internal/csi"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/identity"
)

func csiCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "csi",
		Short: "Serve the Kubernetes CSI driver (identity, controller and/or node) on a Unix socket",
		Args:  cobra.NoArgs,
	}
	mdsAddrs := mdsFlag(cmd)
	host, _ := os.Hostname()
	f := cmd.Flags()
	endpoint := f.String("endpoint", envOr("CSI_ENDPOINT", "unix:///csi/csi.sock"),
		"where to serve CSI (env CSI_ENDPOINT): unix:///path, or tcp://host:port for tests and loopback only (CSI has no authentication)")
	mode := f.String("mode", "all", "services to serve: controller, node or all")
	driver := f.String("driver-name", csi.DriverName, "the CSI driver name (CSIDriver object, StorageClass provisioner)")
	nodeID := f.String("node-id", envOr("NODE_ID", host), "this node's id: the Kubernetes node name (env NODE_ID)")
	zone := f.String("zone", "", "this node's zone, reported as topology "+csi.TopologyZoneKey)
	stateDir := f.String("state-dir", "/var/lib/basalt-csi", "node: where the NBD socket and per-volume state live")
	attach := f.String("attach", "auto", "node: how to attach volumes: auto (NVMe/TCP if nvme-cli and nvme-tcp are there, else kernel NBD if loaded, else iSCSI if iscsiadm and iscsi_tcp are, else nbdfuse + loop), nvmf, nbd, iscsi or nbdfuse")
	nvmfDiscovery := f.String("nvmf-discovery", "", "node: the discovery controller (host:port) of the cluster's basalt nvmf --multipath access nodes: NVMe/TCP stages connect to every path it lists (empty: the plugin's own loopback target)")
	nbdTarget := f.String("nbd-target", "", "node: the NBD server (host:port) of a basalt nbd access node whose --tls-policy lets the kernel's plaintext in: kernel NBD stages connect there (empty: the plugin's own front end)")
	nvmfTarget := f.String("nvmf-target", "", "node: the NVMe/TCP target (host:port) of a basalt nvmf access node: NVMe/TCP stages connect there (empty: the plugin's own loopback target)")
	nodeNQN := f.String("hostnqn", "", "node: the NVMe host NQN this node's kernel connects as, registered so that only it may write the volumes published here (default: /etc/nvme/hostnqn)")
	nodeIQN := f.String("initiator-iqn", "", "node: the iSCSI initiator name this node's iscsid logs in as, registered so that only it may write the volumes published here (default: the InitiatorName in /etc/iscsi/initiatorname.iscsi, which the logins use)")
	maxVolumes := f.Int64("max-volumes", 0, "node: the attach limit reported to Kubernetes (0: the NBD device count for kernel NBD, else 128)")
	tf := addTLSFlags(cmd, identity.RoleAdmin, identity.RoleAccess)
	cmd.RunE = func(*cobra.Command, []string) error {
		id, err := tf.load()
		if err != nil {
			return err
		}
		var mdsTLS, dataTLS *tls.Config
		if id != nil {
			mdsTLS, dataTLS = id.ClientTLS(identity.RoleMDS), id.ClientTLS(identity.RoleChunkserver)
		}
		d, err := csi.Start(csi.Config{
			Endpoint: *endpoint, MDS: splitList(*mdsAddrs), MDSTLS: mdsTLS, DataTLS: dataTLS, Mode: *mode, DriverName: *driver,
			NodeID: *nodeID, Zone: *zone, Server: host, StateDir: *stateDir, Attach: *attach, MaxVolumes: *maxVolumes, HostNQN: *nodeNQN, InitiatorIQN: *nodeIQN, NVMfDiscovery: *nvmfDiscovery, NVMfTarget: *nvmfTarget, NBDTarget: *nbdTarget,
			Logger: slog.Default(),
		})
		if err != nil {
			return err
		}
		defer d.Close()
		ctx, stop := signalContext()
		defer stop()
		<-ctx.Done()
		return nil
	}
	cmd.AddCommand(growDeviceCommand(), stageDeviceCommand(), unstageDeviceCommand())
	return cmd
}

// growDeviceCommand runs NodeExpandVolume's steps on a device attached by
// hand: the device learns the volume's new size, then the mounted file
// system grows.
func growDeviceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "grow-device DEVICE",
		Short: "Grow an attached volume's device and its mounted file system online (what NodeExpandVolume does)",
		Long: `After the volume grew (basalt volume resize, ControllerExpandVolume), make its block device
on this host show the new size and grow the file system mounted on it:

  nvmf     /dev/nvmeXnY: wait until the kernel shows the size (the target's namespace notice)
  nbd      /dev/nbdN connected with nbd-client -nonetlink: tell the kernel with NBD_SET_SIZE
  nbdfuse  a loop device over nbdfuse: cannot grow while attached (reconnect)

then resize2fs (ext4) or xfs_growfs (xfs) on the mount point --path.`,
		Args: cobra.ExactArgs(1),
	}
	f := cmd.Flags()
	method := f.String("method", csi.ProtocolNVMf, "how DEVICE is attached: nvmf, nbd or nbdfuse")
	size := f.String("size", "", "the volume's size now (e.g. 512MiB, or bytes); required")
	fsType := f.String("fs", "", "the file system mounted on DEVICE (ext4, xfs); empty: grow the device only")
	path := f.String("path", "", "the file system's mount point (xfs_growfs needs it)")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		n, err := bench.ParseSize(*size)
		if err != nil || n == 0 {
			return fmt.Errorf("--size %q: want a size such as 512MiB", *size)
		}
		ctx, stop := signalContext()
		defer stop()
		got, err := csi.GrowAttached(ctx, csi.Attached{Method: *method, Device: args[0], NBDIoctl: *method == csi.ProtocolNBD},
			int64(n), *fsType, *path)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %d bytes\n", args[0], got)
		return nil
	}
	return cmd
}

func stageDeviceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stage-device VOLUME",
		Short: "Attach a volume with this host's kernel and mount it, as NodeStageVolume does",
		Long: `Run the node plugin's NodeStageVolume steps on this host against a front end elsewhere:
attach the volume (nvmf: nvme connect to --addr; iscsi: iscsiadm node record, --login to
the volume's target at --addr; nbd: nbd-client to the NBD server at --addr), then, with --path, make --fs on the device if its first
MiB is zeroes and mount it there. What it made is written to --state for unstage-device.
Prints the device.`,
		Args: cobra.ExactArgs(1),
	}
	f := cmd.Flags()
	method := f.String("method", csi.ProtocolNVMf, "how to attach: nvmf, iscsi or nbd")
	addr := f.String("addr", "", "the NVMe/TCP target, the iSCSI portal or the NBD server (a basalt nbd allowing plaintext), host:port; required")
	hostNQN := f.String("hostnqn", "", "nvmf: the host NQN to connect as (default: nvme-cli's)")
	discovery := f.String("discovery", "", "nvmf: a discovery controller (host:port): connect to every path it lists for the volume instead of --addr")
	target := f.String("target", "", "iscsi: the target name (default: iqn.2026-11.io.basalt:CLUSTER:VOLUME with --cluster)")
	cluster := f.String("cluster", "basalt", "iscsi: the cluster name in the default target name")
	fsType := f.String("fs", "ext4", "the file system to make and mount (ext4, xfs)")
	path := f.String("path", "", "where to mount; empty: attach only (a block volume)")
	readOnly := f.Bool("read-only", false, "attach and mount read-only")
	state := f.String("state", "", "the file to record the stage in; required")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		if (*addr == "" && *discovery == "") || *state == "" {
			return fmt.Errorf("--addr (or --discovery) and --state are required")
		}
		t := csi.DeviceTarget{Method: *method, Addr: *addr, HostNQN: *hostNQN, Target: *target, Discovery: *discovery}
		if t.Target == "" {
			t.Target = iscsi.TargetName(*cluster, args[0])
		}
		ctx, stop := signalContext()
		defer stop()
		dev, err := csi.StageDevice(ctx, t, args[0], *fsType, *path, *readOnly, *state)
		if err != nil {
			return err
		}
		fmt.Println(dev)
		return nil
	}
	return cmd
}

func unstageDeviceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "unstage-device STATE",
		Short: "Unmount and detach what stage-device made, as NodeUnstageVolume does",
		Args:  cobra.ExactArgs(1),
	}
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		ctx, stop := signalContext()
		defer stop()
		return csi.UnstageDevice(ctx, args[0])
	}
	return cmd
}
