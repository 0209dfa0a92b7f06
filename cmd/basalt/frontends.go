package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/debughttp"
	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/frontend/nbd"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/playground"
)

func nbdCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nbd",
		Short: "Serve volumes over NBD (export name = volume name), on TCP and/or a Unix socket",
		Args:  cobra.NoArgs,
	}
	mdsAddrs := mdsFlag(cmd)
	listen := cmd.Flags().String("listen", "127.0.0.1:10809", "TCP listen address (empty: none)")
	socket := cmd.Flags().String("socket", "", "Unix socket path (empty: none)")
	readOnly := cmd.Flags().Bool("read-only", false, "open volumes read-only (alongside another writer)")
	metrics := cmd.Flags().String("metrics", "", "serve Prometheus /metrics on this address (empty: none)")
	debug := debugFlag(cmd)
	tf := addTLSFlags(cmd, identity.RoleAccess, identity.RoleClient)
	listenTLS := cmd.Flags().String("tls-policy", "require", "NBD_OPT_STARTTLS on --listen: off, allow (TLS offered, plaintext allowed: the kernel's nbd-client cannot do TLS) or require (docs/security.md)")
	socketTLS := cmd.Flags().String("socket-tls-policy", "allow", "NBD_OPT_STARTTLS on --socket: off, allow or require")
	var procs int
	procsFlag(cmd, &procs)
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		setProcs(procs)
		if *listen == "" && *socket == "" {
			return fmt.Errorf("nothing to serve on: give --listen or --socket")
		}
		ncfg, err := nbdTLSPolicies(c, tf, access.NBDConfig{Listen: *listen, Socket: *socket},
			"tls-policy", *listenTLS, "socket-tls-policy", *socketTLS)
		if err != nil {
			return err
		}
		cfg := access.Config{
			MDS: splitList(*mdsAddrs), ReadOnly: *readOnly, ClientName: clientName("nbd"),
			NBD: ncfg,
		}
		return serveFrontEnds(cfg, *metrics, *debug, tf)
	}
	return cmd
}

func nvmfCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nvmf",
		Short: "Serve volumes over NVMe/TCP (subsystem nqn.2024-11.io.basalt:volume:NAME, namespace 1)",
		Args:  cobra.NoArgs,
	}
	mdsAddrs := mdsFlag(cmd)
	listen := cmd.Flags().String("listen", "127.0.0.1:4420", "TCP listen address")
	hosts := cmd.Flags().String("allow-hosts", "", "comma-separated host NQNs that may connect (empty: every host); a volume's own list (basalt volume allow-host) applies as well")
	advertise := cmd.Flags().String("advertise", "", "address the discovery log gives for the subsystems (default: the one the host connected to)")
	readOnly := cmd.Flags().Bool("read-only", false, "open volumes read-only (alongside another writer)")
	metrics := cmd.Flags().String("metrics", "", "serve Prometheus /metrics on this address (empty: none)")
	debug := debugFlag(cmd)
	tf := addTLSFlags(cmd, identity.RoleAccess, identity.RoleClient)
	multipath := cmd.Flags().Bool("multipath", false, "ANA multipath: register as an access node with the MDS, which makes one access node's path optimized per host and namespace (run several with the same MDS)")
	var procs int
	procsFlag(cmd, &procs)
	cmd.RunE = func(*cobra.Command, []string) error {
		setProcs(procs)
		return serveFrontEnds(access.Config{
			MDS: splitList(*mdsAddrs), ReadOnly: *readOnly, ClientName: clientName("nvmf"),
			NVMf: access.NVMfConfig{Listen: *listen, AllowedHosts: splitList(*hosts), AdvertiseAddr: *advertise,
				Multipath: *multipath},
		}, *metrics, *debug, tf)
	}
	cmd.AddCommand(nvmfAdminCommands()...)
	return cmd
}

func iscsiCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "iscsi",
		Short: "Serve volumes over iSCSI: one target per volume, iqn.2026-11.io.basalt:CLUSTER:VOLUME, LUN 0",
		Args:  cobra.NoArgs,
	}
	mdsAddrs := mdsFlag(cmd)
	f := cmd.Flags()
	listen := f.String("listen", "127.0.0.1:3260", "the portal's TCP address")
	cluster := f.String("cluster", "basalt", "the cluster's name in target names")
	readOnly := f.Bool("read-only", false, "open volumes read-only (alongside another writer)")
	chapUser := f.String("chap-user", "", "require CHAP of every target without its own (basalt volume chap set, which takes precedence): the user name initiators log in with")
	chapSecretFile := f.String("chap-secret-file", "", "file holding the CHAP secret initiators must know (with --chap-user)")
	mutualUser := f.String("chap-mutual-user", "", "mutual CHAP: the name this target answers with")
	mutualSecretFile := f.String("chap-mutual-secret-file", "", "file holding the secret this target answers mutual CHAP with")
	initiators := f.StringSlice("initiator", nil, "allow only these initiator names (repeat or comma-separate; default: any)")
	register := f.Bool("register", false, "register this portal with the MDS as an access node's, so that redirectors (--redirect) send logins here (needs an access identity)")
	advertise := f.String("advertise", "", "with --register: the portal address initiators reach (default: --listen's)")
	redirect := f.Bool("redirect", false, "be a redirector portal: serve no volume; send each login to a registered access node's portal (one per target, spread over the online nodes) and list every portal in SendTargets (docs/iscsi.md)")
	metrics := f.String("metrics", "", "serve Prometheus /metrics on this address (empty: none)")
	debug := debugFlag(cmd)
	tf := addTLSFlags(cmd, identity.RoleAccess, identity.RoleClient)
	var procs int
	procsFlag(cmd, &procs)
	cmd.RunE = func(*cobra.Command, []string) error {
		setProcs(procs)
		if *register && *redirect {
			return fmt.Errorf("--register and --redirect: a redirector serves no volume, so it is not an access node; run them as two processes")
		}
		icfg := access.ISCSIConfig{Listen: *listen, Cluster: *cluster, Initiators: *initiators,
			Register: *register, AdvertiseAddr: *advertise, Redirect: *redirect}
		if *chapUser != "" || *chapSecretFile != "" {
			secret, err := readSecret(*chapSecretFile, "--chap-secret-file")
			if err != nil {
				return err
			}
			icfg.CHAP = &iscsi.CHAP{User: *chapUser, Secret: secret, MutualUser: *mutualUser}
			if *mutualSecretFile != "" {
				if icfg.CHAP.MutualSecret, err = readSecret(*mutualSecretFile, "--chap-mutual-secret-file"); err != nil {
					return err
				}
			}
		}
		cfg := access.Config{
			MDS: splitList(*mdsAddrs), ReadOnly: *readOnly, ClientName: clientName("iscsi"),
			ISCSI: icfg,
		}
		return serveFrontEnds(cfg, *metrics, *debug, tf)
	}
	cmd.AddCommand(iscsiListCommand())
	return cmd
}

// serveFrontEnds runs the front ends cfg names, and the metrics endpoint on
// metricsAddr unless it is empty, until SIGINT or SIGTERM.
func serveFrontEnds(cfg access.Config, metricsAddr, debugAddr string, tf *tlsFlags) error {
	cfg.Logger = slog.Default()
	id, err := tf.load()
	if err != nil {
		return err
	}
	if id != nil {
		cfg.MDSTLS, cfg.DataTLS = id.ClientTLS(identity.RoleMDS), id.ClientTLS(identity.RoleChunkserver)
		cfg.NBD.TLS = id
	}
	stopDebug, err := serveDebug(debugAddr)
	if err != nil {
		return err
	}
	defer stopDebug()
	if metricsAddr != "" {
		reg := debughttp.NewRegistry()
		hs, a, err := debughttp.Serve(metricsAddr, reg)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		defer hs.Close()
		slog.Info("serving metrics", "addr", a.String())
		cfg.Registry = reg
	}
	node, err := access.Start(cfg)
	if err != nil {
		return err
	}
	defer node.Close()
	ctx, stop := signalContext()
	defer stop()
	<-ctx.Done()
	return nil
}

// nbdTLSPolicies parses the NBD listeners' TLS policy flags into cfg. With
// --insecure there is no identity to serve TLS with: the policies are off,
// and asking for one is an error.
func nbdTLSPolicies(c *cobra.Command, tf *tlsFlags, cfg access.NBDConfig, listenFlag, listenVal, socketFlag, socketVal string) (access.NBDConfig, error) {
	if *tf.insecure {
		for _, f := range []string{listenFlag, socketFlag} {
			if c.Flags().Changed(f) {
				if v, _ := c.Flags().GetString(f); v != "off" {
					return cfg, fmt.Errorf("--%s %s needs certificates: not with --insecure", f, v)
				}
			}
		}
		return cfg, nil
	}
	var err error
	if cfg.ListenTLS, err = nbd.ParseTLSPolicy(listenVal); err != nil {
		return cfg, fmt.Errorf("--%s: %w", listenFlag, err)
	}
	if cfg.SocketTLS, err = nbd.ParseTLSPolicy(socketVal); err != nil {
		return cfg, fmt.Errorf("--%s: %w", socketFlag, err)
	}
	return cfg, nil
}

// clientName names this front-end process to the MDS: protocol@host/pid.
func clientName(protocol string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s/%d", protocol, host, os.Getpid())
}

// readSecret reads a secret from a file (never from the command line, where
// ps would show it), without its trailing newline.
func readSecret(path, flag string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%s is required with CHAP", flag)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty", flag, path)
	}
	return s, nil
}

func playgroundCommand() *cobra.Command {
	var cfg playground.Config
	var size string
	cmd := &cobra.Command{
		Use:   "playground",
		Short: "Run a whole cluster on this machine: MDS + etcd, 3 chunkservers, a volume, NBD",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			n, err := parseBytes(size)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			cfg.Size = n
			if cfg.DataMode != "" {
				if _, err := parseDataMode(cfg.DataMode); err != nil {
					return err
				}
			}
			cfg.Logger = slog.Default()
			ctx, stop := signalContext()
			defer stop()
			return playground.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Dir, "dir", "basalt-data", "directory for all data, logs and playground.json")
	f.StringVar(&size, "size", "8GiB", "size of the demo volume")
	f.StringVar(&cfg.Volume, "volume", "demo", "name of the volume to create")
	f.StringVar(&cfg.NBDListen, "nbd-listen", "127.0.0.1:10809", "NBD TCP address")
	f.StringVar(&cfg.NBDSocket, "nbd-socket", "", "NBD Unix socket (default DIR/nbd.sock)")
	f.StringVar(&cfg.NBDTLS, "nbd-tls-policy", "allow", "NBD_OPT_STARTTLS on --nbd-listen: off, allow (nbds:// and nbd:// both work) or require")
	f.StringVar(&cfg.NBDSocketTLS, "nbd-socket-tls-policy", "allow", "NBD_OPT_STARTTLS on --nbd-socket: off, allow or require")
	f.StringVar(&cfg.NVMfListen, "nvmf-listen", "", "NVMe/TCP address (default 127.0.0.1:PORT-BASE+28)")
	f.StringVar(&cfg.ISCSIListen, "iscsi-listen", "", "iSCSI portal address (default 127.0.0.1:PORT-BASE+3)")
	f.IntVar(&cfg.PortBase, "port-base", 6700, "first port: MDS, then etcd (+1, +2), the iSCSI portal (+3), chunkservers (+11..), metrics (+21..), NVMe/TCP (+28)")
	f.Uint32Var(&cfg.Copysets, "copysets", 0, "copysets in the pool (default: the MDS default)")
	f.IntVar(&cfg.Procs, "gomaxprocs", 0, "GOMAXPROCS of this process and each chunkserver (0: the CPUs shared among them, unless GOMAXPROCS is set; -1: Go's default)")
	f.StringVar(&cfg.Metrics, "metrics", "", "serve the NBD front end's and client's Prometheus /metrics on this address (empty: none)")
	f.StringVar(&cfg.DebugListen, "debug-listen", "", "serve Go's /debug/pprof/ profiles on this address (empty: none; never on a public address)")
	f.StringVar(&cfg.DataMode, "data-mode", "", "the chunkservers' --data-mode (authenticated or encrypted; clients follow it); default authenticated")
	f.BoolVar(&cfg.TCPOnly, "tcp-only", false, "chunkservers serve this host's clients and peers over TCP, not the same-host socket (which the encrypted mode does not encrypt)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "no TLS, no authentication anywhere: the pre-security data path, for measuring its cost only (docs/security.md)")
	return cmd
}
