package testutil

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralRangeFile holds the kernel's range of ports for outgoing
// connections and listens on port 0.
const ephemeralRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// pickRange returns the ports [lo, hi) that FreePort and FreePortBase choose
// from: outside the kernel's ephemeral range, so that a port handed to a
// server that listens a moment later (often a child process) is not taken
// meanwhile by some outgoing connection's local end, which the kernel picks
// from that range. Below the range if there is room (from 10000, clear of
// well-known services), else above it; ok is false when neither has 1000 ports.
func pickRange() (lo, hi int, ok bool) {
	elo, ehi := 32768, 60999 // Linux's default
	if b, err := os.ReadFile(ephemeralRangeFile); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && 0 < l && l <= h {
				elo, ehi = l, h
			}
		}
	}
	const floor, room = 10000, 1000
	if elo-floor >= room {
		return floor, elo, true
	}
	if 65536-(ehi+1) >= room {
		return ehi + 1, 65536, true
	}
	return 0, 0, false
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, lies
// outside the kernel's ephemeral range (see pickRange), and that this process
// has not handed out before: a port handed out twice once gave an embedded
// etcd the MDS's own port.
func FreePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi, ok := pickRange()
	if !ok {
		return kernelPort(t)
	}
	for try := 0; try < 1000; try++ {
		p := lo + rand.IntN(hi-lo)
		if rangeFree(p, 1) {
			portsGiven[p] = true
			return p
		}
	}
	t.Fatalf("testutil: found no free port on 127.0.0.1 in [%d, %d)", lo, hi)
	return 0
}

// kernelPort is FreePort's fallback when the ephemeral range leaves no room:
// a port the kernel picks.
func kernelPort(t testing.TB) int {
	t.Helper()
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

// FreePortBase returns a port P such that P to P+n-1 were all free on
// 127.0.0.1 a moment ago and lie outside the kernel's ephemeral range (see
// pickRange), for a server that takes its ports as offsets from a base (the
// playground).
func FreePortBase(t testing.TB, n int) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi, ok := pickRange()
	if !ok {
		lo, hi = 20000, 40000
	}
	if hi-lo < n {
		t.Fatalf("testutil: no room for %d consecutive ports in [%d, %d)", n, lo, hi)
	}
	for try := 0; try < 100; try++ {
		base := lo + rand.IntN(hi-lo-n+1)
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
