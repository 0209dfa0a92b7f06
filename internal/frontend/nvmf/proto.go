package nvmf

import (
	"encoding/binary"
	"hash/crc32"
)

// PDU types (NVMe/TCP transport binding, §3.6).
const (
	pduICReq      = 0x00
	pduICResp     = 0x01
	pduH2CTermReq = 0x02
	pduC2HTermReq = 0x03
	pduCapsuleCmd = 0x04
	pduCapsuleRsp = 0x05
	pduH2CData    = 0x06
	pduC2HData    = 0x07
	pduR2T        = 0x09
)

// PDU header flags.
const (
	flagHDGST   = 0x01
	flagDDGST   = 0x02
	flagLast    = 0x04 // H2CData, C2HData: last PDU of the transfer
	flagSuccess = 0x08 // C2HData: the command succeeded; no CapsuleResp follows
)

// Header lengths of each PDU type (without the header digest).
const (
	chLen       = 8   // common header
	icLen       = 128 // ICReq, ICResp
	capsuleLen  = 72  // CapsuleCmd: CH + SQE
	rspLen      = 24  // CapsuleResp: CH + CQE
	dataHdrLen  = 24  // H2CData, C2HData, R2T, TermReq
	sqeLen      = 64
	cqeLen      = 16
	digestLen   = 4
	maxTermData = 152 // the offending header copied into a TermReq, at most
)

// Fatal error status (TermReq FES).
const (
	fesInvalidHeader  = 0x01
	fesSequence       = 0x02
	fesHeaderDigest   = 0x03
	fesDataOutOfRange = 0x04
	fesDataDigest     = 0x05 // spec: data digest error... reported as a transfer error
	fesUnsupported    = 0x06
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crc32c is the digest NVMe/TCP uses for headers and data, stored little-endian.
func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Opcodes.
const (
	// Admin.
	adminGetLogPage   = 0x02
	adminIdentify     = 0x06
	adminAbort        = 0x08
	adminSetFeatures  = 0x09
	adminGetFeatures  = 0x0a
	adminAsyncEvent   = 0x0c
	adminKeepAlive    = 0x18
	opFabrics         = 0x7f
	fctypePropertySet = 0x00
	fctypeConnect     = 0x01
	fctypePropertyGet = 0x04

	// I/O (NVM command set).
	ioFlush       = 0x00
	ioWrite       = 0x01
	ioRead        = 0x02
	ioCompare     = 0x05
	ioWriteZeroes = 0x08
	ioDSM         = 0x09
)

// Status: SCT << 8 | SC. The DNR bit is added by the sender for non-retryable ones.
const (
	scSuccess         = 0x000
	scInvalidOpcode   = 0x001
	scInvalidField    = 0x002
	scDataXferError   = 0x004
	scInternal        = 0x006
	scAbortReq        = 0x007
	scInvalidNS       = 0x00b
	scCmdSeqError     = 0x00c
	scSGLInvalidType  = 0x011
	scWriteProtected  = 0x020
	scLBARange        = 0x080
	scCapExceeded     = 0x081
	scNSNotReady      = 0x082
	scInvalidLogPage  = 0x109
	scConnectFormat   = 0x180
	scConnectBusy     = 0x181
	scConnectInvalid  = 0x182
	scConnectHost     = 0x184
	scCompareFailed   = 0x285
	scANAInaccessible = 0x302
	scAERLimit        = 0x105
	// scFeatureNotChangeable: Set Features of a feature the host may not change.
	scFeatureNotChangeable = 0x10e
	dnr                    = 0x4000 // Do Not Retry, in the status word after the phase bit shift
)

// NQNs.
const (
	DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"
	// VolumeNQNPrefix + volume name is the NQN of a volume's subsystem.
	VolumeNQNPrefix = "nqn.2024-11.io.basalt:volume:"
	// GroupNQNPrefix + group name is the NQN of a subsystem of several
	// volumes, one namespace each (defined in the MDS; Paths.Groups).
	GroupNQNPrefix = "nqn.2024-11.io.basalt:group:"
)

// sqe is a submission queue entry, decoded.
type sqe struct {
	opcode  uint8
	flags   uint8
	cid     uint16
	nsid    uint32
	sglAddr uint64
	sglLen  uint32
	sglType uint8
	cdw     [16]uint32 // cdw[10..15] used; fabrics commands read raw bytes
	raw     [sqeLen]byte
}

// parse fills s from the 64-byte entry b.
func (s *sqe) parse(b []byte) {
	copy(s.raw[:], b)
	s.opcode = b[0]
	s.flags = b[1]
	s.cid = binary.LittleEndian.Uint16(b[2:])
	s.nsid = binary.LittleEndian.Uint32(b[4:])
	s.sglAddr = binary.LittleEndian.Uint64(b[24:])
	s.sglLen = binary.LittleEndian.Uint32(b[32:])
	s.sglType = b[39]
	for i := 10; i < 16; i++ {
		s.cdw[i] = binary.LittleEndian.Uint32(b[i*4:])
	}
}

// treqNoSQFlow is the discovery record's TREQ bit 2: a host may disable SQ
// flow control at Connect (CATTR bit 2).
const treqNoSQFlow = 0x04

// SGL descriptor identifiers NVMe/TCP uses.
const (
	sglInCapsule = 0x01 // data block, offset subtype: the data is in the capsule
	sglTransport = 0x5a // transport data block: data moves in H2CData/C2HData PDUs
)

// putCH writes a common header.
func putCH(b []byte, typ, flags, hlen, pdo uint8, plen uint32) {
	b[0], b[1], b[2], b[3] = typ, flags, hlen, pdo
	binary.LittleEndian.PutUint32(b[4:], plen)
}
