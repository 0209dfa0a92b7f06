package testhost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/testhost/wire"
)

// Config describes a guest.
type Config struct {
	// Tools are the programs the guest needs besides busybox, named as on this
	// machine (found on PATH or in /usr/sbin, /sbin): "nbd-client", "mkfs.ext4",
	// "fio". Each comes with its shared libraries and the files it reads.
	// An absolute path names a program of no package (a binary the test
	// built): it lands at the same path in the guest, with its libraries.
	Tools []string
	// Modules are kernel modules loaded at boot, each with the modules it
	// depends on: "nbd", "ext4".
	Modules []string
	// MemoryMiB is the guest's memory (default 1024); the initramfs lives in it.
	MemoryMiB int
	// CPUs is the number of virtual CPUs (default 2), each a host thread.
	CPUs int
	// CacheDir holds the kernel (scripts/fetch-test-kernel puts it in
	// CacheDir/kernel) and the initramfs images. Default: $BASALT_TESTHOST_CACHE,
	// else .cache/testhost in the Go module's root above the working directory.
	CacheDir string
	// Forward are TCP ports of this host's loopback that QEMU forwards to
	// ports of the guest (user-mode networking's hostfwd): a connection to
	// 127.0.0.1:HostPort reaches a server listening on GuestPort in the guest.
	Forward []Forward
	// Logf, when set, gets a line when the guest is up and when it is down.
	Logf func(format string, args ...any)
}

// Forward is one forwarded port: 127.0.0.1:HostPort on this host to the
// guest's GuestPort. QEMU listens on HostPort from the start (it must be
// free); a connection made before a guest server listens is accepted and
// then closed.
type Forward struct {
	HostPort, GuestPort int
}

// ErrUnavailable means this machine lacks something a test host needs: QEMU,
// the kernel, or a tool the Config names. The error says what and how to get
// it; tests skip on it (Start does).
var ErrUnavailable = errors.New("testhost: cannot run a test host here")

// Stats describe one boot.
type Stats struct {
	Kernel          string        // release, e.g. 6.1.0-56-amd64
	Ready           time.Duration // QEMU started → agent ready, on the host's clock
	GuestUptime     time.Duration // kernel started → agent ready, on the guest's clock
	InitramfsBytes  int64
	InitramfsCached bool // the image came from the cache instead of being built
}

// Host is a running guest. Two goroutines serve it: readLoop alone reads conn
// and hands each Result to its Run call; a waiter sets waitErr when QEMU exits
// and closes exited.
type Host struct {
	cfg     Config
	stats   Stats
	dir     string // holds the channel's socket
	qemu    *exec.Cmd
	console *consoleLog
	exited  chan struct{} // closed once QEMU has exited; waitErr is then set
	waitErr error
	conn    net.Conn
	ready   chan wire.Frame

	writeMu sync.Mutex // one frame at a time on conn

	mu      sync.Mutex // guards the three fields below
	nextID  uint32
	waiting map[uint32]chan wire.Frame // Run calls waiting for their Result, by id
	readErr error                      // why the channel stopped, set before done closes

	done chan struct{} // closed when the channel stopped

	closeOnce    sync.Once
	shutdownOnce sync.Once
	shutdownErr  error
}

// Boot starts QEMU with Debian's kernel and an initramfs holding cfg's tools
// and modules, and returns once the guest's agent takes commands.
func Boot(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = 1024
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = 2
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.CacheDir == "" {
		dir, err := defaultCacheDir()
		if err != nil {
			return nil, err
		}
		cfg.CacheDir = dir
	}
	var missing []string
	qemu := lookTool("qemu-system-x86_64")
	if qemu == "" {
		missing = append(missing, "qemu-system-x86_64 (Debian package qemu-system-x86)")
	}
	k, noKernel, err := findKernel(cfg.CacheDir)
	if err != nil {
		return nil, err
	}
	missing = append(missing, noKernel...)
	var im *image
	if k != nil {
		agent, err := buildAgent(cfg.CacheDir)
		if err != nil {
			return nil, err
		}
		var noTools []string
		if im, noTools, err = assemble(cfg, k, agent); err != nil {
			return nil, err
		}
		missing = append(missing, noTools...)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: missing %s; scripts/install-deps installs them", ErrUnavailable, strings.Join(missing, ", "))
	}
	initramfs, hit, err := im.cached(filepath.Join(cfg.CacheDir, "initramfs"))
	if err != nil {
		return nil, fmt.Errorf("testhost: building the initramfs: %w", err)
	}
	fi, err := os.Stat(initramfs)
	if err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "testhost-") // short: a socket path has at most 107 bytes
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer ln.Close() // QEMU connects once; nothing else may
	h := &Host{
		cfg:     cfg,
		stats:   Stats{Kernel: k.release, InitramfsBytes: fi.Size(), InitramfsCached: hit},
		dir:     dir,
		console: &consoleLog{},
		exited:  make(chan struct{}),
		ready:   make(chan wire.Frame, 1),
		waiting: map[uint32]chan wire.Frame{},
		done:    make(chan struct{}),
	}
	h.qemu = exec.Command(qemu, qemuArgs(cfg, k, initramfs, sock)...)
	h.qemu.Stdout, h.qemu.Stderr = h.console, h.console
	h.qemu.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test
	start := time.Now()
	if err := h.qemu.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("testhost: starting QEMU: %w", err)
	}
	go func() {
		h.waitErr = h.qemu.Wait()
		close(h.exited)
	}()
	if err := h.connect(ctx, ln); err != nil {
		h.Close()
		return nil, err
	}
	go h.readLoop()
	select {
	case f := <-h.ready:
		h.stats.Ready = time.Since(start)
		if s, err := strconv.ParseFloat(string(f.Payload), 64); err == nil {
			h.stats.GuestUptime = time.Duration(s * float64(time.Second))
		}
	case <-h.done:
		err := h.channelErr()
		h.Close()
		return nil, err
	case <-ctx.Done():
		h.Close()
		return nil, fmt.Errorf("testhost: the guest did not come up: %w; console (tail):\n%s", ctx.Err(), h.console.tail(40))
	}
	how := "built"
	if hit {
		how = "cached"
	}
	cfg.Logf("testhost: kernel %s up in %s (guest uptime %s), initramfs %.1f MiB (%s)",
		k.release, h.stats.Ready.Round(time.Millisecond), h.stats.GuestUptime.Round(10*time.Millisecond),
		float64(fi.Size())/(1<<20), how)
	return h, nil
}

func qemuArgs(cfg Config, k *kernel, initramfs, sock string) []string {
	return []string{
		"-nodefaults", "-no-user-config", "-display", "none",
		"-no-reboot",                 // with panic=-1 a kernel panic ends QEMU instead of looping
		"-accel", "tcg,thread=multi", // a nested KVM guest hangs on these machines
		"-m", strconv.Itoa(cfg.MemoryMiB), "-smp", strconv.Itoa(cfg.CPUs),
		"-kernel", k.vmlinuz, "-initrd", initramfs, "-cpu", "max",
		// no_timer_check: under TCG on a loaded host the kernel's check that
		// the timer interrupt reaches the IO-APIC can time out and panic
		// ("IO-APIC + timer doesn't work!"), seen at load 20; QEMU's timer
		// is wired correctly, so the check only costs boots.
		"-append", "console=ttyS0 panic=-1 rdinit=/init no_timer_check",
		"-serial", "stdio", // the console: output only, so the 16550's small input FIFO does not matter
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=agent,path=" + sock,
		"-device", "virtserialport,chardev=agent,name=" + wire.PortName,
		"-netdev", netdev(cfg.Forward), // the guest reaches the host's loopback as 10.0.2.2
		"-device", "virtio-net-pci,netdev=net0",
	}
}

// netdev is the user-mode network, with the ports fw forwards to the guest.
func netdev(fw []Forward) string {
	s := "user,id=net0"
	for _, f := range fw {
		s += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", f.HostPort, f.GuestPort)
	}
	return s
}

// connect takes QEMU's connection to the command channel's socket.
func (h *Host) connect(ctx context.Context, ln net.Listener) error {
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			return fmt.Errorf("testhost: accepting QEMU's channel connection: %w", a.err)
		}
		h.conn = a.c
		return nil
	case <-h.exited:
		return fmt.Errorf("testhost: QEMU exited at start (%v):\n%s", h.waitErr, h.console.tail(40))
	case <-ctx.Done():
		return fmt.Errorf("testhost: QEMU did not connect to the command channel: %w", ctx.Err())
	}
}

// readLoop owns reading the channel: it hands each Result to its Run call.
func (h *Host) readLoop() {
	for {
		f, err := wire.Read(h.conn)
		if err != nil {
			h.mu.Lock()
			h.readErr = err
			h.mu.Unlock()
			close(h.done)
			return
		}
		switch f.Kind {
		case wire.Ready:
			select {
			case h.ready <- f:
			default:
			}
		case wire.Result:
			h.mu.Lock()
			ch := h.waiting[f.ID]
			delete(h.waiting, f.ID)
			h.mu.Unlock()
			if ch != nil {
				ch <- f
			}
		}
	}
}

func (h *Host) send(f wire.Frame) error {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	return wire.Write(h.conn, f)
}

// channelErr says why the channel stopped, with the end of the console.
func (h *Host) channelErr() error {
	h.mu.Lock()
	err := h.readErr
	h.mu.Unlock()
	select {
	case <-h.exited:
		return fmt.Errorf("testhost: the guest is gone (QEMU exited: %v; channel: %v); console (tail):\n%s", h.waitErr, err, h.console.tail(40))
	case <-time.After(2 * time.Second): // give QEMU a moment to finish its exit
	}
	return fmt.Errorf("testhost: the command channel stopped: %v; console (tail):\n%s", err, h.console.tail(40))
}

// ExitError is a guest command that ran and exited with a status other than 0.
type ExitError struct {
	Script string
	Status int    // as the shell reports it: 128+N for a command killed by signal N
	Output string // combined stdout and stderr
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("guest command %q exited with status %d:\n%s", e.Script, e.Status, lastLines(e.Output, 40))
}

// Run runs script with /bin/sh -c in the guest (as root, in /) and returns its
// combined output. A status other than 0 is an *ExitError carrying the output
// too. When ctx ends first, the command's process group is killed. Run may be
// called from several goroutines; the commands run concurrently.
func (h *Host) Run(ctx context.Context, script string) (string, error) {
	ch := make(chan wire.Frame, 1)
	h.mu.Lock()
	h.nextID++
	id := h.nextID
	h.waiting[id] = ch
	h.mu.Unlock()
	if err := h.send(wire.Frame{Kind: wire.Run, ID: id, Payload: []byte(script)}); err != nil {
		return "", fmt.Errorf("testhost: sending a command: %w", err)
	}
	select {
	case f := <-ch:
		return result(script, f)
	case <-h.done:
		return "", h.channelErr()
	case <-ctx.Done():
	}
	_ = h.send(wire.Frame{Kind: wire.Cancel, ID: id})
	select {
	case f := <-ch:
		out, _ := result(script, f)
		return out, fmt.Errorf("guest command %q killed: %w", script, ctx.Err())
	case <-h.done:
		return "", h.channelErr()
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("guest command %q did not end 30 s after it was killed (%v)", script, ctx.Err())
	}
}

func result(script string, f wire.Frame) (string, error) {
	status, out, err := wire.ParseResult(f.Payload)
	if err != nil {
		return "", err
	}
	if status != 0 {
		return string(out), &ExitError{Script: script, Status: int(status), Output: string(out)}
	}
	return string(out), nil
}

// Stats describes the boot.
func (h *Host) Stats() Stats { return h.stats }

// Console returns the guest's console so far (its last MiB): kernel messages
// and what /init printed.
func (h *Host) Console() string { return h.console.String() }

// Shutdown asks the guest to power off and waits for QEMU to exit. The guest
// syncs and unmounts first. An error means the power-off was not clean (QEMU
// is killed then). Shutdown also does what Close does; calling it again
// returns the first call's result.
func (h *Host) Shutdown(ctx context.Context) error {
	h.shutdownOnce.Do(func() {
		h.shutdownErr = h.shutdown(ctx)
		h.Close()
	})
	return h.shutdownErr
}

func (h *Host) shutdown(ctx context.Context) error {
	select {
	case <-h.exited:
		return fmt.Errorf("testhost: QEMU had exited before the shutdown (%v); console (tail):\n%s", h.waitErr, h.console.tail(40))
	default:
	}
	if err := h.send(wire.Frame{Kind: wire.Poweroff}); err != nil {
		return fmt.Errorf("testhost: asking the guest to power off: %w", err)
	}
	start := time.Now()
	select {
	case <-h.exited:
	case <-ctx.Done():
		return fmt.Errorf("testhost: the guest did not power off: %w; console (tail):\n%s", ctx.Err(), h.console.tail(40))
	}
	if h.waitErr != nil || !strings.Contains(h.console.String(), "reboot: Power down") {
		return fmt.Errorf("testhost: QEMU exited (%v) without the guest powering off; console (tail):\n%s", h.waitErr, h.console.tail(40))
	}
	h.cfg.Logf("testhost: guest powered off in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

// Close kills QEMU if it still runs and removes the host's temporary files.
func (h *Host) Close() {
	h.closeOnce.Do(func() {
		_ = h.qemu.Process.Kill()
		<-h.exited
		if h.conn != nil {
			h.conn.Close()
		}
		os.RemoveAll(h.dir)
	})
}

// consoleLog keeps the last consoleKeep bytes QEMU printed.
type consoleLog struct {
	mu  sync.Mutex
	buf []byte
}

const consoleKeep = 1 << 20

func (c *consoleLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	if len(c.buf) > 2*consoleKeep {
		c.buf = append([]byte(nil), c.buf[len(c.buf)-consoleKeep:]...)
	}
	return len(p), nil
}

func (c *consoleLog) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.buf) > consoleKeep {
		return string(c.buf[len(c.buf)-consoleKeep:])
	}
	return string(c.buf)
}

func (c *consoleLog) tail(n int) string { return lastLines(c.String(), n) }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"[...]"}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
