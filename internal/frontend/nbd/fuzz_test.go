package nbd

// Fuzz targets: arbitrary client bytes fed into one connection. Run with
//
//	go test -run '^$' -fuzz FuzzHandshake ./internal/frontend/nbd/
//	go test -run '^$' -fuzz FuzzRequests  ./internal/frontend/nbd/

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/identity"
)

// scriptConn is a net.Conn whose client side is a fixed byte string: reads
// return it and then EOF; writes are discarded.
type scriptConn struct {
	r *bytes.Reader

	mu     sync.Mutex
	closed bool
	out    *bytes.Buffer // if set, collects what the server wrote
}

func (c *scriptConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return c.r.Read(p)
}

func (c *scriptConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	if c.out != nil {
		c.out.Write(p)
	}
	return len(p), nil
}

func (c *scriptConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

type fakeAddr struct{}

func (fakeAddr) Network() string { return "fuzz" }
func (fakeAddr) String() string  { return "fuzz" }

func (c *scriptConn) LocalAddr() net.Addr                { return fakeAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr               { return fakeAddr{} }
func (c *scriptConn) SetDeadline(t time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(t time.Time) error { return nil }

const (
	fuzzSize       = 256 << 10
	fuzzMaxPayload = 64 << 10
)

func fuzzServer(t *testing.T, exports frontendtest.Disks) *Server {
	return fuzzServerTLS(t, exports, nil)
}

func fuzzServerTLS(t *testing.T, exports frontendtest.Disks, tc *tls.Config) *Server {
	s, err := NewServer(Config{Exports: exports.Exports(), Logger: quietLogger(), MaxPayload: fuzzMaxPayload, MaxInFlight: 8, TLS: tc})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fuzzTLS is a server TLS configuration from a throw-away cluster CA.
func fuzzTLS(f *testing.F) *tls.Config {
	dir := f.TempDir()
	ca, err := identity.InitCA(dir, "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	if _, _, err := ca.IssueFiles(dir, "", identity.RoleAccess, "fe", identity.IssueOptions{}); err != nil {
		f.Fatal(err)
	}
	id, err := identity.Load(dir, "access-fe")
	if err != nil {
		f.Fatal(err)
	}
	return id.ServerTLS(identity.RoleClient)
}

func FuzzHandshake(f *testing.F) {
	flags := binary.BigEndian.AppendUint32(nil, flagCFixedNewstyle|flagCNoZeroes)
	opt := func(b []byte, o uint32, data []byte) []byte {
		b = binary.BigEndian.AppendUint64(b, ihaveOpt)
		b = binary.BigEndian.AppendUint32(b, o)
		b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
		return append(b, data...)
	}
	f.Add(opt(bytes.Clone(flags), optGo, goData("disk", infoBlockSize, infoName)))
	f.Add(opt(opt(bytes.Clone(flags), optList, nil), optInfo, goData("ro", infoDescription)))
	f.Add(opt(bytes.Clone(flags), optExportName, []byte("disk")))
	f.Add(opt(opt(bytes.Clone(flags), optStructuredReply, nil), optAbort, nil))
	f.Add(opt(bytes.Clone(flags), optGo, []byte{0, 0, 0, 200, 1}))
	f.Add(opt(bytes.Clone(flags), optGo, goData("ro")))
	// NBD_OPT_STARTTLS: alone, with data, twice, followed by plaintext
	// options (injection) or by bytes that are not a TLS ClientHello, and
	// plaintext options a TLS-requiring listener must refuse.
	f.Add(opt(bytes.Clone(flags), optStartTLS, nil))
	f.Add(opt(bytes.Clone(flags), optStartTLS, []byte("x")))
	f.Add(opt(opt(bytes.Clone(flags), optStartTLS, nil), optStartTLS, nil))
	f.Add(opt(opt(bytes.Clone(flags), optStartTLS, nil), optGo, goData("disk")))
	f.Add(append(opt(bytes.Clone(flags), optStartTLS, nil), 0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5))
	f.Add(opt(opt(opt(bytes.Clone(flags), optList, nil), optInfo, goData("disk")), optStartTLS, nil))
	f.Add(opt(opt(bytes.Clone(flags), optExportName, []byte("disk")), optStartTLS, nil))
	f.Add(opt(opt(bytes.Clone(flags), optAbort, nil), optStartTLS, nil))
	serverTLS := fuzzTLS(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, p := range []TLSPolicy{TLSOff, TLSAllow, TLSRequire} {
			disk, ro := frontendtest.NewDisk(fuzzSize), frontendtest.NewDisk(fuzzSize)
			ro.ReadOnly = true
			s := fuzzServerTLS(t, frontendtest.Disks{"disk": disk, "ro": ro}, serverTLS)
			s.ServeConnTLS(&scriptConn{r: bytes.NewReader(in)}, p)
			if v := disk.Violations.Load() + ro.Violations.Load(); v != 0 {
				t.Fatalf("TLS %v: %d calls broke the Backend contract", p, v)
			}
			if ro.Mutations.Load() != 0 {
				t.Fatalf("TLS %v: a read-only export was modified", p)
			}
			if p == TLSRequire && disk.Mutations.Load()+disk.Submitted.Load() != 0 {
				t.Fatal("TLS required: a plaintext client reached the export")
			}
			if disk.Pending.Load() != 0 {
				t.Fatalf("TLS %v: backend IO still pending after the connection ended", p)
			}
		}
	})
}

// goPrefix is a client handshake that enters transmission on "disk".
func goPrefix() []byte {
	b := binary.BigEndian.AppendUint32(nil, flagCFixedNewstyle|flagCNoZeroes)
	b = binary.BigEndian.AppendUint64(b, ihaveOpt)
	b = binary.BigEndian.AppendUint32(b, optGo)
	d := goData("disk", infoBlockSize)
	b = binary.BigEndian.AppendUint32(b, uint32(len(d)))
	return append(b, d...)
}

func reqBytes(typ, flags uint16, off uint64, length uint32, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, requestMagic)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, 1)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint32(b, length)
	return append(b, payload...)
}

// modelApply is an independent reading of the request rules: it replays the
// stream on a plain byte slice, applying exactly the requests the server must
// accept and stopping where the server must stop.
func modelApply(stream []byte, disk []byte) {
	size := uint64(len(disk))
	for len(stream) >= requestHeaderLen {
		h := stream[:requestHeaderLen]
		stream = stream[requestHeaderLen:]
		if binary.BigEndian.Uint32(h) != requestMagic {
			return
		}
		flags := binary.BigEndian.Uint16(h[4:])
		typ := binary.BigEndian.Uint16(h[6:])
		off := binary.BigEndian.Uint64(h[16:])
		length := uint64(binary.BigEndian.Uint32(h[24:]))
		if typ == cmdDisc {
			return
		}
		okFlags := flags&^cmdFlagFUA == 0 || (typ == cmdWriteZeroes && flags&^(cmdFlagFUA|cmdFlagNoHole) == 0)
		inRange := length > 0 && off <= size && off+length <= size
		var valid bool
		switch typ {
		case cmdRead, cmdWrite:
			valid = okFlags && inRange && length <= fuzzMaxPayload
		case cmdTrim, cmdWriteZeroes:
			valid = okFlags && inRange
		}
		if typ == cmdWrite {
			if length > fuzzMaxPayload || uint64(len(stream)) < length {
				return // connection closed: oversized or torn
			}
			if valid {
				copy(disk[off:], stream[:length])
			}
			stream = stream[length:]
		}
		if valid && (typ == cmdTrim || typ == cmdWriteZeroes) {
			clear(disk[off : off+length])
		}
	}
}

func FuzzRequests(f *testing.F) {
	f.Add(reqBytes(cmdWrite, 0, 4096, 4, []byte("abcd")))
	f.Add(append(reqBytes(cmdWrite, cmdFlagFUA, 0, 8, []byte("12345678")), reqBytes(cmdTrim, 0, 2, 4, nil)...))
	f.Add(append(reqBytes(cmdWriteZeroes, cmdFlagNoHole, 100, 50, nil), reqBytes(cmdRead, 0, 0, 512, nil)...))
	f.Add(reqBytes(cmdWrite, 0, fuzzSize-2, 4, []byte("over")))
	f.Add(reqBytes(cmdWrite, cmdFlagNoHole, 0, 4, []byte("flag")))
	f.Add(append(reqBytes(cmdFlush, 0, 0, 0, nil), reqBytes(cmdDisc, 0, 0, 0, nil)...))
	f.Add(reqBytes(cmdWrite, 0, 0, 1<<30, []byte("huge")))
	f.Fuzz(func(t *testing.T, stream []byte) {
		disk := frontendtest.NewDisk(fuzzSize)
		// Start from a pattern so that trims and zeroes are visible.
		want := make([]byte, fuzzSize)
		for i := range want {
			want[i] = byte(i*7 + 1)
		}
		disk.Put(0, want)
		s := fuzzServer(t, frontendtest.Disks{"disk": disk})
		s.ServeConn(&scriptConn{r: bytes.NewReader(append(goPrefix(), stream...))})
		if v := disk.Violations.Load(); v != 0 {
			t.Fatalf("%d calls broke the Backend contract", v)
		}
		if disk.Pending.Load() != 0 {
			t.Fatal("backend IO still pending after the connection ended")
		}
		modelApply(stream, want)
		if !bytes.Equal(disk.Bytes(0, fuzzSize), want) {
			t.Fatal("export content differs from the model: an invalid or torn request was applied, or a valid one was lost")
		}
	})
}
