package main

import (
	"errors"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/bench"
)

func benchCommand() *cobra.Command {
	var (
		cfg           bench.Config
		size          string
		targets, jobs string
		runtime, ramp string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run the fio matrix side by side on the raw disk, nbdkit, and 3- and 1-replica basalt volumes",
		Long: `Runs one fio job matrix (4 KiB randwrite and randread at QD1 and QD32, 256 KiB
sequential write QD8, 8 KiB 50/50 randrw QD8) against a raw preallocated file
(libaio, direct=1, plus a fdatasync=1 QD1 write), nbdkit's file plugin on a Unix
socket, and a 3-replica and a 1-replica basalt volume of a playground this command
starts, the 3-replica volume also over NVMe/TCP (the Go host of internal/nvmfhost)
and over iSCSI and NBD from qemu-img bench (basalt-r3-nvmf, basalt-r3-iscsi,
basalt-r3-qemu-nbd; all three at qemu-img bench's strided offsets, not random);
then the 3-replica volume once per data-plane security mode, each on a
playground of its own (basalt-r3-insecure: no TLS; basalt-r3-tcp: authenticated
over TCP; basalt-r3-encrypted: TLS for every connection), with a section on the
CPU each mode costs per 4 KiB IO. Prints a markdown table and writes it to --out. Needs fio and nbdkit
(./scripts/install-deps); bench/run builds the binary and installs them first.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var err error
			if cfg.Size, err = bench.ParseSize(size); err != nil {
				return errors.New("--size: " + err.Error())
			}
			if cfg.Targets, err = bench.SelectTargets(targets); err != nil {
				return err
			}
			if cfg.Jobs, err = bench.SelectJobs(jobs); err != nil {
				return err
			}
			if cfg.Runtime, err = bench.ParseDuration(runtime); err != nil {
				return errors.New("--runtime: " + err.Error())
			}
			if cfg.Ramp, err = bench.ParseDuration(ramp); err != nil {
				return errors.New("--ramp: " + err.Error())
			}
			cfg.Logger = slog.Default()
			ctx, stop := signalContext()
			defer stop()
			_, err = bench.Run(ctx, cfg)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&runtime, "runtime", "20s", "measured time per job after the ramp (seconds, or with a unit: 20s, 1m)")
	f.StringVar(&ramp, "ramp", "5s", "ramp time per job, left out of the figures (seconds, or with a unit)")
	f.StringVar(&size, "size", "1GiB", "working set per target (file or volume size), e.g. 1GiB, 256m")
	f.StringVar(&targets, "targets", "", "comma-separated subset of "+strings.Join(bench.AllTargets, ",")+" (default all)")
	f.StringVar(&jobs, "jobs", "", "comma-separated subset of randwrite-4k-qd1,randwrite-4k-qd32,randread-4k-qd1,randread-4k-qd32,write-256k-qd8,randrw-8k-qd8 (default all)")
	f.StringVar(&cfg.Out, "out", "bench/results/latest.md", `markdown output file ("-": none)`)
	f.StringVar(&cfg.Dir, "dir", "bench/work", "bench-owned working directory for the files and the playground (on the disk to measure)")
	f.StringVar(&cfg.Binary, "binary", "", "basalt binary for the playground (default this executable)")
	f.StringVar(&cfg.Baseline, "baseline", "", "another basalt binary (an earlier build) to run every basalt target with too, in the same sitting, and compare")
	f.Uint32Var(&cfg.Copysets, "copysets", 0, "copysets per basalt pool (default: the MDS default)")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the data files and the playground directory")
	return cmd
}
