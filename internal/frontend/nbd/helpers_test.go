package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// testServer is a Server on a Unix socket in a short temp dir.
type testServer struct {
	*Server
	sock     string
	serveCh  chan error
	accepted *atomic.Int64 // connections accepted
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nbd")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, sock: sock, serveCh: make(chan error, 1), accepted: new(atomic.Int64)}
	go func() { ts.serveCh <- s.Serve(countingListener{ln, ts.accepted}) }()
	t.Cleanup(func() {
		s.Close()
		os.RemoveAll(dir)
	})
	return ts
}

// client is a minimal NBD client for tests and benchmarks.
type client struct {
	t     testing.TB
	nc    net.Conn
	br    *bufio.Reader
	size  uint64
	flags uint16
	infos map[uint16][]byte
}

func dial(t testing.TB, sock string) *client {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	return &client{t: t, nc: nc, br: bufio.NewReader(nc)}
}

// greet reads the server greeting and sends client flags.
func (c *client) greet(cflags uint32) {
	c.t.Helper()
	var hello [18]byte
	c.read(hello[:])
	if binary.BigEndian.Uint64(hello[0:]) != nbdMagic || binary.BigEndian.Uint64(hello[8:]) != ihaveOpt {
		c.t.Fatalf("bad greeting % x", hello)
	}
	if hf := binary.BigEndian.Uint16(hello[16:]); hf != flagFixedNewstyle|flagNoZeroes {
		c.t.Fatalf("handshake flags %#x", hf)
	}
	c.write(binary.BigEndian.AppendUint32(nil, cflags))
}

func (c *client) read(p []byte) {
	c.t.Helper()
	if _, err := io.ReadFull(c.br, p); err != nil {
		c.t.Fatalf("read: %v", err)
	}
}

func (c *client) write(p []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(p); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) sendOpt(opt uint32, data []byte) {
	c.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, ihaveOpt)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	c.write(append(b, data...))
}

type optReplyMsg struct {
	opt, typ uint32
	data     []byte
}

func (c *client) readOptReply() optReplyMsg {
	c.t.Helper()
	var h [20]byte
	c.read(h[:])
	if m := binary.BigEndian.Uint64(h[:]); m != optReplyMagic {
		c.t.Fatalf("option reply magic %#x", m)
	}
	r := optReplyMsg{opt: binary.BigEndian.Uint32(h[8:]), typ: binary.BigEndian.Uint32(h[12:])}
	r.data = make([]byte, binary.BigEndian.Uint32(h[16:]))
	c.read(r.data)
	return r
}

func goData(name string, infos ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// infoGo sends NBD_OPT_INFO or NBD_OPT_GO and collects the replies until the
// final one, whose type it returns.
func (c *client) infoGo(opt uint32, name string, infos ...uint16) uint32 {
	c.t.Helper()
	c.sendOpt(opt, goData(name, infos...))
	c.infos = map[uint16][]byte{}
	for {
		r := c.readOptReply()
		if r.opt != opt {
			c.t.Fatalf("reply for option %d, want %d", r.opt, opt)
		}
		if r.typ != repInfo {
			if r.typ == repAck {
				e, ok := c.infos[infoExport]
				if !ok || len(e) != 10 {
					c.t.Fatalf("ACK without a valid NBD_INFO_EXPORT")
				}
				c.size = binary.BigEndian.Uint64(e)
				c.flags = binary.BigEndian.Uint16(e[8:])
			}
			return r.typ
		}
		c.infos[binary.BigEndian.Uint16(r.data)] = r.data[2:]
	}
}

// open dials and enters transmission on export name with NBD_OPT_GO.
func open(t testing.TB, sock, name string) *client {
	t.Helper()
	c := dial(t, sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	if typ := c.infoGo(optGo, name, infoBlockSize); typ != repAck {
		t.Fatalf("GO %q: reply %#x", name, typ)
	}
	c.nc.SetDeadline(time.Time{})
	return c
}

func (c *client) send(typ, flags uint16, cookie, off uint64, length uint32, payload []byte) {
	c.t.Helper()
	c.write(encodeRequest(typ, flags, cookie, off, length, payload))
}

// encodeRequest encodes one request with its payload.
func encodeRequest(typ, flags uint16, cookie, off uint64, length uint32, payload []byte) []byte {
	b := make([]byte, requestHeaderLen, requestHeaderLen+len(payload))
	binary.BigEndian.PutUint32(b[0:], requestMagic)
	binary.BigEndian.PutUint16(b[4:], flags)
	binary.BigEndian.PutUint16(b[6:], typ)
	binary.BigEndian.PutUint64(b[8:], cookie)
	binary.BigEndian.PutUint64(b[16:], off)
	binary.BigEndian.PutUint32(b[24:], length)
	return append(b, payload...)
}

// waitFor polls cond until it returns nil, failing the test after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, within, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// reply reads one simple reply; dataLen says how many payload bytes follow a
// successful reply with that cookie.
func (c *client) reply(dataLen func(cookie uint64) int) (cookie uint64, errno uint32, data []byte) {
	c.t.Helper()
	var h [replyHeaderLen]byte
	c.read(h[:])
	if m := binary.BigEndian.Uint32(h[:]); m != simpleReplyMagic {
		c.t.Fatalf("reply magic %#x", m)
	}
	errno = binary.BigEndian.Uint32(h[4:])
	cookie = binary.BigEndian.Uint64(h[8:])
	if errno == 0 && dataLen != nil {
		data = make([]byte, dataLen(cookie))
		c.read(data)
	}
	return cookie, errno, data
}

// do sends one request and waits for its reply (nothing else in flight).
func (c *client) do(typ, flags uint16, off uint64, length uint32, payload []byte) (uint32, []byte) {
	c.t.Helper()
	c.send(typ, flags, 7, off, length, payload)
	cookie, errno, data := c.reply(func(uint64) int {
		if typ == cmdRead {
			return int(length)
		}
		return 0
	})
	if cookie != 7 {
		c.t.Fatalf("cookie %d, want 7", cookie)
	}
	return errno, data
}

// expectEOF asserts the server closed the connection.
func (c *client) expectEOF() {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	var b [1]byte
	n, err := c.br.Read(b[:])
	if err == nil || n > 0 {
		c.t.Fatalf("expected the server to close the connection, read %d bytes, err %v", n, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("expected the server to close the connection, but it stayed open")
	}
	c.nc.Close() // as a real client does on EOF; ends the server's linger
}
