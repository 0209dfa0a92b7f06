package nbd

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/identity"
)

// tlsFixture is a cluster CA with a server (access) and a client identity.
type tlsFixture struct {
	ca             *identity.CA
	server, client *identity.Config
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	dir := t.TempDir()
	ca, err := identity.InitCA(dir, "nbdtest")
	if err != nil {
		t.Fatal(err)
	}
	f := &tlsFixture{ca: ca}
	for _, n := range []identity.Need{{Role: identity.RoleAccess, Name: "fe"}, {Role: identity.RoleClient, Name: "c"}} {
		if _, _, err := ca.IssueFiles(dir, "", n.Role, n.Name, identity.IssueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if f.server, err = identity.Load(dir, "access-fe"); err != nil {
		t.Fatal(err)
	}
	if f.client, err = identity.Load(dir, "client-c"); err != nil {
		t.Fatal(err)
	}
	return f
}

// startTLSServer serves one in-memory export on a Unix socket with policy p.
func startTLSServer(t *testing.T, f *tlsFixture, p TLSPolicy, recheck func(tls.ConnectionState) error) (*testServer, *frontendtest.Disk) {
	t.Helper()
	disk := frontendtest.NewDisk(1 << 20)
	s, err := NewServer(Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), Logger: quietLogger(),
		TLS: f.server.ServerTLS(identity.RoleClient), TLSRecheck: recheck})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, sock: sock, serveCh: make(chan error, 1), accepted: new(atomic.Int64)}
	go func() { ts.serveCh <- s.ServeTLS(ln, p) }()
	t.Cleanup(func() { s.Close() })
	return ts, disk
}

// startTLS sends NBD_OPT_STARTTLS, expects the ACK and runs the client
// side of the handshake with cfg.
func (c *client) startTLS(cfg *tls.Config) error {
	c.t.Helper()
	c.sendOpt(optStartTLS, nil)
	if r := c.readOptReply(); r.opt != optStartTLS || r.typ != repAck {
		c.t.Fatalf("STARTTLS: reply opt %d type %#x %q", r.opt, r.typ, r.data)
	}
	tc := tls.Client(c.nc, cfg)
	if err := tc.Handshake(); err != nil {
		return err
	}
	// The server refuses a client certificate after TLS 1.3's handshake
	// returned on the client: a round trip shows it.
	c.nc, c.br = tc, bufio.NewReader(tc)
	return nil
}

func TestTLSRequire(t *testing.T) {
	f := newTLSFixture(t)
	ts, disk := startTLSServer(t, f, TLSRequire, nil)

	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	for _, o := range []struct {
		opt  uint32
		data []byte
	}{{optList, nil}, {optInfo, goData("disk")}, {optGo, goData("disk")}, {optStructuredReply, nil}, {0x7777, []byte("x")}} {
		c.sendOpt(o.opt, o.data)
		if r := c.readOptReply(); r.opt != o.opt || r.typ != repErrTLSReqd {
			t.Fatalf("plaintext option %d on a TLS-required listener: reply type %#x, want NBD_REP_ERR_TLS_REQD", o.opt, r.typ)
		}
	}
	c.sendOpt(optStartTLS, []byte("x"))
	if r := c.readOptReply(); r.typ != repErrInvalid {
		t.Fatalf("STARTTLS with data: reply %#x, want NBD_REP_ERR_INVALID", r.typ)
	}
	if err := c.startTLS(f.client.ClientTLS(identity.RoleAccess)); err != nil {
		t.Fatal(err)
	}
	c.sendOpt(optStartTLS, nil)
	if r := c.readOptReply(); r.typ != repErrInvalid {
		t.Fatalf("second STARTTLS: reply %#x, want NBD_REP_ERR_INVALID", r.typ)
	}
	if typ := c.infoGo(optGo, "disk", infoBlockSize); typ != repAck {
		t.Fatalf("GO over TLS: %#x", typ)
	}
	if errno, _ := c.do(cmdWrite, 0, 4096, 5, []byte("hello")); errno != 0 {
		t.Fatalf("write over TLS: errno %d", errno)
	}
	if errno, data := c.do(cmdRead, 0, 4096, 5, nil); errno != 0 || string(data) != "hello" {
		t.Fatalf("read over TLS: errno %d data %q", errno, data)
	}
	if got := disk.Bytes(4096, 5); string(got) != "hello" {
		t.Fatalf("export holds %q", got)
	}

	// NBD_OPT_EXPORT_NAME cannot be refused with an error: it closes.
	c2 := dial(t, ts.sock)
	c2.greet(flagCFixedNewstyle | flagCNoZeroes)
	c2.sendOpt(optExportName, []byte("disk"))
	c2.expectEOF()
	// ABORT is allowed in plaintext.
	c3 := dial(t, ts.sock)
	c3.greet(flagCFixedNewstyle | flagCNoZeroes)
	c3.sendOpt(optAbort, nil)
	if r := c3.readOptReply(); r.typ != repAck {
		t.Fatalf("ABORT: %#x", r.typ)
	}
}

func TestTLSAllowAndOff(t *testing.T) {
	f := newTLSFixture(t)
	ts, _ := startTLSServer(t, f, TLSAllow, nil)
	// Plaintext still works...
	open(t, ts.sock, "disk")
	// ...and so does TLS.
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	if err := c.startTLS(f.client.ClientTLS()); err != nil {
		t.Fatal(err)
	}
	if typ := c.infoGo(optGo, "disk"); typ != repAck {
		t.Fatalf("GO over TLS: %#x", typ)
	}

	off, _ := startTLSServer(t, f, TLSOff, nil)
	c = dial(t, off.sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	c.sendOpt(optStartTLS, nil)
	if r := c.readOptReply(); r.typ != repErrUnsup {
		t.Fatalf("STARTTLS on an off listener: %#x, want NBD_REP_ERR_UNSUP", r.typ)
	}

	s, err := NewServer(Config{Exports: frontendtest.Disks{}.Exports(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ServeTLS(ln, TLSRequire); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("ServeTLS(require) without Config.TLS: %v, want ErrBadConfig", err)
	}
}

// TestTLSRefusals: no certificate, a certificate of another CA, a role the
// server does not allow, and plaintext sent after STARTTLS (injection) are
// refused; nothing reaches the export.
func TestTLSRefusals(t *testing.T) {
	f := newTLSFixture(t)
	other := newTLSFixture(t)
	ts, disk := startTLSServer(t, f, TLSRequire, nil)

	try := func(name string, cfg *tls.Config) {
		t.Helper()
		c := dial(t, ts.sock)
		c.greet(flagCFixedNewstyle | flagCNoZeroes)
		if err := c.startTLS(cfg); err != nil {
			return // refused in the handshake
		}
		// TLS 1.3: the client's handshake ends before the server checked its
		// certificate; the next read shows the refusal.
		c.sendOptErr(optGo, goData("disk"))
		if _, err := io.ReadFull(c.br, make([]byte, 20)); err == nil {
			t.Errorf("%s: the server answered an option", name)
		}
	}
	anon := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	try("no certificate", anon)
	foreign := other.client.ClientTLS()
	foreign.VerifyConnection = nil // present the other CA's certificate whatever the server is
	try("another CA", foreign)
	try("a role not allowed", f.server.ClientTLS()) // an access certificate; the server allows client only

	// Plaintext pipelined behind STARTTLS is not taken as TLS data.
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	var b []byte
	for _, o := range []uint32{optStartTLS, optGo} {
		d := []byte(nil)
		if o == optGo {
			d = goData("disk")
		}
		b = binary.BigEndian.AppendUint64(b, ihaveOpt)
		b = binary.BigEndian.AppendUint32(b, o)
		b = binary.BigEndian.AppendUint32(b, uint32(len(d)))
		b = append(b, d...)
	}
	c.write(b)
	out, _ := io.ReadAll(c.br)
	if len(out) > 20 { // at most STARTTLS's ACK, if the server read the two apart
		t.Errorf("plaintext after STARTTLS was answered: % x", out)
	}
	if disk.Mutations.Load() != 0 {
		t.Fatal("the export changed")
	}
}

// sendOptErr is sendOpt that tolerates a closed connection.
func (c *client) sendOptErr(opt uint32, data []byte) {
	b := binary.BigEndian.AppendUint64(nil, ihaveOpt)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	c.nc.Write(append(b, data...))
}

// TestTLSRecheckDisconnects: a client whose certificate stops being
// accepted (TLSRecheck fails, as for a revocation) is disconnected.
func TestTLSRecheckDisconnects(t *testing.T) {
	f := newTLSFixture(t)
	var revoked atomic.Bool
	ts, _ := startTLSServer(t, f, TLSRequire, func(tls.ConnectionState) error {
		if revoked.Load() {
			return errors.New("revoked")
		}
		return nil
	})
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	if err := c.startTLS(f.client.ClientTLS()); err != nil {
		t.Fatal(err)
	}
	if typ := c.infoGo(optGo, "disk"); typ != repAck {
		t.Fatalf("GO: %#x", typ)
	}
	if errno, _ := c.do(cmdRead, 0, 0, 512, nil); errno != 0 {
		t.Fatalf("read: %d", errno)
	}
	revoked.Store(true)
	c.nc.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadAll(c.br); err != nil && !errors.Is(err, io.EOF) {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("still connected 60 s after the recheck failed")
		}
	}
}
