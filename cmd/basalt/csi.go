package main

import (
	"crypto/tls"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/csi"
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
	endpoint := f.String("endpoint", envOr("CSI_ENDPOINT", "unix:///csi/csi.sock"), "Unix socket to serve CSI on (env CSI_ENDPOINT)")
	mode := f.String("mode", "all", "services to serve: controller, node or all")
	driver := f.String("driver-name", csi.DriverName, "the CSI driver name (CSIDriver object, StorageClass provisioner)")
	nodeID := f.String("node-id", envOr("NODE_ID", host), "this node's id: the Kubernetes node name (env NODE_ID)")
	zone := f.String("zone", "", "this node's zone, reported as topology "+csi.TopologyZoneKey)
	stateDir := f.String("state-dir", "/var/lib/basalt-csi", "node: where the NBD socket and per-volume state live")
	attach := f.String("attach", "auto", "node: how to attach volumes: auto (kernel NBD if loaded, else nbdfuse + loop), nbd or nbdfuse")
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
			NodeID: *nodeID, Zone: *zone, Server: host, StateDir: *stateDir, Attach: *attach,
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
	return cmd
}
