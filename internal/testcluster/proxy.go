package testcluster

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Partitions without root (Options.Proxy): every chunkserver listens on a
// private loopback port and advertises to the MDS the port of a TCP proxy in
// the test process, and serves over TCP only (--tcp-only, no same-host
// socket), so that every connection to it — from its peers' raft transport
// and from clients — passes through that proxy. Isolate(p) stops the bytes of
// every proxied connection p is an end of: the connections to p's proxy, and
// the connections p dialed to its peers' proxies (their source port is
// matched to p's process through /proc/net/tcp and /proc/PID/fd at accept).
// Nothing is refused or reset, as when a link drops packets: connections stay
// open and hang (new ones are accepted, then hang), until Heal lets the bytes
// held through, in order, as TCP would after the link came back. The MDS
// link of p is left alone: p still heartbeats (a partition of the data
// network, the one that matters to Raft and IO).
//
// Chosen over network namespaces with iptables (Net, InNetns), which need
// root, run the test in a child process, and cannot grow the cluster
// (AddChunkserver).

// proxyNet holds the proxies of a cluster and which chunkservers are isolated.
type proxyNet struct {
	mu       sync.Mutex
	cond     *sync.Cond
	isolated map[*Proc]bool
	lns      []net.Listener
	conns    map[net.Conn]link // both ends' connections of every proxied link
	closed   bool
	procs    []*Proc // the chunkservers behind the proxies, to find a connection's source
}

func newProxyNet() *proxyNet {
	n := &proxyNet{isolated: map[*Proc]bool{}, conns: map[net.Conn]link{}}
	n.cond = sync.NewCond(&n.mu)
	return n
}

// listen starts the proxy of chunkserver to, which listens at backend, and
// returns the proxy's address.
func (n *proxyNet) listen(t testing.TB, to *Proc, backend string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.lns = append(n.lns, ln)
	n.procs = append(n.procs, to)
	n.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go n.serve(c, to, backend)
		}
	}()
	return ln.Addr().String()
}

// link is a proxied connection's ends: from (nil: not a chunkserver) dialed to.
type link struct{ from, to *Proc }

// blocked reports whether a connection from from (nil: not a chunkserver)
// to to is cut. n.mu is held.
func (n *proxyNet) blocked(from, to *Proc) bool {
	return !n.closed && (n.isolated[to] || (from != nil && n.isolated[from]))
}

// wait returns once the link from → to is not cut.
func (n *proxyNet) wait(from, to *Proc) {
	n.mu.Lock()
	for n.blocked(from, to) {
		n.cond.Wait()
	}
	n.mu.Unlock()
}

func (n *proxyNet) track(c net.Conn, l link) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.conns[c] = l
	return true
}

func (n *proxyNet) untrack(c net.Conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

func (n *proxyNet) serve(in net.Conn, to *Proc, backend string) {
	defer in.Close()
	from := n.sourceOf(in)
	if !n.track(in, link{from, to}) {
		return
	}
	defer n.untrack(in)
	n.wait(from, to) // a connection opened during a partition hangs until Heal
	out, err := net.Dial("tcp", backend)
	if err != nil {
		return // the chunkserver is down: the dialer sees the connection close
	}
	defer out.Close()
	if !n.track(out, link{}) {
		return
	}
	defer n.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				n.wait(from, to)
				if _, werr := dst.Write(buf[:k]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done // either side closed: close both
}

// sourceOf returns the chunkserver process that dialed c (by the socket
// owning c's remote port), or nil (a client, or not found).
func (n *proxyNet) sourceOf(c net.Conn) *Proc {
	ra, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return nil
	}
	// One read of /proc/net/tcp can miss a socket when the table changes
	// under it: read it again before giving up.
	inode := ""
	for try := 0; try < 5 && inode == ""; try++ {
		inode = socketInode(ra.Port)
	}
	if inode == "" {
		return nil
	}
	want := "socket:[" + inode + "]"
	n.mu.Lock()
	procs := slices.Clone(n.procs)
	n.mu.Unlock()
	for _, p := range procs {
		pid := p.PID()
		if pid == 0 {
			continue
		}
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
				return p
			}
		}
	}
	return nil
}

// socketInode returns the inode of the IPv4 TCP socket bound to local port
// port on 127.0.0.1, from /proc/net/tcp ("" if none).
func socketInode(port int) string {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer f.Close()
	local := fmt.Sprintf("0100007F:%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(fs) >= 10 && fs[1] == local {
			if _, err := strconv.ParseUint(fs[9], 10, 64); err == nil && fs[9] != "0" {
				return fs[9]
			}
		}
	}
	return ""
}

// isolate cuts p off, returning how many open connections to p, and from p
// to its peers, it holds.
func (n *proxyNet) isolate(p *Proc) (in, out int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.isolated[p] = true
	for _, l := range n.conns {
		switch p {
		case l.to:
			in++
		case l.from:
			out++
		}
	}
	return in, out
}

func (n *proxyNet) healAll() {
	n.mu.Lock()
	clear(n.isolated)
	n.cond.Broadcast()
	n.mu.Unlock()
}

func (n *proxyNet) close() {
	n.mu.Lock()
	n.closed = true
	n.cond.Broadcast()
	lns, conns := n.lns, n.conns
	n.conns = map[net.Conn]link{}
	n.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for c := range conns {
		c.Close()
	}
}

// Isolate cuts chunkserver p off the data network: no byte passes between p
// and its peers or clients (both ways) until Heal. It returns how many open
// connections it cut: to p (from peers and clients) and from p to its peers.
// The cluster must have been started with Options.Proxy.
func (c *Cluster) Isolate(p *Proc) (in, out int) {
	c.t.Helper()
	if c.proxies == nil {
		c.t.Fatal("testcluster: Isolate needs Options.Proxy")
	}
	return c.proxies.isolate(p)
}

// Heal ends every isolation: the bytes held go through.
func (c *Cluster) Heal() {
	if c.proxies != nil {
		c.proxies.healAll()
	}
}
