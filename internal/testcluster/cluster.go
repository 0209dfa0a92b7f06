package testcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Options shape the cluster.
type Options struct {
	Chunkservers int    // default 3
	Replicas     uint32 // default 3
	Copysets     uint32 // default 8
	ChunkSize    uint64 // default 4 MiB
	// Extra flags for every chunkserver, e.g. "--snapshot-entries=200".
	ChunkserverFlags []string
	// Extra flags for every MDS, e.g. "--recovery-grace=5s".
	MDSFlags []string
	// MDSCount MDS processes share EtcdEndpoints (an external etcd, see
	// StartEtcd); with no endpoints the one MDS embeds etcd. Default 1.
	MDSCount      int
	EtcdEndpoints []string
	// Net, when set, runs every process in its own network namespace of Net
	// (named "mds1".., "cs1"..), which must exist; see InNetns.
	Net *Net
	// PrepareChunkserver, when set, runs before chunkserver i (from 0) first
	// starts, with its data directory (e.g. to mount a small file system there).
	PrepareChunkserver func(i int, dir string)
	// SlowDiskKnob gives every chunkserver a --fault-slow-disk-file; see SetSlowDisk.
	SlowDiskKnob bool
	// Proxy puts a TCP proxy of the test process in front of every
	// chunkserver, so that Isolate can cut it off its peers and clients
	// without root (proxy.go). The chunkservers then serve over TCP only.
	Proxy bool
	// TLSDir holds the cluster CA and certificates (identity.EnsureCerts);
	// give StartEtcd's when the MDS use that etcd. Default: DIR/tls, made
	// here. Every process runs with TLS, as a user deploys it.
	TLSDir string
}

// Proc is one basalt process of the cluster.
type Proc struct {
	Name    string
	Args    []string
	DataDir string
	LogPath string
	NetNS   string // network namespace to run in ("" = this one)
	Addr    string // listen address (host:port)

	mu     sync.Mutex
	cmd    *exec.Cmd
	reaped chan struct{} // closed once cmd's process was waited for
	// last is the most recently started process; exited and exitCode
	// describe it once it has been reaped.
	last     *exec.Cmd
	exited   bool
	exitCode int
}

// Cluster is a running cluster.
type Cluster struct {
	t       testing.TB
	Dir     string
	Binary  string
	MDSAddr string  // every MDS address, comma-separated
	MDS     *Proc   // the first MDS
	MDSs    []*Proc // every MDS
	CS      []*Proc
	API     *mdsclient.Client // as the admin
	Pool    *api.Pool
	// TLSDir holds the CA (with its key) and every process's certificate.
	TLSDir string
	ca     *identity.CA
	// IOTimeout and OpTimeout are given to volumes Open opens (0: the defaults).
	IOTimeout, OpTimeout time.Duration

	prepare func(i int, dir string) // Options.PrepareChunkserver
	proxies *proxyNet               // Options.Proxy; nil without
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary returns the basalt binary the tests run.
func Binary(t testing.TB) string {
	if testing.Short() {
		t.Skip("runs the basalt binary as real processes; skipped with -short")
	}
	if p := os.Getenv("BASALT_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "basalt-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "basalt")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/basalt-storage/basalt/cmd/basalt").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Start starts the MDS and the chunkservers, creates the pool and waits until
// every copyset has a leader. Everything is stopped by t.Cleanup.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd, an MDS and chunkservers as real processes; skipped with -short")
	}
	if opts.Chunkservers == 0 {
		opts.Chunkservers = 3
	}
	if opts.Replicas == 0 {
		opts.Replicas = 3
	}
	if opts.Copysets == 0 {
		opts.Copysets = 8
	}
	if opts.ChunkSize == 0 {
		opts.ChunkSize = 4 << 20
	}
	if opts.MDSCount == 0 {
		opts.MDSCount = 1
	}
	if opts.MDSCount > 1 && len(opts.EtcdEndpoints) == 0 {
		t.Fatal("testcluster: several MDS need Options.EtcdEndpoints")
	}
	c := &Cluster{t: t, Dir: t.TempDir(), Binary: Binary(t), TLSDir: opts.TLSDir, prepare: opts.PrepareChunkserver}
	if opts.Proxy {
		if opts.Net != nil {
			t.Fatal("testcluster: Options.Proxy and Options.Net do not mix")
		}
		c.proxies = newProxyNet()
		t.Cleanup(c.proxies.close) // after stopAll: a chunkserver drains through its peers
	}
	t.Cleanup(c.stopAll)
	if c.TLSDir == "" {
		c.TLSDir = filepath.Join(c.Dir, "tls")
	}
	c.ca = ensureCA(t, c.TLSDir)

	// addr gives the listen address of a process: its namespace's address with
	// a fixed port, or a free loopback port.
	addr := func(ns string, port int) string {
		if opts.Net != nil {
			return fmt.Sprintf("%s:%d", opts.Net.IP(ns), port)
		}
		return testutil.FreeAddr(t)
	}
	var mdsAddrs []string
	for i := 0; i < opts.MDSCount; i++ {
		name := fmt.Sprintf("mds%d", i+1)
		if opts.MDSCount == 1 {
			name = "mds"
		}
		dir := filepath.Join(c.Dir, name)
		ns := fmt.Sprintf("mds%d", i+1)
		a := addr(ns, 6700)
		args := []string{"mds", "--listen", a, "--data-dir", dir,
			"--heartbeat-timeout", "3s", "--session-lease", "6s",
			"--tls-dir", c.TLSDir, "--tls-cert", c.Issue(identity.RoleMDS, name)}
		if len(opts.EtcdEndpoints) > 0 {
			args = append(args, "--etcd-endpoints", strings.Join(opts.EtcdEndpoints, ","))
		} else {
			etcdC, etcdP := testutil.FreePort(t), testutil.FreePort(t)
			if opts.Net != nil {
				etcdC, etcdP = 2379, 2380
			}
			args = append(args, "--etcd-client-url", fmt.Sprintf("https://127.0.0.1:%d", etcdC),
				"--etcd-peer-url", fmt.Sprintf("https://127.0.0.1:%d", etcdP))
		}
		args = append(args, opts.MDSFlags...)
		p := c.newProc(name, dir, args...)
		p.Addr = a
		if opts.Net != nil {
			p.NetNS = opts.Net.NS(ns)
		}
		c.MDSs = append(c.MDSs, p)
		mdsAddrs = append(mdsAddrs, a)
	}
	c.MDS = c.MDSs[0]
	c.MDSAddr = strings.Join(mdsAddrs, ",")
	for _, p := range c.MDSs {
		c.Start(p)
	}

	for i := 0; i < opts.Chunkservers; i++ {
		name := fmt.Sprintf("cs%d", i+1)
		dir := filepath.Join(c.Dir, name)
		a := addr(name, 7000)
		args := []string{"chunkserver", "--data", dir, "--mds", c.MDSAddr,
			"--listen", a, "--tls-dir", c.TLSDir, "--tls-cert", c.Issue(identity.RoleChunkserver, strconv.Itoa(i+1)),
			"--zone", fmt.Sprintf("zone%d", i+1), "--server", fmt.Sprintf("host%d", i+1)}
		if opts.SlowDiskKnob {
			args = append(args, "--fault-slow-disk-file", filepath.Join(c.Dir, name+".slow"))
		}
		args = append(args, opts.ChunkserverFlags...)
		p := c.newProc(name, dir, args...)
		p.Addr = a
		if c.proxies != nil {
			p.Addr = c.proxies.listen(t, p, a)
			p.Args = append(p.Args, "--advertise", p.Addr, "--tcp-only")
		}
		if opts.Net != nil {
			p.NetNS = opts.Net.NS(name)
		}
		if opts.PrepareChunkserver != nil {
			opts.PrepareChunkserver(i, dir)
		}
		c.CS = append(c.CS, p)
		c.Start(p)
	}

	var err error
	c.API, err = mdsclient.Dial(mdsAddrs, c.TLS(identity.RoleAdmin, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	c.Eventually(60*time.Second, "chunkservers online", func(ctx context.Context) error {
		r, err := c.API.ListChunkServers(ctx, &api.ListChunkServersRequest{})
		if err != nil {
			return err
		}
		n := 0
		for _, cs := range r.Chunkservers {
			if cs.Online {
				n++
			}
		}
		if n < opts.Chunkservers {
			return fmt.Errorf("%d/%d online", n, opts.Chunkservers)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, err := c.API.CreatePool(ctx, &api.CreatePoolRequest{Name: "default", Replicas: opts.Replicas,
		ChunkSize: opts.ChunkSize, CopysetCount: opts.Copysets})
	if err != nil {
		t.Fatalf("create pool: %v", err)
	}
	c.Pool = pr.Pool
	c.WaitHealthy(60 * time.Second)
	return c
}

// ensureCA opens the CA in dir, making it first if there is none.
func ensureCA(t testing.TB, dir string) *identity.CA {
	t.Helper()
	if err := identity.EnsureCerts(dir, "test", nil); err != nil {
		t.Fatal(err)
	}
	ca, err := identity.OpenCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// Issue makes sure c.TLSDir holds a certificate for role/name and returns
// its base name (for --tls-cert).
func (c *Cluster) Issue(role identity.Role, name string) string {
	c.t.Helper()
	if err := identity.EnsureCerts(c.TLSDir, "test", []identity.Need{{Role: role, Name: name}}); err != nil {
		c.t.Fatal(err)
	}
	return identity.Base(role, name)
}

// Identity loads role/name's identity from c.TLSDir, issuing it first if needed.
func (c *Cluster) Identity(role identity.Role, name string) *identity.Config {
	c.t.Helper()
	id, err := identity.Load(c.TLSDir, c.Issue(role, name))
	if err != nil {
		c.t.Fatal(err)
	}
	return id
}

// TLS is the TLS configuration role/name dials the MDS with.
func (c *Cluster) TLS(role identity.Role, name string) *tls.Config {
	c.t.Helper()
	return c.Identity(role, name).ClientTLS(identity.RoleMDS)
}

// DataTLS is the TLS configuration role/name dials chunkservers with
// (client.Config.DataTLS).
func (c *Cluster) DataTLS(role identity.Role, name string) *tls.Config {
	c.t.Helper()
	return c.Identity(role, name).ClientTLS(identity.RoleChunkserver)
}

// CA is the cluster's certificate authority (to revoke a certificate).
func (c *Cluster) CA() *identity.CA { return c.ca }

func (c *Cluster) newProc(name, dir string, args ...string) *Proc {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	return &Proc{Name: name, Args: args, DataDir: dir, LogPath: filepath.Join(c.Dir, name+".log")}
}

// Start (re)starts p's process.
func (c *Cluster) Start(p *Proc) {
	c.t.Helper()
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.Binary, p.Args...)
	if p.NetNS != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", p.NetNS, c.Binary}, p.Args...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", p.Name, err)
	}
	reaped := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.reaped, p.last, p.exited = cmd, reaped, cmd, false
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		p.mu.Lock()
		if p.last == cmd {
			p.exited, p.exitCode = true, cmd.ProcessState.ExitCode()
		}
		p.mu.Unlock()
		close(reaped)
	}()
}

// ExitCode returns the exit code of p's last started process and true once
// it has exited (-1 if a signal ended it), or false while it runs.
func (p *Proc) ExitCode() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitCode, p.exited
}

// Kill sends SIGKILL to p and waits until it is gone.
func (c *Cluster) Kill(p *Proc) { c.signalAndWait(p, syscall.SIGKILL) }

// Stop sends SIGTERM to p and waits until it is gone (SIGKILL after 10 s).
func (c *Cluster) Stop(p *Proc) { c.signalAndWait(p, syscall.SIGTERM) }

// Pause stops p with SIGSTOP (a gray failure); Resume continues it.
func (c *Cluster) Pause(p *Proc) {
	if pid := p.PID(); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
}
func (c *Cluster) Resume(p *Proc) {
	if pid := p.PID(); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// PID of the running process (0 if none).
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Exited is closed once p's current process was reaped (every thread of it
// gone, its files and the data directory's lock closed), whoever ended it.
// Nil before Start and after Kill or Stop.
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reaped
}

// signalAndWait sends sig to p's process and returns once the process was
// reaped (not merely a zombie): its pid, ports, files and log are released,
// so a restart cannot race the old process. SIGKILL follows after 10 s; a
// process still not reaped 60 s later fails the test.
func (c *Cluster) signalAndWait(p *Proc, sig syscall.Signal) {
	p.mu.Lock()
	cmd, reaped := p.cmd, p.reaped
	p.cmd, p.reaped = nil, nil
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-reaped:
		return
	case <-time.After(10 * time.Second):
	}
	_ = cmd.Process.Kill()
	select {
	case <-reaped:
	case <-time.After(60 * time.Second):
		c.t.Errorf("%s (pid %d) not reaped 60 s after SIGKILL", p.Name, cmd.Process.Pid)
	}
}

func (c *Cluster) stopAll() {
	if c.API != nil {
		c.API.Close()
	}
	c.Heal() // a chunkserver drains its leaderships to its peers on SIGTERM
	for _, p := range c.CS {
		c.Resume(p) // a paused process ignores SIGTERM until continued
		c.Stop(p)
	}
	for _, p := range c.MDSs {
		c.Resume(p)
		c.Stop(p)
	}
	if c.t.Failed() {
		c.DumpLogs()
	}
}

// DumpLogs prints the tail of every process log into the test output.
func (c *Cluster) DumpLogs() {
	for _, p := range append(slices.Clone(c.MDSs), c.CS...) {
		b, _ := os.ReadFile(p.LogPath)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		c.t.Logf("---- %s log (tail) ----\n%s", p.Name, b)
	}
}

// Eventually retries check until it succeeds or fails the test after timeout.
func (c *Cluster) Eventually(timeout time.Duration, what string, check func(context.Context) error) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := check(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitHealthy waits until every copyset has all members online and a leader.
func (c *Cluster) WaitHealthy(timeout time.Duration) {
	c.t.Helper()
	c.Eventually(timeout, "all copysets healthy", func(ctx context.Context) error {
		r, err := c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		if len(r.Copysets) == 0 || r.CopysetsHealthy != uint32(len(r.Copysets)) {
			return fmt.Errorf("%d/%d copysets healthy, %d degraded, %d unavailable",
				r.CopysetsHealthy, len(r.Copysets), r.CopysetsDegraded, r.CopysetsUnavailable)
		}
		return nil
	})
}

// CreateVolume creates a volume in the cluster's pool.
func (c *Cluster) CreateVolume(name string, size uint64) *api.Volume {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.API.CreateVolume(ctx, &api.CreateVolumeRequest{Name: name, Size: size})
	if err != nil {
		c.t.Fatalf("create volume %s: %v", name, err)
	}
	return r.Volume
}

// Open opens a volume through the client library; it is closed by t.Cleanup.
func (c *Cluster) Open(name string, readOnly bool) *client.Volume {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := c.Identity(identity.RoleClient, "test")
	v, err := client.Open(ctx, client.Config{MDS: strings.Split(c.MDSAddr, ","), MDSTLS: id.ClientTLS(identity.RoleMDS),
		DataTLS: id.ClientTLS(identity.RoleChunkserver),
		Volume:  name, ReadOnly: readOnly, ClientName: c.t.Name(),
		IOTimeout: c.IOTimeout, OpTimeout: c.OpTimeout})
	if err != nil {
		c.t.Fatalf("open volume %s: %v", name, err)
	}
	c.t.Cleanup(func() { v.Close() })
	return v
}

// CountLog counts the lines of p's log that contain s.
func (c *Cluster) CountLog(p *Proc, s string) int {
	b, _ := os.ReadFile(p.LogPath)
	return strings.Count(string(b), s)
}

// LogTimeAfter returns the time stamp (slog's time=) of the first line of p's log
// that contains s and was logged after after: when the process says a thing
// happened, which a poll under load can see seconds later.
func (c *Cluster) LogTimeAfter(p *Proc, s string, after time.Time) (time.Time, bool) {
	b, _ := os.ReadFile(p.LogPath)
	for line := range strings.Lines(string(b)) {
		if !strings.Contains(line, s) {
			continue
		}
		stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err == nil && at.After(after) {
			return at, true
		}
	}
	return time.Time{}, false
}
