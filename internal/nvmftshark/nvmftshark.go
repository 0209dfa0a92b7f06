// Package nvmftshark judges captured NVMe/TCP traffic with tshark's
// dissector, for tests: dumpcap records one TCP port on the loopback
// interface (where a QEMU guest's connections to 10.0.2.2 arrive, through
// its user-mode network), and tshark must decode every PDU of it without a
// malformed packet or an error, with both digests checked.
package nvmftshark

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Capture is dumpcap recording one TCP port on the loopback interface.
type Capture struct {
	port   string
	file   string
	cmd    *exec.Cmd
	exited chan struct{}
	stderr *syncBuffer
	probes int // connections made to see the capture start, each closed at once
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Start starts dumpcap on lo for addr's port and waits until it captures;
// nil (logged) when tshark or dumpcap is missing or cannot capture.
func Start(t testing.TB, addr string) *Capture {
	t.Helper()
	for _, tool := range []string{"tshark", "dumpcap"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Logf("%s not installed (scripts/install-deps installs the tshark package): no capture", tool)
			return nil
		}
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &Capture{port: port, file: filepath.Join(t.TempDir(), "nvme-tcp.pcapng"), exited: make(chan struct{}), stderr: &syncBuffer{}}
	// A 256 MiB kernel buffer: with the default 2 MiB, a loaded machine
	// that keeps dumpcap off the CPU loses packets of the larger writes.
	c.cmd = exec.Command("dumpcap", "-i", "lo", "-B", "256", "-f", "tcp port "+port, "-w", c.file)
	c.cmd.Stdout, c.cmd.Stderr = c.stderr, c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		t.Logf("dumpcap: %v: no capture", err)
		return nil
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(c.stop)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(c.stderr.String(), "Capturing on") {
		select {
		case <-c.exited:
			t.Logf("dumpcap could not capture on lo (it needs root or CAP_NET_RAW): %s", lastLines(c.stderr.String(), 5))
			return nil
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dumpcap did not start capturing in 60 s: %s", lastLines(c.stderr.String(), 5))
		}
	}
	// "Capturing on" comes before the filter sees packets: probe with
	// connections until the capture holds one's SYN.
	for {
		if nc, err := net.Dial("tcp", addr); err == nil {
			nc.Close()
			c.probes++
		}
		out, _ := c.try("tcp.flags.syn==1 && tcp.flags.ack==0", "-T", "fields", "-e", "frame.number")
		if strings.Count(out, "\n") > 0 {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("dumpcap captured none of %d probe connections in 60 s: %s", c.probes, lastLines(c.stderr.String(), 5))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Capture) stop() {
	_ = syscall.Kill(c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.exited
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// tshark runs tshark on the capture, decoding the port as NVMe/TCP with
// both digests checked, with display filter filter and extra arguments.
func (c *Capture) tshark(t testing.TB, filter string, extra ...string) string {
	t.Helper()
	out, err := c.try(filter, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (c *Capture) try(filter string, extra ...string) (string, error) {
	args := append([]string{"-r", c.file, "-d", "tcp.port==" + c.port + ",nvme-tcp",
		"-o", "nvme-tcp.check_hdgst:TRUE", "-o", "nvme-tcp.check_ddgst:TRUE", "-Y", filter}, extra...)
	var stderr bytes.Buffer
	cmd := exec.Command("tshark", args...)
	cmd.Stderr = &stderr // "Running as user root..."
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("tshark %s: %v: %s", strings.Join(args, " "), err, lastLines(stderr.String(), 20))
	}
	return string(out), nil
}

// PDUCounts counts the NVMe/TCP PDUs of each type tshark decodes.
func (c *Capture) PDUCounts(t testing.TB) map[int]int {
	n := map[int]int{}
	for _, line := range strings.Split(c.tshark(t, "nvme-tcp", "-T", "fields", "-e", "nvme-tcp.type"), "\n") {
		for _, f := range strings.Split(strings.TrimSpace(line), ",") {
			if v, err := strconv.ParseInt(f, 0, 32); err == nil {
				n[int(v)]++
			}
		}
	}
	return n
}

// Count returns how many packets of the capture match the display filter;
// call it after Check, which ends the capture.
func (c *Capture) Count(t testing.TB, filter string) int {
	t.Helper()
	return strings.Count(c.tshark(t, filter, "-T", "fields", "-e", "frame.number"), "\n")
}

// PDU types (NVMe/TCP 3.3), for Want.
const (
	ICReq      = 0x00
	ICResp     = 0x01
	H2CTermReq = 0x02
	C2HTermReq = 0x03
	CapsuleCmd = 0x04
	CapsuleRsp = 0x05
	H2CData    = 0x06
	C2HData    = 0x07
	R2T        = 0x09
)

// Want is what Check requires of a capture besides no malformed PDU and no
// error: at least so many PDUs of each type, and good digests.
type Want struct {
	PDUs    map[int]int
	Digests bool // header and data digests, each checked good by tshark somewhere
}

// Check waits until the capture holds the end of every connection (at least
// conns of them, all ended), stops it, and requires tshark to find no
// malformed PDU and no error, and what want names. It returns the PDU counts.
func (c *Capture) Check(t testing.TB, conns int, want Want) map[int]int {
	t.Helper()
	// The end of every connection (the sessions' and the captured probes'),
	// both FINs or a reset, is the last the sessions caused.
	deadline := time.Now().Add(60 * time.Second)
	for {
		// While dumpcap writes, tshark may find the file cut short: try again.
		out, err := c.try("(tcp.flags.syn==1 && tcp.flags.ack==0) || tcp.flags.fin==1 || tcp.flags.reset==1",
			"-T", "fields", "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.flags.syn", "-e", "tcp.flags.fin", "-e", "tcp.flags.reset")
		open, ended := streamEnds(out)
		if err == nil && open+ended > conns && open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("capture: %d connections not ended and %d ended after 60 s, want %d sessions' connections, all ended (%v): %s",
				open, ended, conns, err, lastLines(c.stderr.String(), 5))
		}
		time.Sleep(500 * time.Millisecond)
	}
	c.stop()
	if bad := strings.TrimSpace(c.tshark(t, "_ws.malformed || _ws.expert.severity == error")); bad != "" {
		t.Fatalf("tshark finds malformed PDUs or errors:\n%s", lastLines(bad, 30))
	}
	if want.Digests {
		// The digest sessions' digests are there and good (tshark checks them).
		if d := strings.Count(c.tshark(t, "nvme-tcp.ddgst.status == 1", "-T", "fields", "-e", "frame.number"), "\n"); d == 0 {
			t.Error("tshark finds no PDU with a good data digest")
		}
		if d := strings.Count(c.tshark(t, "nvme-tcp.hdgst.status == 1", "-T", "fields", "-e", "frame.number"), "\n"); d == 0 {
			t.Error("tshark finds no PDU with a good header digest")
		}
	}
	n := c.PDUCounts(t)
	t.Logf("tshark decoded NVMe/TCP PDUs by type: %v", n)
	for typ, min := range want.PDUs {
		if n[typ] < min {
			t.Errorf("tshark decoded %d PDUs of type %#x, want at least %d (all: %v)", n[typ], typ, min, n)
		}
	}
	return n
}

// streamEnds reads tshark's fields (stream, source port, SYN, FIN, RST) of
// the SYN, FIN and RST packets and counts the connections seen starting that
// have not ended (a FIN from each side, or a reset) and those that have.
func streamEnds(fields string) (open, ended int) {
	type st struct {
		syn, rst bool
		fins     map[string]bool
	}
	streams := map[string]*st{}
	for _, line := range strings.Split(fields, "\n") {
		f := strings.Split(line, "\t")
		if len(f) < 5 {
			continue
		}
		s := streams[f[0]]
		if s == nil {
			s = &st{fins: map[string]bool{}}
			streams[f[0]] = s
		}
		set := func(v string) bool { return v == "1" || v == "True" }
		s.syn = s.syn || set(f[2])
		s.rst = s.rst || set(f[4])
		if set(f[3]) {
			s.fins[f[1]] = true
		}
	}
	for _, s := range streams {
		switch {
		case !s.syn:
		case s.rst || len(s.fins) == 2:
			ended++
		default:
			open++
		}
	}
	return open, ended
}
