package e2e

import (
	"context"
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/playground"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// pg is a running `basalt playground` process.
type pg struct {
	t        *testing.T
	dir      string
	portBase int
	nbdPort  int
	size     string
	cmd      *exec.Cmd
	exited   chan struct{} // closed once cmd was waited for
	logPath  string
	st       *playground.State
	extra    []string // more playground flags
}

// startPlayground runs a playground in a fresh directory on free ports.
func startPlayground(t *testing.T, size string, extra ...string) *pg {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a playground of real processes; skipped with -short")
	}
	p := &pg{t: t, dir: t.TempDir(), size: size, portBase: testutil.FreePortBase(t, 30), extra: extra}
	p.nbdPort = p.portBase + 29
	p.logPath = filepath.Join(p.dir, "playground.log")
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *pg) start() {
	t := p.t
	t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(testcluster.Binary(t), "playground", "--dir", p.dir, "--size", p.size,
		"--port-base", strconv.Itoa(p.portBase), "--nbd-listen", "127.0.0.1:"+strconv.Itoa(p.nbdPort),
		"--copysets", "12")
	p.cmd.Args = append(p.cmd.Args, p.extra...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); logf.Close(); close(exited) }(p.cmd, p.exited)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p.st, err = playground.WaitReady(ctx, p.dir)
	if err != nil {
		p.dumpLogs()
		t.Fatalf("playground did not become ready: %v", err)
	}
}

// stop sends SIGINT (Ctrl-C) and waits for a clean exit.
func (p *pg) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	// Waits on the goroutine that reaps it (reading ProcessState meanwhile
	// would race with Wait).
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		p.t.Errorf("playground did not stop within 60 s of Ctrl-C")
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
	if p.t.Failed() {
		p.dumpLogs()
	}
}

// restart stops the playground (Ctrl-C) and runs it again on the same directory.
func (p *pg) restart() {
	p.stop()
	p.start()
}

func (p *pg) dumpLogs() {
	files, _ := filepath.Glob(filepath.Join(p.dir, "*.log"))
	more, _ := filepath.Glob(filepath.Join(p.dir, "cs*", "*.log"))
	for _, f := range append(files, more...) {
		b, _ := os.ReadFile(f)
		if len(b) > 5000 {
			b = b[len(b)-5000:]
		}
		p.t.Logf("---- %s (tail) ----\n%s", f, b)
	}
}

func (p *pg) unixURI() string { return p.st.NBDUnixURI }
func (p *pg) tcpURI() string  { return p.st.NBDURI }

// run runs a command, failing the test with its output if it fails.
func run(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// fio runs one fio job against uri and fails the test on any IO or verify error.
func fio(t *testing.T, uri string, args ...string) string {
	t.Helper()
	// No verify state files: they would land in the working directory.
	base := []string{"--ioengine=nbd", "--uri=" + uri, "--output-format=normal", "--verify_state_save=0"}
	out := run(t, 10*time.Minute, "fio", append(base, args...)...)
	if strings.Contains(out, "verify: bad") || strings.Contains(out, "err=") && !strings.Contains(out, "err= 0") {
		t.Fatalf("fio reported errors:\n%s", out)
	}
	return out
}

func logf(t *testing.T, format string, args ...any) { t.Helper(); t.Logf(format, args...) }

func (p *pg) status() *api.ClusterStatusResponse {
	p.t.Helper()
	mc, err := mdsclient.Dial([]string{p.st.MDS}, adminTLS(p.t, p.st.TLSDir))
	if err != nil {
		p.t.Fatal(err)
	}
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := mc.ClusterStatus(ctx, &api.ClusterStatusRequest{})
	if err != nil {
		p.t.Fatal(err)
	}
	return r
}

// busiestLeader returns the chunkserver that leads the most copysets.
func (p *pg) busiestLeader() playground.ChunkserverState {
	r := p.status()
	byAddr := map[string]uint64{}
	for _, cs := range r.Chunkservers {
		byAddr[cs.Addr] = cs.Id
	}
	best, bestN := p.st.Chunkservers[0], uint32(0)
	for _, cs := range p.st.Chunkservers {
		if n := r.LeadersPerChunkserver[byAddr[cs.Addr]]; n > bestN {
			best, bestN = cs, n
		}
	}
	return best
}

func (p *pg) waitHealthy(timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := p.status()
		if len(r.Copysets) > 0 && r.CopysetsHealthy == uint32(len(r.Copysets)) {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("cluster not healthy after %s: %d/%d copysets healthy", timeout, r.CopysetsHealthy, len(r.Copysets))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestPlaygroundReportsChunkserverFailure: a chunkserver that cannot start (here:
// its WAL has a segment format this build refuses) makes the playground exit at
// once with the chunkserver's own error, instead of waiting for it to register.
func TestPlaygroundReportsChunkserverFailure(t *testing.T) {
	p := startPlayground(t, "1GiB")
	p.stop()
	seg := filepath.Join(p.dir, "cs1", "wal", "0000000000000001.wal")
	f, err := os.OpenFile(seg, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{1, 0, 0, 0}, 4); err != nil { // version u32 = 1
		t.Fatal(err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, testcluster.Binary(t), "playground", "--dir", p.dir, "--size", p.size,
		"--port-base", strconv.Itoa(p.portBase), "--nbd-listen", "127.0.0.1:"+strconv.Itoa(p.nbdPort)).CombinedOutput()
	took := time.Since(start)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("playground with a broken chunkserver: err %v after %s, want a failed exit\n%s", err, took, tail(string(out), 3000))
	}
	for _, want := range []string{"chunkserver 1 exited", "segment format version 1", "cs1/chunkserver.log"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, tail(string(out), 3000))
		}
	}
	logf(t, "playground exited after %s: %s", took.Round(time.Millisecond), tail(string(out), 300))
}

// adminTLS is the playground's admin identity, for calls to its MDS.
func adminTLS(t *testing.T, dir string) *tls.Config {
	t.Helper()
	id, err := identity.Load(dir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	return id.ClientTLS(identity.RoleMDS)
}

// adminDataTLS is the playground's admin identity toward chunkservers.
func adminDataTLS(t *testing.T, dir string) *tls.Config {
	t.Helper()
	id, err := identity.Load(dir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	return id.ClientTLS(identity.RoleChunkserver)
}
