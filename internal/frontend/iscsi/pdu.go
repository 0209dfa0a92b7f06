package iscsi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Opcodes (RFC 7143 11.2.1.2). Initiator opcodes, then target opcodes.
const (
	opNopOut     = 0x00
	opSCSICmd    = 0x01
	opTaskMgmt   = 0x02
	opLoginReq   = 0x03
	opTextReq    = 0x04
	opDataOut    = 0x05
	opLogoutReq  = 0x06
	opSNACK      = 0x10
	opNopIn      = 0x20
	opSCSIResp   = 0x21
	opTaskResp   = 0x22
	opLoginResp  = 0x23
	opTextResp   = 0x24
	opDataIn     = 0x25
	opLogoutResp = 0x26
	opR2T        = 0x31
	opReject     = 0x3f
)

// bhsLen is the Basic Header Segment's length.
const bhsLen = 48

// reservedTag is the "no tag" value of ITT and TTT.
const reservedTag = 0xffffffff

// Reject reasons (RFC 7143 11.17.1).
const (
	rejectDataDigest     = 0x02
	rejectProtocolError  = 0x04
	rejectNotSupported   = 0x05
	rejectInvalidField   = 0x09
	rejectWaitingLogout  = 0x0c
	rejectImmediateRefus = 0x06
)

var (
	// ErrMalformed: a PDU that cannot be parsed (a bad length, an unknown
	// opcode where none may be, AHS garbage). The connection is closed.
	ErrMalformed = errors.New("iscsi: malformed PDU")
	// ErrHeaderDigest: a header digest did not match; nothing in the header can
	// be trusted, so the connection is closed.
	ErrHeaderDigest = errors.New("iscsi: header digest mismatch")
	// errDataDigest: a data digest did not match; the PDU is rejected and the
	// connection lives on.
	errDataDigest = errors.New("iscsi: data digest mismatch")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// pdu is one protocol data unit: the 48-byte basic header segment, any
// additional header segments, and the data segment (unpadded).
type pdu struct {
	bhs  [bhsLen]byte
	ahs  []byte
	data []byte
}

func (p *pdu) opcode() byte     { return p.bhs[0] & 0x3f }
func (p *pdu) immediate() bool  { return p.bhs[0]&0x40 != 0 }
func (p *pdu) final() bool      { return p.bhs[1]&0x80 != 0 }
func (p *pdu) u32(i int) uint32 { return binary.BigEndian.Uint32(p.bhs[i:]) }
func (p *pdu) put32(i int, v uint32) {
	binary.BigEndian.PutUint32(p.bhs[i:], v)
}
func (p *pdu) itt() uint32 { return p.u32(16) }

// dataLen is the DataSegmentLength field.
func (p *pdu) dataLen() int {
	return int(p.bhs[5])<<16 | int(p.bhs[6])<<8 | int(p.bhs[7])
}

func pad4(n int) int { return (n + 3) &^ 3 }

// digest is the CRC32C of b, as iSCSI puts it on the wire (little-endian,
// like the Linux initiator and libiscsi).
func digest(b ...[]byte) [4]byte {
	var c uint32
	for _, x := range b {
		c = crc32.Update(c, castagnoli, x)
	}
	var d [4]byte
	binary.LittleEndian.PutUint32(d[:], c)
	return d
}

var zeroPad [4]byte

// readPDU reads one PDU. maxData bounds the data segment; a longer one is
// ErrMalformed (the initiator broke the MaxRecvDataSegmentLength we declared).
// A data digest mismatch returns the PDU with errDataDigest.
func readPDU(r io.Reader, headerDigest, dataDigest bool, maxData int) (*pdu, error) {
	p := &pdu{}
	switch err := readPDUInto(r, p, headerDigest, dataDigest, maxData); {
	case errors.Is(err, errDataDigest):
		return p, err
	case err != nil:
		return nil, err
	}
	return p, nil
}

// readPDUInto is readPDU into p, which the full feature phase's reader
// reuses for every PDU (one allocation less per command). p's AHS and data
// are fresh slices: whatever a PDU's handler keeps of them stays valid.
func readPDUInto(r io.Reader, p *pdu, headerDigest, dataDigest bool, maxData int) error {
	p.ahs, p.data = nil, nil
	if _, err := io.ReadFull(r, p.bhs[:]); err != nil {
		return err
	}
	ahsLen := int(p.bhs[4]) * 4
	if ahsLen > 0 {
		p.ahs = make([]byte, ahsLen)
		if _, err := io.ReadFull(r, p.ahs); err != nil {
			return unexpected(err)
		}
	}
	if headerDigest {
		var d [4]byte
		if _, err := io.ReadFull(r, d[:]); err != nil {
			return unexpected(err)
		}
		if d != digest(p.bhs[:], p.ahs) {
			return fmt.Errorf("%w (opcode %#x)", ErrHeaderDigest, p.opcode())
		}
	}
	n := p.dataLen()
	if n > maxData {
		return fmt.Errorf("%w: data segment of %d bytes, more than the %d declared", ErrMalformed, n, maxData)
	}
	if n > 0 {
		buf := make([]byte, pad4(n))
		if _, err := io.ReadFull(r, buf); err != nil {
			return unexpected(err)
		}
		p.data = buf[:n]
		if dataDigest {
			var d [4]byte
			if _, err := io.ReadFull(r, d[:]); err != nil {
				return unexpected(err)
			}
			if d != digest(buf) {
				return errDataDigest
			}
		}
	}
	return p.check()
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// check validates what every initiator PDU must satisfy.
func (p *pdu) check() error {
	switch p.opcode() {
	case opNopOut, opSCSICmd, opTaskMgmt, opLoginReq, opTextReq, opDataOut, opLogoutReq, opSNACK:
	default:
		return fmt.Errorf("%w: opcode %#x is not an initiator opcode", ErrMalformed, p.opcode())
	}
	// AHS: a sequence of (length, type) segments that must fill it exactly.
	for a := p.ahs; len(a) > 0; {
		if len(a) < 4 {
			return fmt.Errorf("%w: truncated AHS", ErrMalformed)
		}
		l := pad4(int(binary.BigEndian.Uint16(a)) + 3)
		if l > len(a) {
			return fmt.Errorf("%w: AHS segment of %d bytes overruns the AHS", ErrMalformed, l)
		}
		a = a[l:]
	}
	return nil
}

// extendedCDB returns the bytes of an Extended CDB AHS (type 1), if any.
func (p *pdu) extendedCDB() []byte {
	for a := p.ahs; len(a) >= 4; {
		n := int(binary.BigEndian.Uint16(a))
		l := pad4(n + 3)
		if l > len(a) {
			return nil
		}
		if a[2] == 1 && n >= 1 {
			return a[4 : 3+n]
		}
		a = a[l:]
	}
	return nil
}

// appendPDU appends p's wire form to b.
func appendPDU(b []byte, p *pdu, headerDigest, dataDigest bool) []byte {
	n := len(p.data)
	p.bhs[4] = byte(len(p.ahs) / 4)
	p.bhs[5], p.bhs[6], p.bhs[7] = byte(n>>16), byte(n>>8), byte(n)
	start := len(b)
	b = append(b, p.bhs[:]...)
	b = append(b, p.ahs...)
	if headerDigest {
		d := digest(b[start:])
		b = append(b, d[:]...)
	}
	if n > 0 {
		ds := len(b)
		b = append(b, p.data...)
		b = append(b, zeroPad[:pad4(n)-n]...)
		if dataDigest {
			d := digest(b[ds:])
			b = append(b, d[:]...)
		}
	}
	return b
}
