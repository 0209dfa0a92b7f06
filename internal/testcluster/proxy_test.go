package testcluster

import (
	"io"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// echoServer accepts connections and echoes what it reads; it is closed by
// t.Cleanup.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes b on c and reads it back within d, reporting whether it did.
func roundTrip(t *testing.T, c net.Conn, b byte, d time.Duration) bool {
	t.Helper()
	if _, err := c.Write([]byte{b}); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	got := make([]byte, 1)
	_, err := io.ReadFull(c, got)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return false
	}
	if got[0] != b {
		t.Fatalf("read %q, want %q", got[0], b)
	}
	return true
}

// TestProxyIsolate: Isolate(p) holds the bytes of connections to p's proxy
// and of connections p's process dialed to other proxies (found by its
// source socket), and of connections opened while it lasts; Heal lets them
// through, in order; the rest of the network is untouched.
func TestProxyIsolate(t *testing.T) {
	n := newProxyNet()
	t.Cleanup(n.close)
	c := &Cluster{t: t, proxies: n}
	self, err := os.FindProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// a is "this process" (the dialer of every connection below), b and d
	// are two chunkservers behind proxies.
	a := &Proc{Name: "a", cmd: &exec.Cmd{Process: self}}
	b, d := &Proc{Name: "b"}, &Proc{Name: "d"}
	n.listen(t, a, echoServer(t))
	toB := n.listen(t, b, echoServer(t))
	toD := n.listen(t, d, echoServer(t))
	dial := func(addr string) net.Conn {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	cb, cd := dial(toB), dial(toD)
	for _, conn := range []net.Conn{cb, cd} {
		if !roundTrip(t, conn, 'x', 30*time.Second) {
			t.Fatal("no echo through the proxy before any isolation")
		}
	}

	// b isolated: its connection hangs, d's does not.
	c.Isolate(b)
	if roundTrip(t, cb, '1', 300*time.Millisecond) {
		t.Error("a byte to an isolated chunkserver came back")
	}
	if !roundTrip(t, cd, 'y', 30*time.Second) {
		t.Error("the isolation of b stopped a connection to d")
	}
	late := dial(toB) // opened during the isolation: hangs too
	if roundTrip(t, late, 'L', 300*time.Millisecond) {
		t.Error("a connection opened to an isolated chunkserver went through")
	}
	c.Heal()
	for _, x := range []struct {
		conn net.Conn
		b    byte
	}{{cb, '1'}, {late, 'L'}} { // the held bytes arrive after the heal
		got := make([]byte, 1)
		_ = x.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(x.conn, got); err != nil || got[0] != x.b {
			t.Errorf("after the heal: %q, %v; want the held %q", got, err, x.b)
		}
	}

	// a (this process) isolated: what it dialed to b and d hangs both ways.
	in, out := c.Isolate(a)
	if in != 0 || out != 3 {
		t.Errorf("Isolate(a) cut %d connections to a and %d from it, want 0 and 3", in, out)
	}
	if roundTrip(t, cd, 'z', 300*time.Millisecond) {
		t.Error("a byte from an isolated chunkserver came back")
	}
	c.Heal()
}
