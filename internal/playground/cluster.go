package playground

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/mds"
	"github.com/basalt-storage/basalt/pkg/api"
)

// startMDS runs the MDS with its embedded etcd in this process; stop ends it.
func startMDS(cfg Config, st *State) (stop func(), err error) {
	mcfg := mds.Config{
		Listen:        st.MDS,
		DataDir:       filepath.Join(cfg.Dir, "mds"),
		EtcdClientURL: st.Etcd,
		EtcdPeerURL:   "https://" + addr(cfg.PortBase+2),
		Logger:        cfg.Logger.With("component", "mds"),
		Insecure:      cfg.Insecure,
	}
	if cfg.Insecure {
		mcfg.EtcdPeerURL = "http://" + addr(cfg.PortBase+2)
	} else if mcfg.TLS, err = identity.Load(st.TLSDir, "mds"); err != nil {
		return nil, err
	}
	m, err := mds.New(mcfg)
	if err != nil {
		return nil, fmt.Errorf("start MDS: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	return func() {
		cancel()
		<-done
	}, nil
}

// startChunkservers starts cfg.Chunkservers child processes and records them in st.
func startChunkservers(cfg Config, st *State, sup *supervisor) error {
	for i := 1; i <= cfg.Chunkservers; i++ {
		cs := chunkserverState(cfg, st, i)
		pid, err := sup.start(cs)
		if err != nil {
			return err
		}
		cs.PID = pid
		st.Chunkservers = append(st.Chunkservers, cs)
	}
	return nil
}

// chunkserverState is where chunkserver i lives and the command that (re)starts it.
func chunkserverState(cfg Config, st *State, i int) ChunkserverState {
	cs := ChunkserverState{
		Index:   i,
		Addr:    addr(cfg.PortBase + 10 + i),
		Metrics: addr(cfg.PortBase + 20 + i),
		DataDir: filepath.Join(cfg.Dir, fmt.Sprintf("cs%d", i)),
	}
	cs.Log = filepath.Join(cs.DataDir, "chunkserver.log")
	cs.RestartCmd = []string{cfg.Binary, "chunkserver",
		"--data", cs.DataDir, "--mds", st.MDS, "--listen", cs.Addr, "--metrics", cs.Metrics,
		"--zone", fmt.Sprintf("zone%d", i), "--server", fmt.Sprintf("playground-%d", i),
		"--pid-file", filepath.Join(cs.DataDir, "pid"), "--log-file", cs.Log}
	if cfg.Insecure {
		cs.RestartCmd = append(cs.RestartCmd, "--insecure")
	} else {
		cs.RestartCmd = append(cs.RestartCmd,
			"--tls-dir", st.TLSDir, "--tls-cert", identity.Base(identity.RoleChunkserver, strconv.Itoa(i)))
	}
	if cfg.DataMode != "" {
		cs.RestartCmd = append(cs.RestartCmd, "--data-mode", cfg.DataMode)
	}
	if cfg.TCPOnly {
		cs.RestartCmd = append(cs.RestartCmd, "--tcp-only")
	}
	if cfg.Procs > 0 {
		cs.RestartCmd = append(cs.RestartCmd, "--gomaxprocs", strconv.Itoa(cfg.Procs))
	}
	if sock := filepath.Join(cs.DataDir, "nbd.sock"); len(sock) < maxSocketPath {
		cs.NBDSocket = sock
		cs.RestartCmd = append(cs.RestartCmd, "--nbd-socket", sock)
		if !cfg.Insecure {
			cs.RestartCmd = append(cs.RestartCmd, "--nbd-tls-cert", identity.Base(identity.RoleAccess, "cs"+strconv.Itoa(i)))
		}
	}
	return cs
}

// prepareCluster waits for the chunkservers to register, creates the pool and
// the volume (once: a second run finds them) and waits until every copyset
// has a leader.
func prepareCluster(ctx context.Context, mc api.MDSClient, cfg Config, sup *supervisor) error {
	if err := waitFor(ctx, 60*time.Second, "chunkservers to register", func(ctx context.Context) error {
		if err := sup.exitErr(); err != nil {
			return stopWaiting{err} // it will not register: say why now
		}
		r, err := mc.ListChunkServers(ctx, &api.ListChunkServersRequest{})
		if err != nil {
			return err
		}
		online := 0
		for _, c := range r.Chunkservers {
			if c.Online {
				online++
			}
		}
		if online < cfg.Chunkservers {
			return fmt.Errorf("%d of %d chunkservers online", online, cfg.Chunkservers)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := ensurePoolAndVolume(ctx, mc, cfg, cfg.Logger); err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, "every copyset to elect a leader", func(ctx context.Context) error {
		r, err := mc.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		if r.CopysetsHealthy < uint32(len(r.Copysets)) || len(r.Copysets) == 0 {
			return fmt.Errorf("%d of %d copysets healthy", r.CopysetsHealthy, len(r.Copysets))
		}
		return nil
	})
}

func ensurePoolAndVolume(ctx context.Context, mc api.MDSClient, cfg Config, log *slog.Logger) error {
	pools, err := mc.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil {
		return err
	}
	if len(pools.Pools) == 0 {
		p, err := mc.CreatePool(ctx, &api.CreatePoolRequest{Name: "default", Replicas: 3, CopysetCount: cfg.Copysets})
		if err != nil {
			return fmt.Errorf("create pool: %w", err)
		}
		log.Info("pool created", "pool", p.Pool.Name, "copysets", p.Pool.CopysetCount)
	}
	if _, err := mc.GetVolume(ctx, &api.GetVolumeRequest{Name: cfg.Volume}); err == nil {
		return nil
	}
	if _, err := mc.CreateVolume(ctx, &api.CreateVolumeRequest{Name: cfg.Volume, Size: cfg.Size}); err != nil {
		return fmt.Errorf("create volume %q: %w", cfg.Volume, err)
	}
	log.Info("volume created", "volume", cfg.Volume, "size", cfg.Size)
	return nil
}

// waitFor retries check until it succeeds or the timeout passes.
// stopWaiting ends waitFor at once with its error.
type stopWaiting struct{ error }

func waitFor(ctx context.Context, timeout time.Duration, what string, check func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if sw, ok := err.(stopWaiting); ok {
			return sw.error
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
