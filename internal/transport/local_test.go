package transport

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// addrRecorder answers every request and remembers the connections' remote
// addresses as the server saw them.
type addrRecorder struct {
	mu      sync.Mutex
	remotes []net.Addr
}

func (a *addrRecorder) ServeFrame(rw ReplyWriter, h api.Header, _ []byte) {
	a.mu.Lock()
	a.remotes = append(a.remotes, rw.RemoteAddr())
	a.mu.Unlock()
	rw.Reply(h, nil, nil)
}

func (a *addrRecorder) last() net.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.remotes[len(a.remotes)-1]
}

// ping sends one request on a new connection to addr and returns that
// connection's network as the client sees it.
func ping(t *testing.T, addr string) string {
	t.Helper()
	c := dial(t, addr)
	if err := c.Do(t.Context(), &Call{Header: api.Header{Op: api.OpPing}}); err != nil {
		t.Fatal(err)
	}
	return c.RemoteAddr().Network()
}

// TestSameHostSocket: a client on the server's host reaches it through the
// abstract Unix socket named after its TCP address while that socket is open,
// and over TCP before and after.
func TestSameHostSocket(t *testing.T) {
	rec := &addrRecorder{}
	srv, addr := startServer(t, ServerConfig{}, rec)
	if got := ping(t, addr); got != "tcp" {
		t.Fatalf("no same-host socket yet: dialled over %s, want tcp", got)
	}

	ln, err := ListenLocal(addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ListenLocal(addr); err == nil {
		t.Fatal("a second ListenLocal of the same address succeeded; want EADDRINUSE")
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	if got := ping(t, addr); got != "unix" {
		t.Fatalf("dialled over %s with the same-host socket open, want unix", got)
	}
	first := rec.last().String()
	ping(t, addr)
	if second := rec.last().String(); first == second || !strings.HasPrefix(first, "local#") {
		t.Fatalf("same-host connections seen as %q and %q, want two distinct local#N", first, second)
	}

	ln.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Serve after the listener closed: %v", err)
	}
	if got := ping(t, addr); got != "tcp" {
		t.Fatalf("dialled over %s after the same-host socket closed, want tcp", got)
	}
}

// TestSameHostPipelining runs the pipelining test over the same-host socket,
// with payloads larger than a Unix socket's send buffer, so that inline writes
// are cut short and the writer goroutines finish them.
func TestSameHostPipelining(t *testing.T) {
	srv, addr := startServer(t, ServerConfig{}, echoHandler(2, time.Millisecond))
	ln, err := ListenLocal(addr)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	c := dial(t, addr)
	if c.RemoteAddr().Network() != "unix" {
		t.Fatalf("dialled over %s, want unix", c.RemoteAddr().Network())
	}
	pipelineOutOfOrder(t, c, 8192, 50)
	pipelineOutOfOrder(t, c, 1<<20, 4)
}

// TestSameHostSocketOfAnotherUser: a same-host socket whose listener runs as
// another user (one that took a chunkserver's name first) is passed over, and
// the client connects over TCP.
func TestSameHostSocketOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the squatting listener as another user")
	}
	_, addr := startServer(t, ServerConfig{}, &addrRecorder{})
	// The test binary's directory is private to root: run a copy another user can.
	dir, err := os.MkdirTemp("", "basalt-squatter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(dir, "squatter")
	if err := os.WriteFile(helper, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(helper, "-test.run=^TestHelperSquatter$")
	cmd.Env = append(os.Environ(), "BASALT_SQUAT_ADDR="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
		Pdeathsig:  syscall.SIGKILL, // never left holding the name
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		t.Skipf("cannot run the squatting listener as uid 65534 (a user namespace without it, or a noexec %s): %v", os.TempDir(), err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("squatting listener did not start: %q, %v", line, err)
	}
	if got := ping(t, addr); got != "tcp" {
		t.Fatalf("dialled over %s while another user's process held the same-host socket, want tcp", got)
	}
}

// TestHelperSquatter is TestSameHostSocketOfAnotherUser's listener process.
func TestHelperSquatter(t *testing.T) {
	addr := os.Getenv("BASALT_SQUAT_ADDR")
	if addr == "" {
		t.Skip("helper process of TestSameHostSocketOfAnotherUser")
	}
	ln, err := ListenLocal(addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("listening")
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		nc.Close() // a client that took this for its server fails at once
	}
}
