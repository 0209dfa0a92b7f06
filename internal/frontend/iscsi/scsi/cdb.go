package scsi

import "encoding/binary"

// Operation codes served (SPC-4, SBC-3).
const (
	opTestUnitReady     = 0x00
	opRequestSense      = 0x03
	opRead6             = 0x08
	opWrite6            = 0x0a
	opInquiry           = 0x12
	opModeSelect6       = 0x15
	opReserve6          = 0x16
	opRelease6          = 0x17
	opModeSense6        = 0x1a
	opStartStopUnit     = 0x1b
	opReadCapacity10    = 0x25
	opRead10            = 0x28
	opWrite10           = 0x2a
	opWriteVerify10     = 0x2e
	opVerify10          = 0x2f
	opPrefetch10        = 0x34
	opSyncCache10       = 0x35
	opWriteSame10       = 0x41
	opUnmap             = 0x42
	opModeSelect10      = 0x55
	opModeSense10       = 0x5a
	opRead16            = 0x88
	opCompareAndWrite   = 0x89
	opWrite16           = 0x8a
	opWriteVerify16     = 0x8e
	opVerify16          = 0x8f
	opPrefetch16        = 0x90
	opSyncCache16       = 0x91
	opWriteSame16       = 0x93
	opServiceActionIn16 = 0x9e
	opReportLuns        = 0xa0
	opMaintenanceIn     = 0xa3
	opRead12            = 0xa8
	opWrite12           = 0xaa
	opWriteVerify12     = 0xae
	opVerify12          = 0xaf

	saReadCapacity16 = 0x10
	saGetLBAStatus   = 0x12
	saReportOpcodes  = 0x0c
)

// Direction is where a command's data flows.
type Direction uint8

const (
	DirNone Direction = iota
	DirIn             // target to initiator (Data-In)
	DirOut            // initiator to target (Data-Out)
)

// kind groups the commands Execute handles alike.
type kind uint8

const (
	kNone kind = iota // answered from the decode alone (TEST UNIT READY, START STOP UNIT)
	kRead
	kWrite
	kVerify
	kWriteSame
	kCompareAndWrite
	kSync
	kPrefetch
	kUnmap
	kInquiry
	kReadCapacity10
	kReadCapacity16
	kGetLBAStatus
	kModeSense
	kModeSelect
	kRequestSense
	kReportLuns
	kReportOpcodes
	kPRIn
	kPROut
	kReserve6
	kRelease6
)

// Command is a decoded CDB: every field Execute needs, checked for what can
// be checked without the device (reserved bits, protection fields, lengths).
type Command struct {
	Op  byte
	Dir Direction
	// DataOut is the number of Data-Out bytes the CDB calls for (a write's
	// blocks, an UNMAP parameter list); DataIn the most Data-In bytes it may
	// return (a read's blocks, an allocation length).
	DataOut, DataIn int

	kind   kind
	lba    uint64
	blocks uint32
	fua    bool
	bytchk byte // VERIFY, WRITE AND VERIFY: 0 none, 1 compare all, 3 compare one block against each
	unmap  bool // WRITE SAME with UNMAP
	ndob   bool // WRITE SAME(16) with no data-out buffer
	alloc  int  // allocation length (data-in commands)
	evpd   bool
	page   byte // INQUIRY VPD page; MODE SENSE page code
	sub    byte // MODE SENSE subpage
	pc     byte // MODE SENSE page control
	dbd    bool // MODE SENSE: disable block descriptors
	llbaa  bool
	ten    bool // MODE SENSE(10), MODE SELECT(10)
	pf     bool // MODE SELECT: page format
	desc   bool // REQUEST SENSE: descriptor format
	rcOpts byte // REPORT SUPPORTED OPCODES: reporting options
	rcOp   byte
	rcSA   uint16
	rctd   bool
	// PERSISTENT RESERVE IN/OUT: service action, scope and type.
	prSA, prScope, prType byte
}

// cdbLen is the length of a CDB by its group code (SPC-4 4.2.5.1); 0 for
// groups with no fixed length this target serves.
func cdbLen(op byte) int {
	switch op >> 5 {
	case 0:
		return 6
	case 1, 2:
		return 10
	case 4:
		return 16
	case 5:
		return 12
	}
	return 0
}

// Decode parses cdb for a device with blockSize-byte logical blocks. A CDB
// this target does not serve, or one with invalid fields, returns the sense
// data to answer it with. Decode never looks at the device: range checks are
// Execute's.
func Decode(cdb []byte, blockSize int) (*Command, *Sense) {
	return decode(new(Command), cdb, blockSize)
}

// DecodeInto is Decode into *c, which the caller owns (the iSCSI target
// keeps it in its pooled task: one allocation less per command). On an
// error *c is not to be used.
func DecodeInto(c *Command, cdb []byte, blockSize int) *Sense {
	_, s := decode(c, cdb, blockSize)
	return s
}

func decode(c *Command, cdb []byte, blockSize int) (*Command, *Sense) {
	if len(cdb) == 0 {
		return nil, sense(senseInvalidOpcode)
	}
	op := cdb[0]
	n := cdbLen(op)
	if n == 0 || len(cdb) < n {
		return nil, sense(senseInvalidOpcode)
	}
	cdb = cdb[:n]
	*c = Command{Op: op}
	// The CONTROL byte (last): NACA and LINK are not supported.
	if cdb[n-1]&0x05 != 0 {
		return nil, invalidField(n - 1)
	}
	u16 := func(i int) uint32 { return uint32(binary.BigEndian.Uint16(cdb[i:])) }
	u32 := func(i int) uint32 { return binary.BigEndian.Uint32(cdb[i:]) }
	u64 := func(i int) uint64 { return binary.BigEndian.Uint64(cdb[i:]) }
	// protect checks a RDPROTECT/WRPROTECT/VRPROTECT field (bits 7-5 of
	// byte 1): this target has no protection information.
	protect := func() *Sense {
		if cdb[1]&0xe0 != 0 {
			return invalidField(1)
		}
		return nil
	}
	bs := blockSize
	switch op {
	case opTestUnitReady, opStartStopUnit:
		c.kind = kNone

	case opRequestSense:
		c.kind, c.Dir = kRequestSense, DirIn
		c.desc = cdb[1]&0x01 != 0
		c.alloc = int(cdb[4])

	case opRead6, opWrite6:
		c.lba = uint64(u32(0) & 0x1fffff)
		c.blocks = uint32(cdb[4])
		if c.blocks == 0 {
			c.blocks = 256 // SBC-3: a TRANSFER LENGTH of 0 means 256 blocks
		}
		c.rw(op == opWrite6, bs)

	case opRead10, opWrite10, opWriteVerify10, opVerify10:
		if s := protect(); s != nil {
			return nil, s
		}
		c.lba, c.blocks, c.fua = uint64(u32(2)), u16(7), cdb[1]&0x08 != 0
		if s := c.rwv(cdb, bs); s != nil {
			return nil, s
		}
	case opRead12, opWrite12, opWriteVerify12, opVerify12:
		if s := protect(); s != nil {
			return nil, s
		}
		c.lba, c.blocks, c.fua = uint64(u32(2)), u32(6), cdb[1]&0x08 != 0
		if s := c.rwv(cdb, bs); s != nil {
			return nil, s
		}
	case opRead16, opWrite16, opWriteVerify16, opVerify16:
		if s := protect(); s != nil {
			return nil, s
		}
		c.lba, c.blocks, c.fua = u64(2), u32(10), cdb[1]&0x08 != 0
		if s := c.rwv(cdb, bs); s != nil {
			return nil, s
		}

	case opCompareAndWrite:
		if s := protect(); s != nil {
			return nil, s
		}
		c.kind, c.Dir = kCompareAndWrite, DirOut
		c.lba, c.blocks, c.fua = u64(2), uint32(cdb[13]), cdb[1]&0x08 != 0
		c.DataOut = 2 * int(c.blocks) * bs

	case opPrefetch10:
		c.kind, c.lba, c.blocks = kPrefetch, uint64(u32(2)), u16(7)
	case opPrefetch16:
		c.kind, c.lba, c.blocks = kPrefetch, u64(2), u32(10)

	case opSyncCache10:
		c.kind, c.lba, c.blocks = kSync, uint64(u32(2)), u16(7)
	case opSyncCache16:
		c.kind, c.lba, c.blocks = kSync, u64(2), u32(10)

	case opWriteSame10, opWriteSame16:
		if s := protect(); s != nil {
			return nil, s
		}
		c.kind, c.Dir = kWriteSame, DirOut
		if cdb[1]&0x10 != 0 { // ANCHOR
			return nil, invalidField(1)
		}
		c.unmap = cdb[1]&0x08 != 0
		if op == opWriteSame10 {
			c.lba, c.blocks = uint64(u32(2)), u16(7)
		} else {
			c.lba, c.blocks, c.ndob = u64(2), u32(10), cdb[1]&0x01 != 0
		}
		if c.blocks == 0 { // WSNZ: zero blocks ("to the end") is not supported
			return nil, invalidField(7)
		}
		if !c.ndob {
			c.DataOut = bs
		} else {
			c.Dir = DirNone
		}

	case opUnmap:
		if cdb[1]&0x01 != 0 { // ANCHOR
			return nil, invalidField(1)
		}
		c.kind, c.Dir = kUnmap, DirOut
		c.DataOut = int(u16(7))

	case opReserve6, opRelease6:
		// SPC-2 7.21, 7.16: third-party and extent reservations (byte 1)
		// are obsolete; only the logical unit's reservation is served.
		c.kind = kReserve6
		if cdb[0] == opRelease6 {
			c.kind = kRelease6
		}
		if cdb[1] != 0 {
			return nil, invalidField(1)
		}

	case opInquiry:
		c.kind, c.Dir = kInquiry, DirIn
		c.evpd, c.page, c.alloc = cdb[1]&0x01 != 0, cdb[2], int(u16(3))
		if cdb[1]&0xfe != 0 {
			return nil, invalidField(1)
		}
		if !c.evpd && c.page != 0 {
			return nil, invalidField(2)
		}

	case opModeSense6, opModeSense10:
		c.kind, c.Dir = kModeSense, DirIn
		c.ten = op == opModeSense10
		c.dbd = cdb[1]&0x08 != 0
		c.pc, c.page, c.sub = cdb[2]>>6, cdb[2]&0x3f, cdb[3]
		if c.ten {
			c.llbaa = cdb[1]&0x10 != 0
			c.alloc = int(u16(7))
		} else {
			c.alloc = int(cdb[4])
		}
		if c.pc == 3 {
			return nil, sense(senseSavingNotSupp)
		}

	case opModeSelect6, opModeSelect10:
		c.kind, c.Dir = kModeSelect, DirOut
		c.ten, c.pf = op == opModeSelect10, cdb[1]&0x10 != 0
		if c.ten {
			c.DataOut = int(u16(7))
		} else {
			c.DataOut = int(cdb[4])
		}
		// SP (bit 0): no mode page is saved (SPC-4 6.11: INVALID FIELD IN
		// CDB); the other bits but PF are reserved.
		if cdb[1]&0xef != 0 {
			return nil, invalidField(1)
		}

	case opReadCapacity10:
		c.kind, c.Dir, c.alloc = kReadCapacity10, DirIn, 8
		if cdb[8]&0x01 == 0 && u32(2) != 0 { // an LBA without PMI
			return nil, invalidField(2)
		}

	case opServiceActionIn16:
		c.alloc = int(u32(10))
		switch cdb[1] & 0x1f {
		case saReadCapacity16:
			c.kind, c.Dir = kReadCapacity16, DirIn
		case saGetLBAStatus:
			c.kind, c.Dir, c.lba = kGetLBAStatus, DirIn, u64(2)
		default:
			return nil, invalidField(1)
		}

	case opReportLuns:
		c.kind, c.Dir, c.alloc = kReportLuns, DirIn, int(u32(6))
		if cdb[2] > 2 && cdb[2] != 0x10 && cdb[2] != 0x11 && cdb[2] != 0x12 {
			return nil, invalidField(2)
		}
		if c.alloc < 16 && c.alloc != 0 {
			return nil, invalidField(6)
		}

	case opPersistentReserveIn:
		c.kind, c.Dir, c.alloc = kPRIn, DirIn, int(u16(7))
		c.prSA = cdb[1] & 0x1f
		if c.prSA > 3 {
			return nil, invalidField(1)
		}

	case opPersistentReserveOut:
		c.kind, c.Dir = kPROut, DirOut
		c.prSA, c.prScope, c.prType = cdb[1]&0x1f, cdb[2]>>4, cdb[2]&0x0f
		c.DataOut = int(u32(5))
		if c.DataOut > maxPROutParams {
			return nil, invalidField(5)
		}

	case opMaintenanceIn:
		if cdb[1]&0x1f != saReportOpcodes {
			return nil, invalidField(1)
		}
		c.kind, c.Dir = kReportOpcodes, DirIn
		c.rctd, c.rcOpts = cdb[2]&0x80 != 0, cdb[2]&0x07
		c.rcOp, c.rcSA, c.alloc = cdb[3], uint16(u16(4)), int(u32(6))
		if c.rcOpts > 3 {
			return nil, invalidField(2)
		}

	default:
		return nil, sense(senseInvalidOpcode)
	}
	if c.Dir == DirIn && c.kind != kRead {
		c.DataIn = c.alloc
	}
	return c, nil
}

// Truncate shortens a plain WRITE (or WRITE AND VERIFY) to the first n bytes
// of its data, when the initiator sends fewer than the CDB asks for (the
// iSCSI expected transfer length is shorter): only whole blocks are written.
// It reports false for other commands and for n not a multiple of the block
// size.
func (c *Command) Truncate(n, blockSize int) bool {
	if c.kind != kWrite || n%blockSize != 0 || n > c.DataOut {
		return false
	}
	c.blocks = uint32(n / blockSize)
	c.DataOut = n
	return true
}

// ExactData reports whether the command's Data-Out must be exactly DataOut
// bytes (WRITE SAME, COMPARE AND WRITE): neither more nor less is valid.
func (c *Command) ExactData() bool {
	return c.kind == kWriteSame || c.kind == kCompareAndWrite
}

// rw fills in a plain read or write.
func (c *Command) rw(write bool, bs int) {
	if write {
		c.kind, c.Dir, c.DataOut = kWrite, DirOut, int(c.blocks)*bs
	} else {
		c.kind, c.Dir, c.DataIn = kRead, DirIn, int(c.blocks)*bs
	}
}

// rwv fills in a READ, WRITE, WRITE AND VERIFY or VERIFY of 10, 12 or 16 bytes.
func (c *Command) rwv(cdb []byte, bs int) *Sense {
	switch cdb[0] {
	case opRead10, opRead12, opRead16:
		c.rw(false, bs)
	case opWrite10, opWrite12, opWrite16:
		c.rw(true, bs)
	case opWriteVerify10, opWriteVerify12, opWriteVerify16:
		c.rw(true, bs)
		c.fua = true
	case opVerify10, opVerify12, opVerify16:
		c.kind, c.fua = kVerify, false
		c.bytchk = (cdb[1] >> 1) & 0x03
		switch c.bytchk {
		case 0:
		case 1:
			c.Dir, c.DataOut = DirOut, int(c.blocks)*bs
		case 3:
			c.Dir, c.DataOut = DirOut, bs
			if c.blocks == 0 {
				c.Dir, c.DataOut = DirNone, 0
			}
		default:
			return invalidField(1)
		}
	}
	return nil
}
