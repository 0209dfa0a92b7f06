package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/debughttp"
	"github.com/basalt-storage/basalt/internal/frontend/access"
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
	metrics := cmd.Flags().String("metrics", "", "serve Prometheus /metrics and /debug/pprof/ on this address (empty: none)")
	var procs int
	procsFlag(cmd, &procs)
	cmd.RunE = func(*cobra.Command, []string) error {
		setProcs(procs)
		if *listen == "" && *socket == "" {
			return fmt.Errorf("nothing to serve on: give --listen or --socket")
		}
		host, _ := os.Hostname()
		cfg := access.Config{
			MDS: splitList(*mdsAddrs), ReadOnly: *readOnly, Logger: slog.Default(),
			ClientName: fmt.Sprintf("nbd@%s/%d", host, os.Getpid()),
			NBD:        access.NBDConfig{Listen: *listen, Socket: *socket},
		}
		if *metrics != "" {
			reg := debughttp.NewRegistry()
			hs, a, err := debughttp.Serve(*metrics, reg)
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
	hosts := cmd.Flags().String("allow-hosts", "", "comma-separated host NQNs that may connect (empty: every host)")
	advertise := cmd.Flags().String("advertise", "", "address the discovery log gives for the subsystems (default: the one the host connected to)")
	readOnly := cmd.Flags().Bool("read-only", false, "open volumes read-only (alongside another writer)")
	var procs int
	procsFlag(cmd, &procs)
	cmd.RunE = func(*cobra.Command, []string) error {
		setProcs(procs)
		host, _ := os.Hostname()
		node, err := access.Start(access.Config{
			MDS: splitList(*mdsAddrs), ReadOnly: *readOnly, Logger: slog.Default(),
			ClientName: fmt.Sprintf("nvmf@%s/%d", host, os.Getpid()),
			NVMf:       access.NVMfConfig{Listen: *listen, AllowedHosts: splitList(*hosts), AdvertiseAddr: *advertise},
		})
		if err != nil {
			return err
		}
		defer node.Close()
		ctx, stop := signalContext()
		defer stop()
		<-ctx.Done()
		return nil
	}
	return cmd
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
	f.StringVar(&cfg.NVMfListen, "nvmf-listen", "", "NVMe/TCP address (default 127.0.0.1:PORT-BASE+28)")
	f.IntVar(&cfg.PortBase, "port-base", 6700, "first port: MDS, then etcd (+1, +2), chunkservers (+11..), metrics (+21..)")
	f.Uint32Var(&cfg.Copysets, "copysets", 0, "copysets in the pool (default: the MDS default)")
	f.IntVar(&cfg.Procs, "gomaxprocs", 0, "GOMAXPROCS of this process and each chunkserver (0: the CPUs shared among them, unless GOMAXPROCS is set; -1: Go's default)")
	f.StringVar(&cfg.Metrics, "metrics", "", "serve the NBD front end's and client's Prometheus /metrics and /debug/pprof/ on this address (empty: none)")
	return cmd
}
