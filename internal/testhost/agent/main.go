package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/basalt-storage/basalt/internal/testhost/wire"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("testhost-agent: ")
	port, err := openPort(wire.PortName, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	a := &agent{port: port, running: map[uint32]*os.Process{}}
	if err := a.send(wire.Frame{Kind: wire.Ready, Payload: uptime()}); err != nil {
		log.Fatalf("saying ready: %v", err)
	}
	for {
		f, err := wire.Read(port)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				log.Printf("command channel: %v", err)
			}
			return
		}
		switch f.Kind {
		case wire.Run:
			go a.run(f.ID, string(f.Payload))
		case wire.Cancel:
			a.cancel(f.ID)
		case wire.Poweroff:
			return
		default:
			log.Printf("ignoring a frame of unknown kind %d", f.Kind)
		}
	}
}

type agent struct {
	writeMu sync.Mutex // one frame at a time on the port
	port    *os.File

	mu      sync.Mutex
	running map[uint32]*os.Process // by command id
}

func (a *agent) send(f wire.Frame) error {
	a.writeMu.Lock()
	defer a.writeMu.Unlock()
	return wire.Write(a.port, f)
}

// run runs one command and sends its Result. Output goes to a file, not a pipe,
// so a daemon the command starts (and that keeps the descriptor) cannot hold the
// result back.
func (a *agent) run(id uint32, script string) {
	status, output := a.execute(id, script)
	if len(output) > wire.MaxPayload-4 {
		output = append(output[:wire.MaxPayload-4-64], "\n[testhost-agent: output cut]\n"...)
	}
	if err := a.send(wire.Frame{Kind: wire.Result, ID: id, Payload: wire.ResultPayload(status, output)}); err != nil {
		log.Printf("sending the result of command %d: %v", id, err)
	}
}

func (a *agent) execute(id uint32, script string) (status int32, output []byte) {
	out, err := os.CreateTemp("", "testhost-cmd-*")
	if err != nil {
		return 127, []byte(fmt.Sprintf("testhost-agent: %v\n", err))
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 127, []byte(fmt.Sprintf("testhost-agent: %v\n", err))
	}
	a.mu.Lock()
	a.running[id] = cmd.Process
	a.mu.Unlock()
	_ = cmd.Wait() // the status is read from ProcessState below
	a.mu.Lock()
	delete(a.running, id)
	a.mu.Unlock()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	status = int32(ws.ExitStatus())
	if ws.Signaled() {
		status = 128 + int32(ws.Signal()) // as a shell reports it
	}
	output, err = os.ReadFile(out.Name())
	if err != nil {
		output = []byte(fmt.Sprintf("testhost-agent: reading the output: %v\n", err))
	}
	return status, output
}

// cancel kills the process group of a running command; its Result follows.
func (a *agent) cancel(id uint32) {
	a.mu.Lock()
	p := a.running[id]
	a.mu.Unlock()
	if p != nil {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
}

// openPort finds the virtio-serial port by name in sysfs; its device node appears
// shortly after virtio_console binds, so this waits up to timeout.
func openPort(name string, timeout time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil || strings.TrimSpace(string(b)) != name {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(n))
			if f, err := os.OpenFile(dev, os.O_RDWR, 0); err == nil {
				return f, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no virtio-serial port named %s after %s (is virtio_console loaded? ports: %v)", name, timeout, names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func uptime() []byte {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return nil
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return nil
	}
	return []byte(f[0])
}
