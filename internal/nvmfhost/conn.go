// Package nvmfhost is a small NVMe over TCP host (initiator): the ICReq
// handshake, header and data digests, Fabrics Connect of an admin queue and
// I/O queues, and Read and Write with many commands in flight per queue,
// their data in the capsule or moved by R2T and H2CData.
//
// Conn is one queue's connection, used one command at a time (Do) or PDU by
// PDU (Frame, WritePDU, ReadPDU: what the target's tests use to send bad
// input); Queue runs many commands on one Conn at once; Host connects a
// controller with its I/O queues. Debian has no user-space NVMe/TCP
// initiator, so this one drives `basalt bench`'s NVMe/TCP targets and the
// nvmf package's tests; the Linux kernel's initiator judges the target.
package nvmfhost

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/sockio"
)

// PDU types (NVMe/TCP transport binding).
const (
	PDUICReq      = 0x00
	PDUICResp     = 0x01
	PDUH2CTermReq = 0x02
	PDUC2HTermReq = 0x03
	PDUCapsuleCmd = 0x04
	PDUCapsuleRsp = 0x05
	PDUH2CData    = 0x06
	PDUC2HData    = 0x07
	PDUR2T        = 0x09
)

// PDU header flags.
const (
	FlagHDGST   = 0x01
	FlagDDGST   = 0x02
	FlagLast    = 0x04
	FlagSuccess = 0x08
)

// Header lengths.
const (
	chLen      = 8
	icLen      = 128
	capsuleLen = 72
	dataHdrLen = 24
	SQELen     = 64
)

// SGL descriptor types.
const (
	sglInCapsule = 0x01
	sglTransport = 0x5a
)

// Opcodes the host sends.
const (
	OpFabrics         = 0x7f
	FctypePropertySet = 0x00
	FctypeConnect     = 0x01
	FctypePropertyGet = 0x04
	AdminIdentify     = 0x06
	AdminSetFeatures  = 0x09
	IORead            = 0x02
	IOWrite           = 0x01
)

// DNR is the Do Not Retry bit of Result.Status's raw word.
const dnrBit = 0x4000

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C is the digest NVMe/TCP uses for headers and data.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Result is a command's completion.
type Result struct {
	Status uint16 // SCT<<8 | SC, without DNR
	DNR    bool
	DW0    uint32
	Data   []byte // controller-to-host data, when Do was given no buffer
}

// StatusError is a completion with a nonzero status.
type StatusError struct{ Status uint16 }

func (e StatusError) Error() string { return fmt.Sprintf("nvme status %#x", e.Status) }

// Err returns the completion's status as an error, nil on success.
func (r Result) Err() error {
	if r.Status != 0 {
		return StatusError{r.Status}
	}
	return nil
}

// Conn is one NVMe/TCP connection (one queue). Do is for one command at a
// time; Pipeline turns the Conn into a Queue for many.
type Conn struct {
	nc           net.Conn
	br           *bufio.Reader // over sockio: raw reads, see its package doc
	wmu          sync.Mutex
	w            *sockio.Writer // under wmu
	hdgst, ddgst bool
	maxH2C       int
	cid          uint16
	// CNTLID is the controller id the last successful Connect returned.
	CNTLID uint16
	// HostID is the Host Identifier Connect sends (reservations tell hosts
	// apart by it).
	HostID [16]byte
}

// Dial connects to addr and exchanges ICReq/ICResp, asking for the digests.
func Dial(ctx context.Context, addr string, hdgst, ddgst bool) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c := &Conn{nc: nc, br: bufio.NewReaderSize(sockio.NewReader(nc), 256<<10), w: sockio.NewWriter(nc), hdgst: hdgst, ddgst: ddgst}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
		defer nc.SetDeadline(time.Time{})
	}
	req := make([]byte, icLen)
	putCH(req, PDUICReq, 0, icLen, 0, icLen)
	if hdgst {
		req[11] |= 1
	}
	if ddgst {
		req[11] |= 2
	}
	if _, err := nc.Write(req); err != nil {
		nc.Close()
		return nil, err
	}
	rsp := make([]byte, icLen)
	if _, err := io.ReadFull(c.br, rsp); err != nil {
		nc.Close()
		return nil, fmt.Errorf("ICResp: %w", err)
	}
	if rsp[0] != PDUICResp || rsp[11] != req[11] {
		nc.Close()
		return nil, fmt.Errorf("ICResp type %#x digests %#x, want %#x", rsp[0], rsp[11], req[11])
	}
	c.maxH2C = int(binary.LittleEndian.Uint32(rsp[12:]))
	if c.maxH2C < 4096 {
		nc.Close()
		return nil, fmt.Errorf("ICResp MAXH2CDATA %d", c.maxH2C)
	}
	return c, nil
}

// NetConn is the TCP connection.
func (c *Conn) NetConn() net.Conn { return c.nc }

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// MaxH2CData is the largest H2CData PDU the controller accepts.
func (c *Conn) MaxH2CData() int { return c.maxH2C }

func putCH(b []byte, typ, flags, hlen, pdo uint8, plen uint32) {
	b[0], b[1], b[2], b[3] = typ, flags, hlen, pdo
	binary.LittleEndian.PutUint32(b[4:], plen)
}

// Frame builds a PDU of type typ from its header (common header included, filled
// in here) and data, with the negotiated digests.
func (c *Conn) Frame(typ, flags uint8, hdr []byte, data []byte) []byte {
	hd, dd := 0, 0
	if c.hdgst {
		hd, flags = 4, flags|FlagHDGST
	}
	if c.ddgst && len(data) > 0 {
		dd, flags = 4, flags|FlagDDGST
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
		b = binary.LittleEndian.AppendUint32(b, CRC32C(b[:len(hdr)]))
	}
	if len(data) > 0 {
		b = append(b, data...)
		if dd > 0 {
			b = binary.LittleEndian.AppendUint32(b, CRC32C(data))
		}
	}
	return b
}

// WritePDU writes bytes (one or more framed PDUs) atomically with respect to
// other writers.
func (c *Conn) WritePDU(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.w.Write([][]byte{b})
	return err
}

// writeBufs writes bufs with one writev (more when the socket is full),
// atomically with respect to other writers.
func (c *Conn) writeBufs(bufs [][]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.w.Write(bufs)
	return err
}

// PDU is one PDU read from the controller. Hdr includes the common header;
// Data is C2HData's data (its digest checked).
type PDU struct {
	Type, Flags uint8
	Hdr, Data   []byte
}

// ReadPDU reads one PDU from the controller and checks its digests.
func (c *Conn) ReadPDU() (PDU, error) { return c.readPDU(nil, nil) }

// maxHdr bounds the header (and digest) of a PDU read into a scratch buffer.
const maxHdr = 256

// readPDU is ReadPDU. With scratch (at least maxHdr bytes) the header is
// read into it (valid until the next read) rather than a fresh buffer; with
// dst, a C2HData PDU's data goes straight to where dst(hdr) says (nil: a
// fresh buffer), so a read's data is copied once, from the socket.
func (c *Conn) readPDU(scratch []byte, dst func(hdr []byte) []byte) (PDU, error) {
	var ch []byte
	if scratch != nil {
		ch = scratch[:chLen]
	} else {
		ch = make([]byte, chLen)
	}
	if _, err := io.ReadFull(c.br, ch); err != nil {
		return PDU{}, err
	}
	p := PDU{Type: ch[0], Flags: ch[1]}
	hlen, pdo, plen := int(ch[2]), int(ch[3]), int(binary.LittleEndian.Uint32(ch[4:]))
	if plen < chLen || hlen < chLen || hlen > plen || plen > 16<<20 {
		return p, fmt.Errorf("PDU type %#x: HLEN %d PLEN %d", p.Type, hlen, plen)
	}
	hd := 0
	if c.hdgst {
		hd = 4
		if p.Flags&FlagHDGST == 0 {
			return p, errors.New("header digest flag missing")
		}
		if hlen+4 > plen {
			return p, errors.New("bad header digest")
		}
	}
	if p.Type != PDUC2HData || scratch == nil || hlen+hd > maxHdr {
		// Header and data in one buffer.
		all := make([]byte, plen)
		copy(all, ch)
		if _, err := io.ReadFull(c.br, all[chLen:]); err != nil {
			return p, err
		}
		p.Hdr = all[:hlen]
		if hd > 0 && binary.LittleEndian.Uint32(all[hlen:]) != CRC32C(p.Hdr) {
			return p, errors.New("bad header digest")
		}
		if p.Type == PDUC2HData {
			if pdo > plen {
				return p, fmt.Errorf("C2HData PDO %d", pdo)
			}
			return p, c.c2hData(&p, pdo, plen, hd, all[pdo:], false)
		}
		return p, nil
	}
	h := scratch[:hlen+hd]
	if _, err := io.ReadFull(c.br, h[chLen:]); err != nil {
		return p, err
	}
	p.Hdr = h[:hlen]
	if hd > 0 && binary.LittleEndian.Uint32(h[hlen:]) != CRC32C(p.Hdr) {
		return p, errors.New("bad header digest")
	}
	if pdo < hlen+hd || pdo > plen {
		return p, fmt.Errorf("C2HData PDO %d", pdo)
	}
	if _, err := c.br.Discard(pdo - hlen - hd); err != nil {
		return p, err
	}
	var buf []byte
	if n := plen - pdo; dst != nil {
		if d := dst(p.Hdr); d != nil && len(d) == int(binary.LittleEndian.Uint32(p.Hdr[16:])) && len(d) <= n {
			buf = d
		}
	}
	return p, c.c2hData(&p, pdo, plen, hd, buf, true)
}

// c2hData checks a C2HData PDU's layout and data digest and sets p.Data.
// When read, data and digest are still in the reader: they are read into
// buf (nil: a fresh buffer); else buf holds them.
func (c *Conn) c2hData(p *PDU, pdo, plen, hd int, buf []byte, read bool) error {
	dd := 0
	if c.ddgst {
		dd = 4
		if p.Flags&FlagDDGST == 0 {
			return errors.New("data digest flag missing")
		}
	}
	hlen := len(p.Hdr)
	if pdo != hlen+hd || pdo > plen-dd {
		return fmt.Errorf("C2HData PDO %d", pdo)
	}
	n := plen - pdo - dd
	if int(binary.LittleEndian.Uint32(p.Hdr[16:])) != n {
		return errors.New("C2HData length mismatch")
	}
	var dgst []byte
	if read {
		if buf == nil {
			buf = make([]byte, n)
		}
		p.Data = buf[:n]
		if _, err := io.ReadFull(c.br, p.Data); err != nil {
			return err
		}
		if dd > 0 {
			var d [4]byte
			if _, err := io.ReadFull(c.br, d[:]); err != nil {
				return err
			}
			dgst = d[:]
		}
	} else {
		p.Data = buf[:n]
		dgst = buf[n:]
	}
	if dd > 0 && binary.LittleEndian.Uint32(dgst) != CRC32C(p.Data) {
		return errors.New("bad data digest")
	}
	return nil
}

// NewSQE builds a submission entry with CDW10.. set to cdw.
func NewSQE(op uint8, nsid uint32, cdw ...uint32) []byte {
	b := make([]byte, SQELen)
	b[0] = op
	binary.LittleEndian.PutUint32(b[4:], nsid)
	for i, v := range cdw {
		binary.LittleEndian.PutUint32(b[40+4*i:], v)
	}
	return b
}

// RW builds a Read or Write of nlb blocks at slba.
func RW(op uint8, slba uint64, nlb int) []byte {
	return NewSQE(op, 1, uint32(slba), uint32(slba>>32), uint32(nlb-1))
}

// capsule frames sqe (whose CID is set) with its data descriptor: out in the
// capsule when inCapsule, else a transport data block of len(out)+inLen.
func (c *Conn) capsule(sqe []byte, out []byte, inCapsule bool, inLen int) []byte {
	binary.LittleEndian.PutUint32(sqe[32:], uint32(len(out)+inLen))
	sqe[39] = sglTransport
	var data []byte
	if inCapsule && len(out) > 0 {
		sqe[39] = sglInCapsule
		data = out
	}
	hdr := make([]byte, capsuleLen)
	copy(hdr[chLen:], sqe)
	return c.Frame(PDUCapsuleCmd, 0, hdr, data)
}

// h2c frames the data an R2T asks for (offset off, length n of out) as
// H2CData PDUs of at most MaxH2CData each.
func (c *Conn) h2c(cid, tag uint16, out []byte, off, n int) ([]byte, error) {
	if off < 0 || n <= 0 || off+n > len(out) {
		return nil, fmt.Errorf("R2T for %d bytes at %d of a %d-byte write", n, off, len(out))
	}
	var b []byte
	for o := off; o < off+n; o += c.maxH2C {
		e := min(o+c.maxH2C, off+n)
		dh := make([]byte, dataHdrLen)
		binary.LittleEndian.PutUint16(dh[8:], cid)
		binary.LittleEndian.PutUint16(dh[10:], tag)
		binary.LittleEndian.PutUint32(dh[12:], uint32(o))
		binary.LittleEndian.PutUint32(dh[16:], uint32(e-o))
		fl := uint8(0)
		if e == off+n {
			fl = FlagLast
		}
		b = append(b, c.Frame(PDUH2CData, fl, dh, out[o:e])...)
	}
	return b, nil
}

func parseRsp(h []byte) (cid uint16, r Result) {
	q := h[chLen:]
	st := binary.LittleEndian.Uint16(q[14:]) >> 1
	return binary.LittleEndian.Uint16(q[12:]), Result{Status: st & 0x7ff, DNR: st&dnrBit != 0, DW0: binary.LittleEndian.Uint32(q[0:])}
}

// NextCID advances and returns the Conn's command id counter (for callers
// building their own capsules).
func (c *Conn) NextCID() uint16 {
	c.cid++
	return c.cid
}

// Do sends one command and waits for its completion; no other command may
// be in flight on the Conn. out is its host-to-controller data (in the
// capsule when inCapsule, else moved by R2T), inLen the length of its
// controller-to-host data.
func (c *Conn) Do(sqe []byte, out []byte, inCapsule bool, inLen int) (Result, error) {
	cid := c.NextCID()
	binary.LittleEndian.PutUint16(sqe[2:], cid)
	if err := c.WritePDU(c.capsule(sqe, out, inCapsule, inLen)); err != nil {
		return Result{}, err
	}
	var got []byte
	for {
		p, err := c.ReadPDU()
		if err != nil {
			return Result{}, err
		}
		h := p.Hdr
		switch p.Type {
		case PDUR2T:
			if rc := binary.LittleEndian.Uint16(h[8:]); rc != cid {
				return Result{}, fmt.Errorf("R2T for cid %d, sent %d", rc, cid)
			}
			b, err := c.h2c(cid, binary.LittleEndian.Uint16(h[10:]), out,
				int(binary.LittleEndian.Uint32(h[12:])), int(binary.LittleEndian.Uint32(h[16:])))
			if err != nil {
				return Result{}, err
			}
			if err := c.WritePDU(b); err != nil {
				return Result{}, err
			}
		case PDUC2HData:
			if off := int(binary.LittleEndian.Uint32(h[12:])); off != len(got) {
				return Result{}, fmt.Errorf("C2HData at %d after %d bytes", off, len(got))
			}
			got = append(got, p.Data...)
			if p.Flags&FlagSuccess != 0 {
				return Result{Data: got}, nil
			}
		case PDUCapsuleRsp:
			rc, r := parseRsp(h)
			if rc != cid {
				return Result{}, fmt.Errorf("response for cid %d, sent %d", rc, cid)
			}
			r.Data = got
			return r, nil
		case PDUC2HTermReq:
			return Result{}, fmt.Errorf("C2HTermReq FES %#x", binary.LittleEndian.Uint16(h[8:]))
		default:
			return Result{}, fmt.Errorf("unexpected PDU type %#x", p.Type)
		}
	}
}

// Connect sends Fabrics Connect for queue qid of controller cntlid (0xffff:
// a new controller, on the admin queue) with sqsize entries and keep-alive
// timeout kato (0: none).
func (c *Conn) Connect(subnqn, hostnqn string, qid, cntlid uint16, sqsize int, kato time.Duration) (Result, error) {
	sqe := NewSQE(OpFabrics, 0)
	sqe[4] = FctypeConnect
	binary.LittleEndian.PutUint16(sqe[42:], qid)
	binary.LittleEndian.PutUint16(sqe[44:], uint16(sqsize-1))
	binary.LittleEndian.PutUint32(sqe[48:], uint32(kato/time.Millisecond))
	d := make([]byte, 1024)
	copy(d[0:16], c.HostID[:])
	binary.LittleEndian.PutUint16(d[16:], cntlid)
	copy(d[256:], subnqn)
	copy(d[512:], hostnqn)
	r, err := c.Do(sqe, d, true, 0)
	if err == nil && r.Status == 0 {
		c.CNTLID = uint16(r.DW0)
	}
	return r, err
}

// Property reads (get) or writes a controller property at offset ofst
// (8-byte access).
func (c *Conn) Property(get bool, ofst uint32, v uint64) (Result, error) {
	sqe := NewSQE(OpFabrics, 0)
	sqe[4] = FctypePropertySet
	if get {
		sqe[4] = FctypePropertyGet
	}
	sqe[40] = 1
	binary.LittleEndian.PutUint32(sqe[44:], ofst)
	binary.LittleEndian.PutUint64(sqe[48:], v)
	return c.Do(sqe, nil, false, 0)
}

// SetMaxH2CData lowers the size of the H2CData PDUs this host sends below
// the controller's MAXH2CDATA (to exercise the controller's reassembly).
func (c *Conn) SetMaxH2CData(n int) {
	if n > 0 && n < c.maxH2C {
		c.maxH2C = n
	}
}

// Framer returns a Conn with no connection that only frames PDUs with the
// given digests (Frame): for building byte streams, such as fuzz seeds.
func Framer(hdgst, ddgst bool) *Conn { return &Conn{hdgst: hdgst, ddgst: ddgst} }
