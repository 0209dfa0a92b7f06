package testutil

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and that
// this process has not handed out before: the kernel may offer a just-closed
// port again, which once gave an embedded etcd the MDS's own port.
func FreePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testutil: no free port on 127.0.0.1: %v", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !portsGiven[port] {
			portsGiven[port] = true
			return port
		}
	}
}

// FreeAddr returns "127.0.0.1:port" for a FreePort. Nothing listens there, so
// it also serves as an address that refuses connections.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// FreePortBase returns a port P between 20000 and 40000 such that P to P+n-1
// were all free on 127.0.0.1 a moment ago, for a server that takes its ports
// as offsets from a base (the playground).
func FreePortBase(t testing.TB, n int) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for try := 0; try < 100; try++ {
		base := 20000 + rand.IntN(20000)
		if rangeFree(base, n) {
			for p := base; p < base+n; p++ {
				portsGiven[p] = true
			}
			return base
		}
	}
	t.Fatalf("testutil: found no %d consecutive free ports on 127.0.0.1", n)
	return 0
}

// rangeFree reports whether ports base to base+n-1 can be listened on and
// none of them was handed out before.
func rangeFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		if portsGiven[p] {
			return false
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}
