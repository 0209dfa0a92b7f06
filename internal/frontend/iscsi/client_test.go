package iscsi

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// isidCounter gives each test client its own ISID (the same ISID would
// reinstate, that is replace, another client's session).
var isidCounter atomic.Uint32

// testClient is a minimal iSCSI initiator for tests of what real initiators
// do not exercise (refused logins, digests, bad PDUs).
type testClient struct {
	t      testing.TB
	nc     net.Conn
	br     *bufio.Reader
	itt    uint32
	cmdSN  uint32
	statSN uint32
	hd, dd bool
	isid   [6]byte
}

func dialClient(t testing.TB, addr string) *testClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	n := isidCounter.Add(1)
	return &testClient{t: t, nc: nc, br: bufio.NewReader(nc), isid: [6]byte{0x80, 1, 2, 3, byte(n >> 8), byte(n)}, cmdSN: 1}
}

func (c *testClient) write(p *pdu) {
	c.t.Helper()
	if _, err := c.nc.Write(appendPDU(nil, p, c.hd, c.dd)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read reads one target PDU (target opcodes fail pdu.check, so it parses
// by hand).
func (c *testClient) read() (*pdu, error) {
	p := &pdu{}
	if _, err := readFull(c.br, p.bhs[:]); err != nil {
		return nil, err
	}
	if c.hd {
		var d [4]byte
		if _, err := readFull(c.br, d[:]); err != nil {
			return nil, err
		}
		if d != digest(p.bhs[:]) {
			return nil, errors.New("bad header digest from the target")
		}
	}
	n := p.dataLen()
	if n > 0 {
		buf := make([]byte, pad4(n))
		if _, err := readFull(c.br, buf); err != nil {
			return nil, err
		}
		if c.dd {
			var d [4]byte
			if _, err := readFull(c.br, d[:]); err != nil {
				return nil, err
			}
			if d != digest(buf) {
				return nil, errors.New("bad data digest from the target")
			}
		}
		p.data = buf[:n]
	}
	return p, nil
}

func readFull(br *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := br.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *testClient) mustRead() *pdu {
	c.t.Helper()
	p, err := c.read()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return p
}

// login sends one Login Request and returns the response's status, flags
// and keys.
func (c *testClient) login(csg, nsg int, transit bool, kvs ...string) (status uint16, flags byte, keys map[string]string) {
	c.t.Helper()
	p := &pdu{}
	p.bhs[0] = 0x40 | opLoginReq
	p.bhs[1] = byte(csg) << 2
	if transit {
		p.bhs[1] |= 0x80 | byte(nsg)
	}
	copy(p.bhs[8:14], c.isid[:])
	c.itt++
	p.put32(16, c.itt)
	p.put32(24, c.cmdSN)
	p.put32(28, c.statSN)
	for i := 0; i+1 < len(kvs); i += 2 {
		p.data = appendText(p.data, kvs[i], kvs[i+1])
	}
	c.write(p)
	r := c.mustRead()
	if r.opcode() != opLoginResp {
		c.t.Fatalf("login: got opcode %#x", r.opcode())
	}
	c.statSN = r.u32(24) + 1
	pairs, err := parseText(r.data)
	if err != nil {
		c.t.Fatalf("login response text: %v", err)
	}
	keys = map[string]string{}
	for _, x := range pairs {
		keys[x.k] = x.v
	}
	return binary.BigEndian.Uint16(r.bhs[36:]), r.bhs[1], keys
}

// loginNormal logs in to target with no authentication, negotiating the
// given extra keys, to full feature phase; it fails the test on a refusal.
func (c *testClient) loginNormal(initiator, target string, kvs ...string) map[string]string {
	c.t.Helper()
	keys := append([]string{"InitiatorName", initiator, "SessionType", "Normal", "TargetName", target,
		"AuthMethod", "None"}, kvs...)
	st, _, resp := c.login(0, 3, true, keys...)
	if st != 0 {
		c.t.Fatalf("login to %s: status %#04x", target, st)
	}
	c.hd = resp["HeaderDigest"] == "CRC32C"
	c.dd = resp["DataDigest"] == "CRC32C"
	return resp
}

// command sends a SCSI command with immediate data (write) or expecting
// edtl bytes (read), and collects Data-In and the status.
func (c *testClient) command(cdb []byte, edtl int, out []byte) (status byte, data []byte, sense []byte) {
	c.t.Helper()
	p := &pdu{data: out}
	p.bhs[0] = opSCSICmd
	p.bhs[1] = 0x80
	if out != nil {
		p.bhs[1] |= 0x20
	} else if edtl > 0 {
		p.bhs[1] |= 0x40
	}
	c.itt++
	p.put32(16, c.itt)
	p.put32(20, uint32(edtl))
	p.put32(24, c.cmdSN)
	c.cmdSN++
	p.put32(28, c.statSN)
	copy(p.bhs[32:48], cdb)
	c.write(p)
	for {
		r := c.mustRead()
		switch r.opcode() {
		case opDataIn:
			data = append(data, r.data...)
			if r.bhs[1]&0x01 != 0 {
				return r.bhs[3], data, nil
			}
		case opSCSIResp:
			if len(r.data) >= 2 {
				sense = r.data[2:]
			}
			return r.bhs[3], data, sense
		default:
			c.t.Fatalf("command: unexpected opcode %#x", r.opcode())
		}
	}
}

// expectClosed asserts the target closed the connection.
func (c *testClient) expectClosed() {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		_, err := c.read()
		if err == nil {
			continue // responses queued before the close
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.t.Fatalf("the target did not close the connection")
		}
		return
	}
}

func cdb10(op byte, lba uint32, blocks uint16) []byte {
	b := make([]byte, 16)
	b[0] = op
	binary.BigEndian.PutUint32(b[2:], lba)
	binary.BigEndian.PutUint16(b[7:], blocks)
	return b
}

func chapHex(alg int, id string, secret string, challenge string) string {
	n, _ := strconv.Atoi(id)
	ch, _ := parseBinary(challenge)
	return hexValue(chapResponse(alg, byte(n), secret, ch))
}
