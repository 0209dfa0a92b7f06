package playground

import (
	"fmt"

	"github.com/basalt-storage/basalt/internal/debughttp"
	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/nbd"
	"github.com/basalt-storage/basalt/internal/identity"
)

// ISCSICluster is the cluster name in the playground's iSCSI target names.
const ISCSICluster = "playground"

// startFrontEnd serves NBD on TCP and on a Unix socket, and iSCSI, from this
// process, and the front end's metrics if cfg asks; stop ends both.
func startFrontEnd(cfg Config, st *State) (stop func(), err error) {
	listenTLS, err := nbd.ParseTLSPolicy(cfg.NBDTLS)
	if err != nil {
		return nil, err
	}
	socketTLS, err := nbd.ParseTLSPolicy(cfg.NBDSocketTLS)
	if err != nil {
		return nil, err
	}
	var id *identity.Config // nil: --insecure, no NBD TLS either
	if cfg.Insecure {
		listenTLS, socketTLS = nbd.TLSOff, nbd.TLSOff
	} else if id, err = identity.Load(st.TLSDir, identity.Base(identity.RoleAccess, "playground")); err != nil {
		return nil, err
	}
	fcfg := access.Config{
		MDS:        []string{st.MDS},
		ClientName: "playground-nbd",
		Logger:     cfg.Logger.With("component", "frontend"),
		NBD:        access.NBDConfig{Listen: cfg.NBDListen, Socket: cfg.NBDSocket, ListenTLS: listenTLS, SocketTLS: socketTLS, TLS: id},
		NVMf:       access.NVMfConfig{Listen: cfg.NVMfListen},
		ISCSI:      access.ISCSIConfig{Listen: cfg.ISCSIListen, Cluster: ISCSICluster},
	}
	if id != nil {
		fcfg.MDSTLS, fcfg.DataTLS = id.ClientTLS(identity.RoleMDS), id.ClientTLS(identity.RoleChunkserver)
	}
	stopMetrics := func() {}
	if cfg.Metrics != "" {
		reg := debughttp.NewRegistry()
		hs, a, err := debughttp.Serve(cfg.Metrics, reg)
		if err != nil {
			return nil, fmt.Errorf("metrics listen on %s: %w", cfg.Metrics, err)
		}
		stopMetrics = func() { hs.Close() }
		st.Metrics = a.String()
		fcfg.Registry = reg
	}
	if cfg.DebugListen != "" {
		hs, a, err := debughttp.ServeDebug(cfg.DebugListen)
		if err != nil {
			stopMetrics()
			return nil, fmt.Errorf("debug listen on %s: %w", cfg.DebugListen, err)
		}
		prev := stopMetrics
		stopMetrics = func() { prev(); hs.Close() }
		st.Debug = a.String()
	}
	node, err := access.Start(fcfg)
	if err != nil {
		stopMetrics()
		return nil, fmt.Errorf("%w (is another playground running? use --nbd-listen, --nvmf-listen, --iscsi-listen or --port-base)", err)
	}
	return func() {
		node.Close()
		stopMetrics()
	}, nil
}
