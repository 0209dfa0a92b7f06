package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// target is one thing fio can drive.
type target struct {
	name   string
	engine []string // fio arguments naming the engine and the file or URI
	procs  procSet  // the basalt processes serving it; empty for raw and nbdkit
	close  func()
	// driver, when set, runs a job instead of fio (runtime 0: the prefill).
	driver func(ctx context.Context, j Job, runtime, ramp time.Duration, procs procSet) (fioResult, error)
	// supports, when set, says which jobs the driver can run; the others are
	// left out (and said so under the table).
	supports func(Job) bool
}

// maxSocketPath is what fits in sockaddr_un.sun_path with its NUL.
const maxSocketPath = 107

// Volume names the bench creates on its playground.
const (
	volumeR3 = "bench-r3"
	volumeR1 = "bench-r1"
	poolR1   = "local"
)

// createFile makes path a preallocated file of size bytes (contents written later
// by the prefill).
func createFile(path string, size uint64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		f.Close()
		return fmt.Errorf("fallocate %s: %w", path, err)
	}
	return f.Close()
}

// openRaw prepares the raw file target.
func (r *runner) openRaw(context.Context) (*target, error) {
	path := filepath.Join(r.cfg.Dir, "raw.img")
	if err := createFile(path, r.cfg.Size); err != nil {
		return nil, err
	}
	return &target{
		name:   TargetRaw,
		engine: []string{"--ioengine=libaio", "--direct=1", "--filename=" + path},
		close:  func() { r.remove(path) },
	}, nil
}

// openNBDKit starts nbdkit's file plugin on a Unix socket.
func (r *runner) openNBDKit(ctx context.Context) (*target, error) {
	if _, err := exec.LookPath("nbdkit"); err != nil {
		return nil, fmt.Errorf("nbdkit not found (run ./scripts/install-deps): %w", err)
	}
	path := filepath.Join(r.cfg.Dir, "nbdkit.img")
	sock := filepath.Join(r.cfg.Dir, "nbdkit.sock")
	if len(sock) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is too long for a Unix socket; use a shorter --dir", sock)
	}
	if err := createFile(path, r.cfg.Size); err != nil {
		return nil, err
	}
	_ = os.Remove(sock)
	logf, err := os.Create(filepath.Join(r.cfg.Dir, "nbdkit.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nbdkit", "--unix", sock, "--foreground", "file", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start nbdkit: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	stop := func() {
		stopProcess(cmd.Process.Pid, exited, 10*time.Second)
		r.remove(path)
		_ = os.Remove(sock)
	}
	if err := waitSocket(ctx, sock, exited, 15*time.Second); err != nil {
		stop()
		return nil, fmt.Errorf("nbdkit: %w (see %s)", err, logf.Name())
	}
	r.log.Info("nbdkit serving", "socket", sock, "pid", cmd.Process.Pid)
	return &target{
		name:   TargetNBDKit,
		engine: []string{"--ioengine=nbd", "--uri=nbd+unix:///?socket=" + sock},
		close:  stop,
	}, nil
}

// waitSocket waits until a Unix socket accepts connections.
func waitSocket(ctx context.Context, sock string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before it listened")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no listener on %s after %s: %w", sock, timeout, err)
		}
	}
}

// stopProcess sends SIGTERM, waits up to grace for exited, then SIGKILLs.
func stopProcess(pid int, exited <-chan struct{}, grace time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-exited
	}
}

// pgState is the part of the playground's DIR/playground.json (playground.State)
// the bench reads. It is decoded here rather than imported so that this package
// depends only on the file's documented format, not on the whole cluster code.
type pgState struct {
	PID          int    `json:"pid"`
	MDS          string `json:"mds"`
	TLSDir       string `json:"tls_dir"` // the playground's certificates
	NBDSocket    string `json:"nbd_socket"`
	NVMf         string `json:"nvmf"`      // NVMe/TCP target (host:port)
	NVMfNQN      string `json:"nvmf_nqn"`  // the volume's subsystem NQN
	ISCSIURI     string `json:"iscsi_uri"` // libiscsi's URL of the volume's LUN 0
	Volume       string `json:"volume"`
	Chunkservers []struct {
		Index int    `json:"index"`
		PID   int    `json:"pid"`
		Addr  string `json:"addr"`
		// NBDSocket: the NBD front end inside this chunkserver (the local fast
		// path), if the playground started one.
		NBDSocket string `json:"nbd_socket"`
	} `json:"chunkservers"`
}

// localSockets reports whether the chunkservers serve NBD in process.
func (s *pgState) localSockets() bool {
	for _, cs := range s.Chunkservers {
		if cs.NBDSocket == "" {
			return false
		}
	}
	return len(s.Chunkservers) > 0
}

// playgroundProc is a `basalt playground` child process owned by the bench.
type playgroundProc struct {
	dir    string
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
	state  pgState
}

// procs lists the playground process and every chunkserver.
func (p *playgroundProc) procs() procSet {
	ps := procSet{names: []string{"playground (MDS, etcd, NBD)"}, pids: []int{p.state.PID}}
	for _, cs := range p.state.Chunkservers {
		ps.names = append(ps.names, fmt.Sprintf("chunkserver %d", cs.Index))
		ps.pids = append(ps.pids, cs.PID)
	}
	return ps
}

// isBasaltTarget reports whether target is served by a basalt playground.
func isBasaltTarget(target string) bool {
	t, _ := strings.CutSuffix(target, BaselineSuffix)
	return t == TargetBasaltR3 || t == TargetBasaltR1
}

// isFrontendTarget reports whether target is one of the front ends side by
// side (the 3-replica volume over NVMe/TCP, iSCSI or qemu's NBD client).
func isFrontendTarget(target string) bool {
	return slices.Contains(frontendTargets, target)
}

// playgroundFlags are the `basalt playground` flags of target's playground
// beyond the bench's own: its security mode.
func playgroundFlags(target string) []string {
	switch strings.TrimSuffix(target, BaselineSuffix) {
	case TargetBasaltR3Insecure:
		return []string{"--insecure"}
	case TargetBasaltR3TCP:
		return []string{"--tcp-only"}
	case TargetBasaltR3Encrypted:
		return []string{"--data-mode", "encrypted", "--tcp-only"}
	}
	return nil
}

// binaryFor returns the basalt binary that serves target.
func (r *runner) binaryFor(target string) string {
	if strings.HasSuffix(target, BaselineSuffix) {
		return r.cfg.Baseline
	}
	return r.cfg.Binary
}

// playground returns the playground running the binary target needs, starting it
// on first use; a playground of another binary is stopped first, so only one
// build's processes run (and load the machine) at a time.
func (r *runner) playground(ctx context.Context, target string) (*playgroundProc, error) {
	bin, flags := r.binaryFor(target), playgroundFlags(target)
	key := strings.Join(append([]string{bin}, flags...), " ")
	if r.pg != nil && r.pgKey == key {
		return r.pg, nil
	}
	if err := r.pgErr[key]; err != nil {
		return nil, err
	}
	r.closePlayground()
	pg, err := r.startPlayground(ctx, bin, flags)
	if err != nil {
		r.pgErr[key] = err
		return nil, err
	}
	r.pg, r.pgBinary, r.pgKey = pg, bin, key
	r.measureIdle(ctx, pg.procs(), target)
	return pg, nil
}

// closePlayground records the peak RSS of the running playground's processes and
// stops it.
func (r *runner) closePlayground() {
	if r.pg == nil {
		return
	}
	ps := r.pg.procs()
	for i, pid := range ps.pids {
		if s, err := SampleProc(pid); err == nil {
			r.rep.Procs = append(r.rep.Procs, ProcPeak{Name: ps.names[i], PID: pid, PeakRSS: s.PeakRSS, Binary: r.pgBinary})
		}
	}
	r.stopPlayground(r.pg)
	r.pg = nil
}

// idleWindow is how long the bench watches the basalt processes before any IO.
const idleWindow = 3 * time.Second

// measureIdle records the CPU the basalt processes burn with no IO (raft ticks,
// heartbeats, etcd), so the CPU-per-IO column of slow jobs can be read against it.
func (r *runner) measureIdle(ctx context.Context, ps procSet, target string) {
	before, err := ps.sample()
	if err != nil {
		return
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(idleWindow):
	}
	after, err := ps.sample()
	if err != nil {
		return
	}
	cpu, _ := usage(before, after)
	cores := cpu.Seconds() / time.Since(start).Seconds()
	r.log.Info("basalt processes at idle", "binary", r.binaryFor(target), "cpu_cores", fmt.Sprintf("%.3f", cores))
	r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("At idle (the %s after the playground of %s was ready, before any IO) the basalt "+
		"processes used %.3f CPU cores: in the CPU column that baseline alone is %.3f × 10,000 / IOPS seconds.",
		idleWindow, r.binaryFor(target), cores, cores))
}

func (r *runner) startPlayground(ctx context.Context, binary string, flags []string) (*playgroundProc, error) {
	dir := filepath.Join(r.cfg.Dir, "playground")
	if b, err := os.ReadFile(filepath.Join(dir, "playground.json")); err == nil {
		var old pgState
		if json.Unmarshal(b, &old) == nil && old.PID > 0 && syscall.Kill(old.PID, 0) == nil {
			return nil, fmt.Errorf("a playground (pid %d) is still running on %s; stop it first", old.PID, dir)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "nbd.sock")
	if len(sock) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is too long for a Unix socket; use a shorter --dir", sock)
	}
	base, err := freePortBase(3)
	if err != nil {
		return nil, err
	}
	// The NBD listener's port is in the checked range too: a port the kernel
	// gave out at random could be one of the range's (a chunkserver's metrics).
	nbdPort := base + nbdPortOffset
	args := []string{"playground", "--dir", dir, "--port-base", strconv.Itoa(base),
		"--nbd-listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(nbdPort)), "--nbd-socket", sock,
		"--size", strconv.FormatUint(r.cfg.Size, 10), "--volume", volumeR3}
	args = append(args, flags...)
	if r.cfg.Copysets > 0 {
		args = append(args, "--copysets", strconv.FormatUint(uint64(r.cfg.Copysets), 10))
	}
	p := &playgroundProc{dir: dir, log: filepath.Join(dir, "playground.log"), exited: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C reaches the bench, which stops it in order.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.log.Info("starting playground", "cmd", binary+" "+strings.Join(args, " "), "log", p.log)
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start playground: %w", err)
	}
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.exited) }()

	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		b, err := os.ReadFile(filepath.Join(dir, "playground.json"))
		if err == nil && json.Unmarshal(b, &p.state) == nil && p.state.PID > 0 {
			break
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("playground exited before it was ready: %s", tail(p.log, 15))
		case <-wctx.Done():
			r.stopPlayground(p)
			return nil, fmt.Errorf("playground not ready: %w: %s", wctx.Err(), tail(p.log, 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
	r.log.Info("playground ready", "mds", p.state.MDS, "nbd_socket", p.state.NBDSocket,
		"chunkservers", len(p.state.Chunkservers))
	return p, nil
}

// stopPlayground stops the playground (which stops its chunkservers) and, should it
// not exit in time, kills it and the chunkservers it recorded.
func (r *runner) stopPlayground(p *playgroundProc) {
	if p == nil || p.cmd == nil {
		return
	}
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		r.log.Warn("playground did not stop in 30s; killing it and its chunkservers", "pid", p.cmd.Process.Pid)
		_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
		for _, cs := range p.state.Chunkservers {
			if cs.PID > 0 {
				_ = syscall.Kill(cs.PID, syscall.SIGKILL)
			}
		}
	}
	r.remove(p.dir)
}

// openBasaltR3 serves the playground's 3-replica volume.
func (r *runner) openBasaltR3(ctx context.Context, name string) (*target, error) {
	p, err := r.playground(ctx, name)
	if err != nil {
		return nil, err
	}
	return r.basaltTarget(name, p, volumeR3), nil
}

// openBasaltR1 creates the 1-replica pool and volume through the MDS API. When
// the playground's chunkservers serve NBD in process, the pool gets one copyset, so
// the whole volume lives on one chunkserver (as docs/design.md §9 places a local pool's
// volume), and the volume is served by that chunkserver's own front end: the
// local fast path (client.Config.Local), no socket between front end and copyset.
func (r *runner) openBasaltR1(ctx context.Context, name string) (*target, error) {
	p, err := r.playground(ctx, name)
	if err != nil {
		return nil, err
	}
	copysets := r.cfg.Copysets
	local := p.state.localSockets()
	if local {
		copysets = 1
	}
	admin, err := identity.Load(p.state.TLSDir, "admin")
	if err != nil {
		return nil, fmt.Errorf("the playground's admin certificate: %w", err)
	}
	mc, err := mdsclient.Dial([]string{p.state.MDS}, admin.ClientTLS(identity.RoleMDS))
	if err != nil {
		return nil, err
	}
	defer mc.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	pool, err := mc.CreatePool(cctx, &api.CreatePoolRequest{Name: poolR1, Replicas: 1, CopysetCount: copysets})
	switch {
	case status.Code(err) == codes.AlreadyExists:
	case err != nil:
		return nil, fmt.Errorf("create pool %q: %w", poolR1, err)
	default:
		r.log.Info("pool created", "pool", poolR1, "replicas", 1, "copysets", pool.GetPool().GetCopysetCount())
	}
	if _, err := mc.CreateVolume(cctx, &api.CreateVolumeRequest{Name: volumeR1, Size: r.cfg.Size, Pool: poolR1}); err != nil &&
		status.Code(err) != codes.AlreadyExists {
		return nil, fmt.Errorf("create volume %q: %w", volumeR1, err)
	}
	// The new pool's copysets need leaders before IO can go anywhere.
	var last string
	for {
		cs, err := mc.ClusterStatus(cctx, &api.ClusterStatusRequest{})
		if err == nil && len(cs.Copysets) > 0 && cs.CopysetsHealthy == uint32(len(cs.Copysets)) {
			break
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d of %d copysets healthy", cs.CopysetsHealthy, len(cs.Copysets))
		}
		select {
		case <-cctx.Done():
			return nil, fmt.Errorf("waiting for the %q pool's copysets: %s", poolR1, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
	t := r.basaltTarget(name, p, volumeR1)
	if local {
		sock, err := r1Socket(cctx, mc, p)
		if err != nil {
			return nil, err
		}
		t.engine = []string{"--ioengine=nbd", "--uri=nbd+unix:///" + volumeR1 + "?socket=" + sock}
		if name == TargetBasaltR1 {
			r.r1Local = sock
		}
		r.log.Info("basalt-r1 through the local fast path", "socket", sock)
	}
	return t, nil
}

// r1Socket finds the chunkserver holding the r1 pool's copysets and returns its
// in-process NBD socket.
func r1Socket(ctx context.Context, mc *mdsclient.Client, p *playgroundProc) (string, error) {
	pools, err := mc.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil {
		return "", err
	}
	var poolID uint32
	found := false
	for _, pl := range pools.GetPools() {
		if pl.GetName() == poolR1 {
			poolID, found = pl.GetId(), true
		}
	}
	if !found {
		return "", fmt.Errorf("pool %q not listed", poolR1)
	}
	cs, err := mc.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: poolID})
	if err != nil {
		return "", err
	}
	holders := map[uint64]bool{}
	for _, c := range cs.GetCopysets() {
		for _, m := range c.GetMembers() {
			holders[m] = true
		}
	}
	if len(holders) != 1 {
		return "", fmt.Errorf("pool %q spans %d chunkservers; the local path needs one", poolR1, len(holders))
	}
	for _, srv := range cs.GetChunkservers() {
		if !holders[srv.GetId()] {
			continue
		}
		for _, pc := range p.state.Chunkservers {
			if pc.Addr == srv.GetAddr() && pc.NBDSocket != "" {
				return pc.NBDSocket, nil
			}
		}
	}
	return "", fmt.Errorf("no in-process NBD socket for the chunkserver holding pool %q", poolR1)
}

func (r *runner) basaltTarget(name string, p *playgroundProc, volume string) *target {
	return &target{
		name:   name,
		engine: []string{"--ioengine=nbd", "--uri=nbd+unix:///" + volume + "?socket=" + p.state.NBDSocket},
		procs:  p.procs(),
		close:  func() {}, // the playground is shared; the runner stops it at the end
	}
}

// freePortBase finds a base port P such that the playground's ports (MDS P,
// etcd P+1 and P+2, iSCSI P+3, chunkservers P+11.., their metrics P+21..,
// NVMe/TCP P+28, the bench's NBD listener P+30) are all free on 127.0.0.1 now.
func freePortBase(chunkservers int) (int, error) {
	offsets := []int{0, 1, 2, 3, 28, nbdPortOffset}
	for i := 1; i <= chunkservers; i++ {
		offsets = append(offsets, 10+i, 20+i)
	}
	for try := 0; try < 50; try++ {
		base := 20000 + 100*rand.IntN(300)
		ok := true
		for _, off := range offsets {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+off)))
			if err != nil {
				ok = false
				break
			}
			ln.Close()
		}
		if ok {
			return base, nil
		}
	}
	return 0, errors.New("bench: no free port range for the playground")
}

// nbdPortOffset places the playground's NBD TCP listener at the port base + 30.
const nbdPortOffset = 30

// tail returns the last n lines of a log file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "last lines of " + path + ":\n" + strings.Join(lines, "\n")
}
