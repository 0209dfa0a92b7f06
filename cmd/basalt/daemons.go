package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/basalt-storage/basalt/internal/chunkserver"
	"github.com/basalt-storage/basalt/internal/faultpoint"
	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/mds"
	"github.com/basalt-storage/basalt/internal/scrub"
	"github.com/basalt-storage/basalt/internal/transport"
)

func mdsCommand() *cobra.Command {
	var cfg mds.Config
	var etcd string
	var balance bool
	var tf *tlsFlags
	var debug *string
	cmd := &cobra.Command{
		Use:   "mds",
		Short: "Run the metadata service (embedded etcd unless --etcd-endpoints is given)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.EtcdEndpoints = splitList(etcd)
			cfg.DisableBalance = !balance
			cfg.Logger = slog.Default()
			var err error
			if cfg.TLS, err = tf.load(); err != nil {
				return err
			}
			cfg.Insecure = cfg.TLS == nil
			if cfg.TLS != nil {
				// The embedded etcd serves TLS; keep the defaults' scheme right.
				for _, u := range []*string{&cfg.EtcdClientURL, &cfg.EtcdPeerURL} {
					*u = strings.Replace(*u, "http://", "https://", 1)
				}
			}
			stopDebug, err := serveDebug(*debug)
			if err != nil {
				return err
			}
			defer stopDebug()
			s, err := mds.New(cfg)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return s.Run(ctx)
		},
	}
	tf = addTLSFlags(cmd, identity.RoleMDS)
	debug = debugFlag(cmd)
	cmd.Flags().IntVar(&cfg.MaxSessionsPerClient, "max-sessions-per-client", mds.DefaultMaxSessionsPerClient, "open volume sessions one client identity may hold")
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:6700", "gRPC listen address")
	f.StringVar(&cfg.Advertise, "advertise", "", "address other processes use to reach this MDS (default: --listen)")
	f.StringVar(&cfg.DataDir, "data-dir", "basalt-mds", "directory of the embedded etcd")
	f.StringVar(&etcd, "etcd-endpoints", "", "external etcd endpoints, comma-separated (disables the embedded etcd)")
	f.StringVar(&cfg.EtcdClientURL, "etcd-client-url", "http://127.0.0.1:2379", "embedded etcd client URL")
	f.StringVar(&cfg.EtcdPeerURL, "etcd-peer-url", "http://127.0.0.1:2380", "embedded etcd peer URL")
	f.StringVar(&cfg.MetricsListen, "metrics", "", "Prometheus /metrics listen address (off when empty)")
	f.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", 5*time.Second, "a chunkserver silent this long is offline")
	f.DurationVar(&cfg.SessionLease, "session-lease", 10*time.Second, "lease of a volume session")
	f.DurationVar(&cfg.ElectionTTL, "election-ttl", 3*time.Second, "how long a dead active MDS keeps its role before a standby takes over")
	f.DurationVar(&cfg.RecoveryGrace, "recovery-grace", 10*time.Minute, "a chunkserver down this long has its copysets rebuilt elsewhere (negative: never)")
	f.DurationVar(&cfg.ScheduleInterval, "schedule-interval", 5*time.Second, "how often the scheduler looks for work")
	f.IntVar(&cfg.MaxRecoveryMoves, "max-recovery-moves", 4, "copyset moves (repairs and balancing) in flight at once, cluster-wide")
	f.IntVar(&cfg.MaxMovesPerChunkserver, "max-moves-per-chunkserver", 2, "copyset moves in flight at once that one chunkserver receives or leads")
	f.IntVar(&cfg.MaxLeaderTransfers, "max-leader-transfers", 2, "leader transfers (leader balancing) in flight at once")
	f.BoolVar(&balance, "balance", true, "even out copyset counts and leaders across chunkservers")
	return cmd
}

// minWALStallTimeout is the shortest --wal-stall-timeout: below it a busy
// but healthy disk would look stalled.
const minWALStallTimeout = 100 * time.Millisecond

func chunkserverCommand() *cobra.Command {
	var cfg chunkserver.Config
	var mdsAddrs, pidFile, slowDisk, diskErr, scrubRate, snapRate, dataMode string
	var procs int
	var crashAfterDelete bool
	var faultPointsFile string
	var nbdListen, nbdSocket string // the in-process NBD front end
	var nbdTLS, nbdSocketTLS string // its listeners' TLS policies
	var tf *tlsFlags
	var debug, nbdCert *string
	cmd := &cobra.Command{
		Use:   "chunkserver",
		Short: "Run a chunkserver on one data directory (one disk)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setProcs(procs)
			cfg.MDS = splitList(mdsAddrs)
			cfg.Logger = slog.Default()
			var err error
			if cfg.TLS, err = tf.load(); err != nil {
				return err
			}
			if cfg.DataMode, err = parseDataMode(dataMode); err != nil {
				return err
			}
			if cfg.TLS == nil && cfg.DataMode == transport.ModeEncrypted {
				return fmt.Errorf("--data-mode encrypted needs --tls-dir (it is TLS for the whole connection)")
			}
			stopDebug, err := serveDebug(*debug)
			if err != nil {
				return err
			}
			defer stopDebug()
			if r := strings.TrimSpace(scrubRate); r == "0" || r == "off" {
				cfg.ScrubRate = -1
			} else {
				n, err := parseBytes(r)
				if err != nil {
					return fmt.Errorf("--scrub-rate: %w", err)
				}
				cfg.ScrubRate = int64(n)
			}
			if r := strings.TrimSpace(snapRate); r == "0" || r == "off" {
				cfg.SnapshotRate = -1
			} else {
				n, err := parseBytes(r)
				if err != nil {
					return fmt.Errorf("--snapshot-rate: %w", err)
				}
				cfg.SnapshotRate = int64(n)
			}
			switch t := cfg.WALStallTimeout; {
			case t <= 0:
				cfg.WALStallTimeout = -1 // the flag's 0 is off, Config's is the default
			case t < minWALStallTimeout:
				return fmt.Errorf("--wal-stall-timeout %s: a healthy disk's fdatasync can take that long under load; give at least %s, or 0 to turn the watchdog off", t, minWALStallTimeout)
			}
			if slowDisk != "" {
				cfg.Knobs.WAL.BeforeSync = slowDiskKnob(slowDisk)
			}
			if diskErr != "" {
				cfg.Knobs.Datastore.Fdatasync = diskErrorKnob(diskErr)
			}
			if crashAfterDelete {
				cfg.Knobs.AfterDeleteVolume = func(group, volume uint64) {
					slog.Error("fault knob: crashing after a delete-volume entry", "copyset", group, "volume", volume)
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {} // the signal is on its way
				}
			}
			if faultPointsFile != "" {
				fp := faultpoint.New(slog.Default())
				fp.WatchFile(faultPointsFile, nil)
				armFaultPoints(&cfg.Knobs, fp)
			}
			cs, err := chunkserver.New(cfg) // takes the data directory's lock
			if err != nil {
				return err
			}
			if err := writePIDFile(pidFile); err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			if nbdListen == "" && nbdSocket == "" {
				return cs.Run(ctx)
			}
			// A front end in this process (docs/design.md §7): IO to copysets this
			// chunkserver leads takes the local fast path. It stops before the
			// chunkserver, so the IO it has in flight can finish.
			host, _ := os.Hostname()
			// The front end is an access node: chunkservers serve IO only to
			// clients and access nodes, so it needs an identity of its own.
			var mdsTLS, dataTLS *tls.Config
			ncfg, err := nbdTLSPolicies(cmd, tf, access.NBDConfig{Listen: nbdListen, Socket: nbdSocket},
				"nbd-tls-policy", nbdTLS, "nbd-socket-tls-policy", nbdSocketTLS)
			if err != nil {
				return err
			}
			if cfg.TLS != nil {
				if *nbdCert == "" {
					return fmt.Errorf("--nbd-listen/--nbd-socket with --tls-dir need --nbd-tls-cert: an access certificate in %s for the in-process front end (basalt cert issue --role access --name N)", *tf.dir)
				}
				fid, err := identity.LoadRole(*tf.dir, *nbdCert, identity.RoleAccess)
				if err != nil {
					return fmt.Errorf("--nbd-tls-cert: %w", err)
				}
				mdsTLS, dataTLS = fid.ClientTLS(identity.RoleMDS), fid.ClientTLS(identity.RoleChunkserver)
				ncfg.TLS = fid
			}
			node, err := access.Start(access.Config{
				MDS: cfg.MDS, MDSTLS: mdsTLS, DataTLS: dataTLS, Local: cs, Registry: cs.Registry(),
				Logger:     slog.Default().With("component", "frontend"),
				ClientName: fmt.Sprintf("chunkserver-nbd@%s/%d", host, os.Getpid()),
				NBD:        ncfg,
			})
			if err != nil {
				return err
			}
			defer node.Close()
			runCtx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case <-ctx.Done():
					node.Close()
					cancel()
				case <-runCtx.Done():
				}
			}()
			return cs.Run(runCtx)
		},
	}
	tf = addTLSFlags(cmd, identity.RoleChunkserver)
	debug = debugFlag(cmd)
	nbdCert = cmd.Flags().String("nbd-tls-cert", "", "base name of the access certificate in --tls-dir the in-process NBD front end uses")
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data", "", "data directory (WAL and chunk files); required")
	f.StringVar(&nbdListen, "nbd-listen", "", "also serve NBD on this TCP address, in process: IO to copysets this chunkserver leads takes the local fast path (empty: none)")
	f.StringVar(&nbdSocket, "nbd-socket", "", "also serve NBD on this Unix socket, in process (empty: none)")
	f.StringVar(&nbdTLS, "nbd-tls-policy", "allow", "NBD_OPT_STARTTLS on --nbd-listen: off, allow (TLS offered, plaintext allowed) or require (docs/security.md)")
	f.StringVar(&nbdSocketTLS, "nbd-socket-tls-policy", "allow", "NBD_OPT_STARTTLS on --nbd-socket: off, allow or require")
	f.StringVar(&mdsAddrs, "mds", envOr("BASALT_MDS", "127.0.0.1:6700"), "MDS addresses, comma-separated")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "data-plane listen address (client IO and raft)")
	f.StringVar(&cfg.Advertise, "advertise", "", "address given to the MDS (default: the bound --listen address)")
	f.StringVar(&dataMode, "data-mode", "authenticated", "data-plane security (clients and peers follow it): authenticated (mutual TLS at connect, frames in clear) or encrypted (TLS for the whole connection; not on the same-host socket)")
	f.BoolVar(&cfg.TCPOnly, "tcp-only", false, "serve clients and peers on this host over TCP too, not over the same-host Unix socket @basalt/ADDR")
	f.StringVar(&cfg.Zone, "zone", "zone1", "failure domain (zone)")
	f.StringVar(&cfg.Server, "server", "", "host name used as the failure domain inside a zone (default: hostname)")
	f.StringVar(&cfg.MetricsListen, "metrics", "", "Prometheus /metrics listen address (off when empty)")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", time.Second, "heartbeat period")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", chunkserver.DefaultDrainTimeout, "on SIGTERM, hand the leadership of every copyset led here to a caught-up peer and wait up to this long until none is led (negative: stop at once)")
	f.DurationVar(&cfg.WALStallTimeout, "wal-stall-timeout", chunkserver.DefaultWALStallTimeout, "when the WAL has waited this long for its disk (a write or fdatasync that hangs), hand every leadership held here to a peer and report the disk as failing to the MDS until the WAL completes writes again (0: off)")
	f.Uint64Var(&cfg.SnapshotEntries, "snapshot-entries", 0, "raft entries between snapshots of a copyset (default 10000)")
	f.Uint64Var(&cfg.CatchUpEntries, "catchup-entries", 0, "entries kept below a snapshot for slow followers (default 1000)")
	f.StringVar(&pidFile, "pid-file", "", "write the process id to this file")
	f.StringVar(&snapRate, "snapshot-rate", "64MiB", "snapshot streams (rebuilds, rebalancing), bytes sent plus received per second; 0 = unlimited")
	f.StringVar(&scrubRate, "scrub-rate", "16MiB", "background scrub of the copysets led here: chunk data checksummed per second over all replicas; 0 = off")
	f.DurationVar(&cfg.ScrubInterval, "scrub-interval", scrub.DefaultScrubInterval, "background scrub: pause after each copyset")
	f.DurationVar(&cfg.ScrubPassInterval, "scrub-pass-interval", scrub.DefaultPassInterval, "background scrub: least time between passes over every led copyset")
	procsFlag(cmd, &procs)
	f.StringVar(&slowDisk, "fault-slow-disk-file", "", "fault injection for tests: while this file holds a duration (e.g. 50ms), every WAL fdatasync waits that much longer")
	_ = f.MarkHidden("fault-slow-disk-file")
	f.StringVar(&diskErr, "fault-disk-error-file", "", "fault injection for tests: while this file exists, every chunk-file fdatasync fails with EIO (a failing disk)")
	_ = f.MarkHidden("fault-disk-error-file")
	f.BoolVar(&crashAfterDelete, "fault-crash-after-delete", false, "fault injection for tests: kill -9 this process right after a copyset applied a delete-volume entry")
	_ = f.MarkHidden("fault-crash-after-delete")
	f.StringVar(&faultPointsFile, "fault-points-file", "", "fault injection for tests: arm the named fault points this file lists, re-read every 100 ms (docs/reliability.md, \"Fault points\"; e.g. wal-after-sync=crash@20)")
	_ = f.MarkHidden("fault-points-file")
	_ = cmd.MarkFlagRequired("data")
	return cmd
}

// parseDataMode parses --data-mode (docs/security.md, "two modes").
func parseDataMode(s string) (transport.Mode, error) {
	m, err := transport.ParseMode(strings.TrimSpace(s))
	if err != nil || m == transport.ModeNone {
		return 0, fmt.Errorf("--data-mode %q: want authenticated or encrypted (--insecure turns security off)", s)
	}
	return m, nil
}

// diskErrorKnob returns a datastore Fdatasync hook that fails with EIO while
// path exists (checked on every call) and syncs normally otherwise.
func diskErrorKnob(path string) func(fd int, name string) error {
	return func(fd int, _ string) error {
		if _, err := os.Stat(path); err == nil {
			return syscall.EIO
		}
		return unix.Fdatasync(fd)
	}
}

// slowDiskKnob returns a WAL BeforeSync hook that sleeps for the duration
// written in path (a slow disk, switched on and off at run time by tests). The
// file is read every 100 ms; a missing or unparsable file means no delay.
func slowDiskKnob(path string) func() error {
	var delay atomic.Int64
	go func() {
		for {
			var d time.Duration
			if b, err := os.ReadFile(path); err == nil {
				d, _ = time.ParseDuration(strings.TrimSpace(string(b)))
			}
			delay.Store(int64(d))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return func() error {
		if d := time.Duration(delay.Load()); d > 0 {
			time.Sleep(d)
		}
		return nil
	}
}

// procsFlag adds --gomaxprocs: several basalt processes sharing a few cores (the
// playground: three chunkservers and the MDS/NBD process on one machine) run
// better with a share of the CPUs each than with all of them (fewer idle-P
// wake-ups and work steals per IO hand-off; see docs/performance.md).
func procsFlag(cmd *cobra.Command, procs *int) {
	cmd.Flags().IntVar(procs, "gomaxprocs", 0, "Go scheduler threads (GOMAXPROCS); 0: the GOMAXPROCS environment variable or all CPUs")
}

// setProcs applies --gomaxprocs.
func setProcs(n int) {
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
}
