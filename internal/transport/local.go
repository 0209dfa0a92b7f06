package transport

import (
	"context"
	"net"
	"os"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Same-host connections. A server whose TCP address is ADDR also listens on the
// abstract Unix socket "@basalt/ADDR", and Dial tries that socket before TCP. On
// this project's test machines a loopback TCP round trip costs 4–5 times a Unix
// socket's: the kernel wakes a TCP receiver on another CPU, while a Unix socket's
// synchronous wake-up lets the scheduler run the two ends of a request on one.
// Abstract names belong to a network namespace and vanish with their socket, so
// the name is found only by processes that could reach ADDR's server on
// loopback anyway, and never outlives the server that bound it. Dial uses a
// same-host socket only when the process listening on it runs as the same user
// (or root); see ownPeer.

// LocalName is the abstract Unix socket name of the server at TCP address addr.
func LocalName(addr string) string { return "@basalt/" + addr }

// ListenLocal listens on LocalName(addr). It fails with EADDRINUSE when another
// server in this network namespace claims the same address.
func ListenLocal(addr string) (net.Listener, error) {
	return net.Listen("unix", LocalName(addr))
}

// connect connects to addr: through its same-host socket when one is
// listening, else over TCP.
func connect(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if nc, err := d.DialContext(ctx, "unix", LocalName(addr)); err == nil {
		uc := nc.(*net.UnixConn)
		if ownPeer(uc) {
			_ = uc.SetWriteBuffer(localSendBuffer)
			return nc, nil
		}
		nc.Close()
	}
	return d.DialContext(ctx, "tcp", addr)
}

// ownPeer reports whether the process at the other end of a same-host socket
// runs as this process's user or as root. Abstract names have no permissions:
// another local user could bind a server's name while it is down, so a
// listener of anyone else is passed over for TCP.
func ownPeer(uc *net.UnixConn) bool {
	rc, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return false
	}
	return cred.Uid == uint32(os.Geteuid()) || cred.Uid == 0
}

// localConns numbers accepted same-host connections, whose peers have no address.
var localConns atomic.Uint64

// localAddr names an accepted same-host connection in logs.
type localAddr uint64

func (localAddr) Network() string  { return "unix" }
func (a localAddr) String() string { return "local#" + strconv.FormatUint(uint64(a), 10) }

// localSendBuffer is a same-host socket's send buffer, which bounds the bytes in
// flight towards its peer. Linux's default (208 KiB) is less than one 256 KiB
// write; with 1 MiB, 256 KiB writes at QD8 ran 5 % faster on 8 % less CPU.
// The kernel caps it at net.core.wmem_max.
const localSendBuffer = 1 << 20
