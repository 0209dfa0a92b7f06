package frontend

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// echoConn copies its input back until EOF or, after BeginShutdown, until its
// read deadline passes; hard is set when Close was called.
type echoConn struct {
	nc       net.Conn
	shutdown atomic.Bool
	hard     atomic.Bool
	ignore   bool // ignores BeginShutdown (to test Shutdown's deadline)
}

func (c *echoConn) Serve() {
	defer c.nc.Close()
	io.Copy(c.nc, c.nc)
}

func (c *echoConn) BeginShutdown() {
	c.shutdown.Store(true)
	if !c.ignore {
		c.nc.SetReadDeadline(time.Now())
	}
}

func (c *echoConn) Close() { c.hard.Store(true); c.nc.Close() }

func startConns(t *testing.T, ignore bool) (*Conns, net.Listener, chan error, chan *echoConn) {
	t.Helper()
	made := make(chan *echoConn, 16)
	s := NewConns(ConnsConfig{Protocol: "test", New: func(nc net.Conn) Conn {
		c := &echoConn{nc: nc, ignore: ignore}
		made <- c
		return c
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() { s.Close() })
	return s, ln, served, made
}

func dialEcho(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := nc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(nc, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
	return nc
}

func TestConnsShutdownIsGraceful(t *testing.T) {
	s, ln, served, made := startConns(t, false)
	dialEcho(t, ln)
	dialEcho(t, ln)
	if n := s.Len(); n != 2 {
		t.Fatalf("Len = %d, want 2", n)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve = %v, want ErrServerClosed", err)
	}
	for range 2 {
		c := <-made
		if !c.shutdown.Load() || c.hard.Load() {
			t.Fatalf("connection: shutdown %v hard %v, want a graceful end", c.shutdown.Load(), c.hard.Load())
		}
	}
	if s.Len() != 0 {
		t.Fatalf("Len after Shutdown = %d", s.Len())
	}
	a, b := net.Pipe()
	defer b.Close()
	if err := s.ServeConn(a); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ServeConn after Shutdown = %v", err)
	}
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln2); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Shutdown = %v", err)
	}
}

func TestConnsShutdownDeadlineClosesHard(t *testing.T) {
	s, ln, _, made := startConns(t, true)
	dialEcho(t, ln)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v, want context.Canceled", err)
	}
	if c := <-made; !c.hard.Load() {
		t.Fatal("a connection ignoring BeginShutdown was not closed by the expired Shutdown")
	}
	if s.Context().Err() == nil {
		t.Fatal("Context not cancelled by Shutdown")
	}
}

func TestConnsCloseAndServeConn(t *testing.T) {
	s, ln, served, made := startConns(t, false)
	dialEcho(t, ln)
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- s.ServeConn(a) }()
	<-made
	<-made
	b.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(b, buf); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := <-done; err != nil {
		t.Fatalf("ServeConn = %v, want nil after its connection ended", err)
	}
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	if s.Len() != 0 {
		t.Fatalf("Len after Close = %d", s.Len())
	}
}
