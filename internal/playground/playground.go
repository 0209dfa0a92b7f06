package playground

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/debughttp"
	"github.com/basalt-storage/basalt/internal/frontend/nbd"
	"github.com/basalt-storage/basalt/internal/frontend/volumes"
	"github.com/basalt-storage/basalt/internal/mds"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Config describes the playground to run.
type Config struct {
	Dir          string // all data and logs; default ./basalt-data
	Volume       string // default "demo"
	Size         uint64 // volume size; default 8 GiB
	NBDListen    string // default 127.0.0.1:10809
	NBDSocket    string // default DIR/nbd.sock
	PortBase     int    // MDS on PortBase, etcd on +1/+2, chunkservers on +11.., metrics on +21..; default 6700
	Chunkservers int    // default 3
	Copysets     uint32 // copysets of the pool; 0 = the MDS default
	Binary       string // the basalt binary to start chunkservers with; default this executable
	// Metrics: where this process serves /metrics (NBD front end, client library,
	// Go runtime) and /debug/pprof/; "" = nowhere.
	Metrics string
	// Procs is GOMAXPROCS for this process and each chunkserver: 0 shares the CPUs
	// among them (NumCPU / (Chunkservers+1), at least 1) unless the GOMAXPROCS
	// environment variable is set; negative leaves Go's default.
	Procs  int
	Logger *slog.Logger
	Out    io.Writer // where the welcome text goes; default os.Stdout
}

// ChunkserverState is one chunkserver of the playground.
type ChunkserverState struct {
	Index   int    `json:"index"`
	Addr    string `json:"addr"`
	Metrics string `json:"metrics"`
	// NBDSocket: the NBD front end inside this chunkserver (basalt chunkserver
	// --nbd-socket); volumes whose copysets it leads take the local fast path.
	NBDSocket  string   `json:"nbd_socket,omitempty"`
	PID        int      `json:"pid"`
	DataDir    string   `json:"data_dir"`
	Log        string   `json:"log"`
	RestartCmd []string `json:"restart_cmd"`
}

// State is what playground.json holds.
type State struct {
	Dir          string             `json:"dir"`
	PID          int                `json:"pid"` // the playground process (MDS, etcd, NBD)
	MDS          string             `json:"mds"`
	Etcd         string             `json:"etcd"`
	NBD          string             `json:"nbd"`
	NBDSocket    string             `json:"nbd_socket"`
	NBDURI       string             `json:"nbd_uri"`
	NBDUnixURI   string             `json:"nbd_unix_uri"`
	Metrics      string             `json:"metrics,omitempty"` // this process's /metrics and /debug/pprof/
	Volume       string             `json:"volume"`
	Size         uint64             `json:"size"`
	Chunkservers []ChunkserverState `json:"chunkservers"`
}

// maxSocketPath: longer Unix socket paths do not fit sockaddr_un.
const maxSocketPath = 100

// StateFile is the name of the state file inside the playground directory.
const StateFile = "playground.json"

func (c *Config) setDefaults() error {
	if c.Dir == "" {
		c.Dir = "basalt-data"
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return err
	}
	c.Dir = abs
	if c.Volume == "" {
		c.Volume = "demo"
	}
	if c.Size == 0 {
		c.Size = 8 << 30
	}
	if c.NBDListen == "" {
		c.NBDListen = "127.0.0.1:10809"
	}
	if c.NBDSocket == "" {
		c.NBDSocket = filepath.Join(c.Dir, "nbd.sock")
	}
	if c.PortBase == 0 {
		c.PortBase = 6700
	}
	if c.Chunkservers == 0 {
		c.Chunkservers = 3
	}
	if c.Binary == "" {
		if c.Binary, err = os.Executable(); err != nil {
			return err
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Procs == 0 && os.Getenv("GOMAXPROCS") == "" {
		c.Procs = max(1, runtime.NumCPU()/(c.Chunkservers+1))
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	return nil
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// Run starts the playground and blocks until ctx is done, then stops everything.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	log := cfg.Logger
	if cfg.Procs > 0 {
		runtime.GOMAXPROCS(cfg.Procs)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("playground directory: %w", err)
	}
	_ = os.Remove(filepath.Join(cfg.Dir, StateFile))

	st := State{
		Dir:       cfg.Dir,
		PID:       os.Getpid(),
		MDS:       addr(cfg.PortBase),
		Etcd:      "http://" + addr(cfg.PortBase+1),
		NBD:       cfg.NBDListen,
		NBDSocket: cfg.NBDSocket,
		Volume:    cfg.Volume,
		Size:      cfg.Size,
	}
	st.NBDURI = "nbd://" + st.NBD + "/" + cfg.Volume
	st.NBDUnixURI = "nbd+unix:///" + cfg.Volume + "?socket=" + st.NBDSocket

	// 1. The MDS and its embedded etcd, in this process.
	m, err := mds.New(mds.Config{
		Listen:        st.MDS,
		DataDir:       filepath.Join(cfg.Dir, "mds"),
		EtcdClientURL: st.Etcd,
		EtcdPeerURL:   "http://" + addr(cfg.PortBase+2),
		Logger:        log.With("component", "mds"),
	})
	if err != nil {
		return fmt.Errorf("start MDS: %w", err)
	}
	mdsCtx, stopMDS := context.WithCancel(context.Background())
	mdsDone := make(chan error, 1)
	go func() { mdsDone <- m.Run(mdsCtx) }()
	defer func() {
		stopMDS()
		<-mdsDone
	}()

	mc, err := mdsclient.Dial([]string{st.MDS})
	if err != nil {
		return err
	}
	defer mc.Close()

	// 2. The chunkservers, as child processes.
	sup := &supervisor{log: log}
	defer sup.stopAll()
	for i := 1; i <= cfg.Chunkservers; i++ {
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
		if cfg.Procs > 0 {
			cs.RestartCmd = append(cs.RestartCmd, "--gomaxprocs", strconv.Itoa(cfg.Procs))
		}
		if sock := filepath.Join(cs.DataDir, "nbd.sock"); len(sock) < maxSocketPath {
			cs.NBDSocket = sock
			cs.RestartCmd = append(cs.RestartCmd, "--nbd-socket", sock)
		}
		pid, err := sup.start(cs)
		if err != nil {
			return err
		}
		cs.PID = pid
		st.Chunkservers = append(st.Chunkservers, cs)
	}

	// 3. Pool and volume, created once; a second run finds them.
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
	if err := ensurePoolAndVolume(ctx, mc, cfg, log); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, "every copyset to elect a leader", func(ctx context.Context) error {
		r, err := mc.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		if r.CopysetsHealthy < uint32(len(r.Copysets)) || len(r.Copysets) == 0 {
			return fmt.Errorf("%d of %d copysets healthy", r.CopysetsHealthy, len(r.Copysets))
		}
		return nil
	}); err != nil {
		return err
	}

	// 4. The NBD front end on TCP and on a Unix socket, and its metrics.
	var cm *client.Metrics
	var nm *nbd.Metrics
	if cfg.Metrics != "" {
		reg := debughttp.NewRegistry()
		cm, nm = client.NewMetrics(reg), nbd.NewMetrics(reg)
		hs, a, err := debughttp.Serve(cfg.Metrics, reg)
		if err != nil {
			return fmt.Errorf("metrics listen on %s: %w", cfg.Metrics, err)
		}
		defer hs.Close()
		st.Metrics = a.String()
	}
	exports := volumes.New(volumes.Config{MDS: []string{st.MDS}, Lister: mc, ClientName: "playground-nbd",
		Logger: log.With("component", "nbd"), Metrics: cm})
	defer exports.Close()
	srv, err := nbd.NewServer(nbd.Config{Exports: exports, ErrorCode: volumes.NBDErrorCode,
		Logger: log.With("component", "nbd"), Metrics: nm})
	if err != nil {
		return err
	}
	tcpLn, err := net.Listen("tcp", cfg.NBDListen)
	if err != nil {
		return fmt.Errorf("NBD listen on %s: %w (is another playground running? use --nbd-listen)", cfg.NBDListen, err)
	}
	_ = os.Remove(cfg.NBDSocket)
	unixLn, err := net.Listen("unix", cfg.NBDSocket)
	if err != nil {
		tcpLn.Close()
		return fmt.Errorf("NBD listen on %s: %w", cfg.NBDSocket, err)
	}
	go srv.Serve(tcpLn)
	go srv.Serve(unixLn)
	defer srv.Close()

	// 5. Tell scripts and people where everything is.
	if err := writeState(filepath.Join(cfg.Dir, StateFile), &st); err != nil {
		return err
	}
	printWelcome(cfg.Out, &st)
	<-ctx.Done()
	fmt.Fprintln(cfg.Out, "\nstopping the playground...")
	_ = os.Remove(filepath.Join(cfg.Dir, StateFile))
	return nil
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

func writeState(path string, st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadState reads DIR/playground.json.
func ReadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", StateFile, err)
	}
	return &st, nil
}

// supervisor starts the chunkserver children and stops them (and any chunkserver
// restarted by hand on the same directory, found through its pid file) at the end.
type supervisor struct {
	log      *slog.Logger
	stopping atomic.Bool // set by stopAll: exits are expected from then on

	mu     sync.Mutex
	procs  []*exec.Cmd
	dirs   []string
	exited error // the first chunkserver that exited on its own, and why
}

// exitErr tells whether a chunkserver exited on its own, and why.
func (s *supervisor) exitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exited
}

func (s *supervisor) start(cs ChunkserverState) (int, error) {
	if err := os.MkdirAll(cs.DataDir, 0o755); err != nil {
		return 0, err
	}
	stopStale(cs.DataDir)
	cmd := exec.Command(cs.RestartCmd[0], cs.RestartCmd[1:]...)
	// Own process group: a Ctrl-C in the terminal reaches only the playground,
	// which then stops the children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr := &tailWriter{max: 4 << 10}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start chunkserver %d: %w", cs.Index, err)
	}
	s.mu.Lock()
	s.procs = append(s.procs, cmd)
	s.dirs = append(s.dirs, cs.DataDir)
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		if s.stopping.Load() {
			return
		}
		s.log.Warn("chunkserver exited; restart it with the restart_cmd in playground.json",
			"chunkserver", cs.Index, "pid", cmd.Process.Pid, "status", fmt.Sprint(err),
			"stderr", stderr.lastLine(), "log", cs.Log)
		s.mu.Lock()
		if s.exited == nil {
			s.exited = fmt.Errorf("chunkserver %d exited (%v): %s (log: %s)", cs.Index, err, stderr.lastLine(), cs.Log)
		}
		s.mu.Unlock()
	}()
	return cmd.Process.Pid, nil
}

// stopAll sends SIGTERM to every chunkserver, waits a while, then SIGKILLs.
func (s *supervisor) stopAll() {
	s.stopping.Store(true)
	s.mu.Lock()
	dirs := append([]string(nil), s.dirs...)
	s.mu.Unlock()
	var pids []int
	for _, d := range dirs {
		if pid := pidFromFile(d); pid > 0 {
			pids = append(pids, pid)
		}
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range pids {
		for alive(p) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if alive(p) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// stopStale stops a chunkserver left running on dir by an earlier playground.
func stopStale(dir string) {
	if pid := pidFromFile(dir); pid > 0 && alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 100 && alive(pid); i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func pidFromFile(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(string(trimSpace(b)))
	return pid
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] != 'Z'
		}
	}
	return true
}

var errNotReady = errors.New("playground: not ready")

// WaitReady waits until DIR/playground.json exists and returns it.
func WaitReady(ctx context.Context, dir string) (*State, error) {
	for {
		st, err := ReadState(dir)
		if err == nil {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v", errNotReady, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tailWriter keeps the last max bytes written to it: a child's stderr, which
// holds its exit error (its logs go to its log file).
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// lastLine returns the last non-empty line written.
func (t *tailWriter) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	return lines[len(lines)-1]
}
