package nvmf

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
)

// memDisk is an in-memory frontend.Backend.
type memDisk struct {
	mu    sync.Mutex
	data  []byte
	ro    bool
	nOpen int // Open calls
}

func (m *memDisk) opens() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nOpen
}

func (m *memDisk) Info() frontend.Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	return frontend.Info{Size: int64(len(m.data)), ReadOnly: m.ro, CanFlush: true, CanFUA: true,
		CanTrim: true, CanWriteZeroes: true, BlockSizes: frontend.BlockSizes{Minimum: 512}}
}
func (m *memDisk) Check(context.Context) error { return nil }
func (m *memDisk) Close() error                { return nil }
func (m *memDisk) Submit(op api.Op, buf []byte, off, n int64, done func(error)) {
	m.mu.Lock()
	switch op {
	case api.OpRead:
		copy(buf, m.data[off:off+n])
	case api.OpWrite:
		copy(m.data[off:], buf)
	case api.OpTrim, api.OpWriteZeroes:
		clear(m.data[off : off+n])
	}
	m.mu.Unlock()
	done(nil)
}

type memOpener map[string]*memDisk

func (o memOpener) Open(_ context.Context, name string) (frontend.Backend, error) {
	if d, ok := o[name]; ok {
		d.mu.Lock()
		d.nOpen++
		d.mu.Unlock()
		return d, nil
	}
	return nil, frontend.ErrNoSuchExport
}
func (o memOpener) Stat(ctx context.Context, name string) (frontend.Info, error) {
	if d, ok := o[name]; ok {
		return d.Info(), nil
	}
	return frontend.Info{}, frontend.ErrNoSuchExport
}
func (o memOpener) List(context.Context) ([]string, error) {
	var names []string
	for n := range o {
		names = append(names, n)
	}
	return names, nil
}
func (o memOpener) Classify(err error) error { return err }

const (
	hostA = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002"
)

// startServer serves volume "vol" (1 MiB) to hostA only.
func startServer(t testing.TB, mod func(*Config)) (*Server, string, *memDisk) {
	t.Helper()
	disk := &memDisk{data: make([]byte, 1<<20)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: memOpener{"vol": disk}, Logger: quiet})
	cfg := Config{Exports: ex, AllowedHosts: []string{hostA}, Logger: quiet}
	if mod != nil {
		mod(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close(); ex.Close() })
	return s, ln.Addr().String(), disk
}

// initiator is a small NVMe/TCP host: one queue, one command at a time.
type initiator struct {
	t            testing.TB
	nc           net.Conn
	br           *bufio.Reader
	hdgst, ddgst bool
	maxH2C       int // split H2CData to at most this much
	cid          uint16
	cntlid       uint16
	hostID       [16]byte // sent in Connect
}

func dialInit(t testing.TB, addr string, hdgst, ddgst bool) *initiator {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	in := &initiator{t: t, nc: nc, br: bufio.NewReader(nc), hdgst: hdgst, ddgst: ddgst}
	req := make([]byte, icLen)
	putCH(req, pduICReq, 0, icLen, 0, icLen)
	if hdgst {
		req[11] |= 1
	}
	if ddgst {
		req[11] |= 2
	}
	if _, err := nc.Write(req); err != nil {
		t.Fatal(err)
	}
	rsp := make([]byte, icLen)
	if _, err := io.ReadFull(in.br, rsp); err != nil {
		t.Fatalf("ICResp: %v", err)
	}
	if rsp[0] != pduICResp || rsp[11] != req[11] {
		t.Fatalf("ICResp type %#x digests %#x, want %#x", rsp[0], rsp[11], req[11])
	}
	in.maxH2C = int(binary.LittleEndian.Uint32(rsp[12:]))
	return in
}

// pdu frames a PDU with the negotiated digests.
func (in *initiator) pdu(typ, flags uint8, hdr []byte, data []byte) []byte {
	hd, dd := 0, 0
	if in.hdgst {
		hd, flags = 4, flags|flagHDGST
	}
	if in.ddgst && len(data) > 0 {
		dd, flags = 4, flags|flagDDGST
	}
	pdo := 0
	plen := len(hdr) + hd
	if len(data) > 0 {
		pdo = plen
		plen += len(data) + dd
	}
	b := make([]byte, 0, plen)
	b = append(b, hdr...)
	putCH(b, typ, flags, uint8(len(hdr)), uint8(pdo), uint32(plen))
	if hd > 0 {
		b = binary.LittleEndian.AppendUint32(b, crc32c(b[:len(hdr)]))
	}
	if len(data) > 0 {
		b = append(b, data...)
		if dd > 0 {
			b = binary.LittleEndian.AppendUint32(b, crc32c(data))
		}
	}
	return b
}

type result struct {
	status uint16 // SCT<<8|SC (no DNR)
	dnr    bool
	dw0    uint32
	data   []byte
}

// sqe builds a submission entry.
func newSQE(op uint8, nsid uint32, cdw ...uint32) []byte {
	b := make([]byte, sqeLen)
	b[0] = op
	binary.LittleEndian.PutUint32(b[4:], nsid)
	for i, v := range cdw {
		binary.LittleEndian.PutUint32(b[40+4*i:], v)
	}
	return b
}

// do sends one command: out is its host-to-controller data (in the capsule
// when inCapsule, else by R2T), in the length of controller-to-host data.
func (in *initiator) do(sqe []byte, out []byte, inCapsule bool, inLen int) (result, error) {
	in.cid++
	binary.LittleEndian.PutUint16(sqe[2:], in.cid)
	n := len(out) + inLen
	binary.LittleEndian.PutUint32(sqe[32:], uint32(n))
	sqe[39] = sglTransport
	var data []byte
	if inCapsule && len(out) > 0 {
		sqe[39] = sglInCapsule
		data = out
	}
	hdr := make([]byte, capsuleLen)
	copy(hdr[chLen:], sqe)
	if _, err := in.nc.Write(in.pdu(pduCapsuleCmd, 0, hdr, data)); err != nil {
		return result{}, err
	}
	var got []byte
	for {
		typ, flags, h, d, err := in.read()
		if err != nil {
			return result{}, err
		}
		switch typ {
		case pduR2T:
			if cid := binary.LittleEndian.Uint16(h[8:]); cid != in.cid {
				return result{}, fmt.Errorf("R2T for cid %d, sent %d", cid, in.cid)
			}
			tag := binary.LittleEndian.Uint16(h[10:])
			off := int(binary.LittleEndian.Uint32(h[12:]))
			l := int(binary.LittleEndian.Uint32(h[16:]))
			for o := off; o < off+l; o += in.maxH2C {
				e := min(o+in.maxH2C, off+l)
				dh := make([]byte, dataHdrLen)
				binary.LittleEndian.PutUint16(dh[8:], in.cid)
				binary.LittleEndian.PutUint16(dh[10:], tag)
				binary.LittleEndian.PutUint32(dh[12:], uint32(o))
				binary.LittleEndian.PutUint32(dh[16:], uint32(e-o))
				fl := uint8(0)
				if e == off+l {
					fl = flagLast
				}
				if _, err := in.nc.Write(in.pdu(pduH2CData, fl, dh, out[o:e])); err != nil {
					return result{}, err
				}
			}
		case pduC2HData:
			off := int(binary.LittleEndian.Uint32(h[12:]))
			if off != len(got) {
				return result{}, fmt.Errorf("C2HData at %d after %d bytes", off, len(got))
			}
			got = append(got, d...)
			if flags&flagSuccess != 0 {
				return result{data: got}, nil
			}
		case pduCapsuleRsp:
			q := h[chLen:]
			if cid := binary.LittleEndian.Uint16(q[12:]); cid != in.cid {
				return result{}, fmt.Errorf("response for cid %d, sent %d", cid, in.cid)
			}
			st := binary.LittleEndian.Uint16(q[14:]) >> 1
			return result{status: st & 0x7ff, dnr: st&dnr != 0, dw0: binary.LittleEndian.Uint32(q[0:]), data: got}, nil
		case pduC2HTermReq:
			return result{}, fmt.Errorf("C2HTermReq FES %#x", binary.LittleEndian.Uint16(h[8:]))
		default:
			return result{}, fmt.Errorf("unexpected PDU type %#x", typ)
		}
	}
}

// read reads one PDU from the controller and checks its digests.
func (in *initiator) read() (typ, flags uint8, hdr, data []byte, err error) {
	ch := make([]byte, chLen)
	if _, err = io.ReadFull(in.br, ch); err != nil {
		return
	}
	typ, flags = ch[0], ch[1]
	hlen, pdo, plen := int(ch[2]), int(ch[3]), int(binary.LittleEndian.Uint32(ch[4:]))
	rest := make([]byte, plen-chLen)
	if _, err = io.ReadFull(in.br, rest); err != nil {
		return
	}
	all := append(ch, rest...)
	hdr = all[:hlen]
	hd := 0
	if in.hdgst {
		hd = 4
		if flags&flagHDGST == 0 {
			err = errors.New("header digest flag missing")
			return
		}
		if binary.LittleEndian.Uint32(all[hlen:]) != crc32c(hdr) {
			err = errors.New("bad header digest")
			return
		}
	}
	if typ == pduC2HData {
		dd := 0
		if in.ddgst {
			dd = 4
			if flags&flagDDGST == 0 {
				err = errors.New("data digest flag missing")
				return
			}
		}
		if pdo != hlen+hd {
			err = fmt.Errorf("C2HData PDO %d", pdo)
			return
		}
		data = all[pdo : plen-dd]
		if int(binary.LittleEndian.Uint32(hdr[16:])) != len(data) {
			err = errors.New("C2HData length mismatch")
			return
		}
		if dd > 0 && binary.LittleEndian.Uint32(all[plen-dd:]) != crc32c(data) {
			err = errors.New("bad data digest")
			return
		}
	}
	return
}

// connect sends Fabrics Connect for qid.
func (in *initiator) connect(subnqn, hostnqn string, qid uint16, cntlid uint16, kato time.Duration) (result, error) {
	sqe := newSQE(opFabrics, 0)
	sqe[4] = fctypeConnect
	binary.LittleEndian.PutUint16(sqe[42:], qid)
	binary.LittleEndian.PutUint16(sqe[44:], 31)
	binary.LittleEndian.PutUint32(sqe[48:], uint32(kato/time.Millisecond))
	d := make([]byte, 1024)
	copy(d[0:16], in.hostID[:])
	binary.LittleEndian.PutUint16(d[16:], cntlid)
	copy(d[256:], subnqn)
	copy(d[512:], hostnqn)
	r, err := in.do(sqe, d, true, 0)
	if err == nil && r.status == 0 {
		in.cntlid = uint16(r.dw0)
	}
	return r, err
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
	sqe := newSQE(opFabrics, 0)
	sqe[4] = fctypePropertySet
	if get {
		sqe[4] = fctypePropertyGet
	}
	sqe[40] = 1
	binary.LittleEndian.PutUint32(sqe[44:], ofst)
	binary.LittleEndian.PutUint64(sqe[48:], v)
	return in.must(in.do(sqe, nil, false, 0))
}

// rw builds a Read or Write of nlb blocks at slba (512-byte LBAs).
func rw(op uint8, slba uint64, nlb int) []byte {
	return newSQE(op, 1, uint32(slba), uint32(slba>>32), uint32(nlb-1))
}
