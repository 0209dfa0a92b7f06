package transport

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// countingListener counts the connections a server accepted.
type countingListener struct {
	net.Listener
	accepted *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// pingServer serves pings on loopback and counts its connections.
func pingServer(t *testing.T) (addr string, accepted *atomic.Int32, srv *Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int32)
	srv = NewServer(ServerConfig{}, handlerFunc(func(rw ReplyWriter, h api.Header, _ []byte) { rw.Reply(h, nil, nil) }))
	go srv.Serve(countingListener{ln, accepted})
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), accepted, srv
}

func pingConn(t *testing.T, c *Conn) {
	t.Helper()
	if err := c.Do(context.Background(), &Call{Header: api.Header{Op: api.OpPing}}); err != nil {
		t.Fatalf("ping: %v", err)
	}
}

func sameAddr(a string) (string, error) { return a, nil }

func TestConnCacheSharesOneConnPerKey(t *testing.T) {
	addr, accepted, _ := pingServer(t)
	cache := NewConnCache(ConnCacheConfig[string]{Addr: sameAddr})
	defer cache.Close()
	var wg sync.WaitGroup
	conns := make([]*Conn, 20)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := cache.Conn(context.Background(), addr)
			if err != nil {
				t.Error(err)
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	for _, c := range conns {
		if c != conns[0] {
			t.Fatal("concurrent Gets for one key got different connections")
		}
	}
	pingConn(t, conns[0])
	if n := accepted.Load(); n != 1 {
		t.Fatalf("server accepted %d connections for 20 concurrent Gets, want 1", n)
	}
}

func TestConnCacheRedialsADeadConn(t *testing.T) {
	addr, accepted, _ := pingServer(t)
	cache := NewConnCache(ConnCacheConfig[string]{Addr: sameAddr})
	defer cache.Close()
	c1, err := cache.Conn(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2, err := cache.Conn(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	if c2 == c1 {
		t.Fatal("the cache handed out a closed connection")
	}
	pingConn(t, c2)
	if n := accepted.Load(); n != 2 {
		t.Fatalf("server accepted %d connections, want 2", n)
	}
}

func TestConnCacheFailsFastAfterAFailedDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	var dials atomic.Int32
	cache := NewConnCache(ConnCacheConfig[uint64]{
		Addr:           func(uint64) (string, error) { dials.Add(1); return dead, nil },
		RedialInterval: time.Hour,
	})
	defer cache.Close()
	_, err1 := cache.Conn(context.Background(), 7)
	_, err2 := cache.Conn(context.Background(), 7)
	if err1 == nil || err2 == nil {
		t.Fatalf("dialling a closed port: errors %v, %v", err1, err2)
	}
	if err2 != err1 || dials.Load() != 1 {
		t.Fatalf("within RedialInterval: %d dials, second error %v (first %v); want 1 dial and the same error", dials.Load(), err2, err1)
	}

	noAddr := errors.New("no address")
	cache2 := NewConnCache(ConnCacheConfig[uint64]{Addr: func(uint64) (string, error) { return "", noAddr }})
	defer cache2.Close()
	if _, err := cache2.Conn(context.Background(), 1); !errors.Is(err, noAddr) {
		t.Fatalf("Addr failing: %v, want its error", err)
	}
}

func TestConnCacheClose(t *testing.T) {
	addr, _, _ := pingServer(t)
	cache := NewConnCache(ConnCacheConfig[string]{Addr: sameAddr})
	c, err := cache.Conn(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	cache.Close()
	if !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("after Close the cached connection is alive (Err %v)", c.Err())
	}
	if _, err := cache.Conn(context.Background(), addr); !errors.Is(err, ErrCacheClosed) {
		t.Fatalf("Get after Close: %v, want ErrCacheClosed", err)
	}
}
