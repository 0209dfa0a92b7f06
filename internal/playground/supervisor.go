package playground

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

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
