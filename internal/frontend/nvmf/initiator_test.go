package nvmf

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/nvmfhost"
)

// newDisk is an in-memory volume of size bytes with 512-byte blocks.
func newDisk(size int) *frontendtest.Disk {
	d := frontendtest.NewDisk(size)
	d.BlockSizes.Minimum = 512
	return d
}

const (
	hostA = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002"
)

// startServer serves volume "vol" (1 MiB) to hostA only.
func startServer(t testing.TB, mod func(*Config)) (*Server, string, *frontendtest.Disk) {
	t.Helper()
	return startServerSized(t, 0, mod)
}

// startServerSized is startServer over exports that re-read watched sizes
// every sizeCheck (0: the default).
func startServerSized(t testing.TB, sizeCheck time.Duration, mod func(*Config)) (*Server, string, *frontendtest.Disk) {
	t.Helper()
	disk := newDisk(1 << 20)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: frontendtest.Disks{"vol": disk}, Logger: quiet, SizeCheck: sizeCheck})
	cfg := Config{Exports: ex, AllowedHosts: []string{hostA}, Logger: quiet}
	if mod != nil {
		mod(&cfg)
	}
	s, addr := serve(t, cfg)
	return s, addr, disk
}

// serve starts a server with cfg on a loopback port, closed (with its
// exports) when the test ends.
func serve(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close(); cfg.Exports.Close() })
	return s, ln.Addr().String()
}

// initiator is the nvmfhost package's Conn (one queue, one command at a
// time, PDUs by hand for bad input) with the test's helpers.
type initiator struct {
	*nvmfhost.Conn
	t      testing.TB
	nc     net.Conn
	cntlid uint16
}

func dialInit(t testing.TB, addr string, hdgst, ddgst bool) *initiator {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := nvmfhost.Dial(ctx, addr, hdgst, ddgst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.NetConn().SetDeadline(time.Now().Add(60 * time.Second))
	return &initiator{Conn: c, t: t, nc: c.NetConn()}
}

// pdu frames a PDU with the negotiated digests.
func (in *initiator) pdu(typ, flags uint8, hdr []byte, data []byte) []byte {
	return in.Frame(typ, flags, hdr, data)
}

type result struct {
	status uint16 // SCT<<8|SC (no DNR)
	dnr    bool
	dw0    uint32
	data   []byte
}

// newSQE builds a submission entry.
func newSQE(op uint8, nsid uint32, cdw ...uint32) []byte { return nvmfhost.NewSQE(op, nsid, cdw...) }

// do sends one command: out is its host-to-controller data (in the capsule
// when inCapsule, else by R2T), in the length of controller-to-host data.
func (in *initiator) do(sqe []byte, out []byte, inCapsule bool, inLen int) (result, error) {
	r, err := in.Do(sqe, out, inCapsule, inLen)
	return result{status: r.Status, dnr: r.DNR, dw0: r.DW0, data: r.Data}, err
}

// read reads one PDU from the controller and checks its digests.
func (in *initiator) read() (typ, flags uint8, hdr, data []byte, err error) {
	p, err := in.ReadPDU()
	return p.Type, p.Flags, p.Hdr, p.Data, err
}

// connect sends Fabrics Connect for qid (a queue of 32).
func (in *initiator) connect(subnqn, hostnqn string, qid uint16, cntlid uint16, kato time.Duration) (result, error) {
	r, err := in.Connect(subnqn, hostnqn, qid, cntlid, 32, kato)
	if err == nil && r.Status == 0 {
		in.cntlid = in.CNTLID
	}
	return result{status: r.Status, dnr: r.DNR, dw0: r.DW0, data: r.Data}, err
}

func (in *initiator) must(r result, err error) result {
	in.t.Helper()
	if err != nil {
		in.t.Fatal(err)
	}
	if r.status != 0 {
		in.t.Fatalf("status %#x", r.status)
	}
	return r
}

func (in *initiator) prop(get bool, ofst uint32, v uint64) result {
	r, err := in.Property(get, ofst, v)
	return in.must(result{status: r.Status, dnr: r.DNR, dw0: r.DW0, data: r.Data}, err)
}

// rw builds a Read or Write of nlb blocks at slba (512-byte LBAs).
func rw(op uint8, slba uint64, nlb int) []byte { return nvmfhost.RW(op, slba, nlb) }
