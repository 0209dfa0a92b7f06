package scsi

import (
	"encoding/binary"
	"slices"
)

// Identity strings of the standard INQUIRY data.
const (
	vendorID  = "BASALT  "
	productID = "basalt volume   "
	revision  = "0001"
)

// vpdPages are the VPD pages served, in order.
var vpdPages = []byte{0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2}

// info answers the commands that read the device's description.
func (lu *LU) info(c *Command) Result {
	switch c.kind {
	case kInquiry:
		if !c.evpd {
			return good(cut(lu.standardInquiry(), c.alloc))
		}
		p := lu.vpd(c.page)
		if p == nil {
			return check(invalidField(2))
		}
		return good(cut(p, c.alloc))

	case kReadCapacity10:
		d := make([]byte, 8)
		last := lu.blocks() - 1
		binary.BigEndian.PutUint32(d[0:], uint32(min(last, 0xffffffff)))
		binary.BigEndian.PutUint32(d[4:], uint32(lu.bs))
		return good(d)

	case kReadCapacity16:
		d := make([]byte, 32)
		binary.BigEndian.PutUint64(d[0:], lu.blocks()-1)
		binary.BigEndian.PutUint32(d[8:], uint32(lu.bs))
		// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT 0: a logical block is
		// written on its own, atomically, as a unit of the medium. The
		// 4 KiB the backend prefers are the Block Limits page's optimal
		// transfer and unmap granularity instead, which Linux takes for
		// io_min and the discard granularity. A 4 KiB physical block made
		// initiators (libiscsi's GetLBAStatus.UnmapSingle) take it for
		// the unit GET LBA STATUS reports in.
		if lu.canTrim {
			d[14] = 0x80 | 0x40 // LBPME, LBPRZ: unmapped blocks read as zeros
		}
		return good(cut(d, c.alloc))

	case kModeSense:
		return lu.modeSense(c)

	case kRequestSense:
		// Nothing pending (Execute answers a pending unit attention): NO SENSE.
		s := Sense{Key: KeyNoSense}
		return good(cut(s.data(c.desc), c.alloc))

	case kReportLuns:
		d := make([]byte, 16)
		binary.BigEndian.PutUint32(d[0:], 8) // one LUN: 0
		return good(cut(d, c.alloc))

	case kReportOpcodes:
		return lu.reportOpcodes(c)
	}
	return check(sense(senseInternalError))
}

func (lu *LU) standardInquiry() []byte {
	d := make([]byte, 66)
	d[0] = 0x00 // peripheral: connected, direct-access block device
	d[2] = 0x06 // SPC-4
	d[3] = 0x12 // HISUP, response data format 2
	d[4] = byte(len(d) - 5)
	d[7] = 0x02 // CMDQUE
	copy(d[8:], vendorID)
	copy(d[16:], productID)
	copy(d[32:], revision)
	// Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
	for i, v := range []uint16{0x00a0, 0x0960, 0x0460, 0x04c0} {
		binary.BigEndian.PutUint16(d[58+2*i:], v)
	}
	return d
}

// vpd returns VPD page p, or nil if it is not served.
func (lu *LU) vpd(p byte) []byte {
	page := func(body []byte) []byte {
		d := []byte{0x00, p, 0, 0}
		binary.BigEndian.PutUint16(d[2:], uint16(len(body)))
		return append(d, body...)
	}
	switch p {
	case 0x00:
		return page(vpdPages)
	case 0x80:
		return page([]byte(lu.serial))
	case 0x83:
		return page(lu.designators())
	case 0xb0: // Block Limits
		d := make([]byte, 0x3c)
		at := func(i int) []byte { return d[i-4:] }
		at(4)[0] = 0x01 // WSNZ
		at(5)[0] = byte(lu.maxCAWBlock)
		gran := uint16(max(1, int(lu.cfg.Info.BlockSizes.Preferred)/lu.bs))
		binary.BigEndian.PutUint16(at(6), gran)
		binary.BigEndian.PutUint32(at(8), uint32(lu.maxXfer/lu.bs))
		binary.BigEndian.PutUint32(at(12), uint32(lu.maxXfer/lu.bs))
		if lu.canTrim {
			binary.BigEndian.PutUint32(at(20), 0xffffffff)
			binary.BigEndian.PutUint32(at(24), maxUnmapDescriptors)
			// OPTIMAL UNMAP GRANULARITY, the backend's preferred size (a
			// basalt volume's 4 KiB map granule, api.MapGranule): an UNMAP
			// deallocates the whole granules it covers and zeroes the
			// blocks of one it covers in part, which GET LBA STATUS then
			// reports mapped. UGAVALID: granules start at LBA 0.
			binary.BigEndian.PutUint32(at(28), uint32(gran))
			at(32)[0] = 0x80
		}
		binary.BigEndian.PutUint64(at(36), uint64(maxWriteSameBytes/lu.bs))
		return page(d)
	case 0xb1: // Block Device Characteristics
		d := make([]byte, 0x3c)
		binary.BigEndian.PutUint16(d[0:], 1) // non-rotating medium
		return page(d)
	case 0xb2: // Logical Block Provisioning
		d := make([]byte, 4)
		if lu.canTrim {
			d[1] = 0x80 | 0x40 | 0x20 | 0x04 // LBPU, LBPWS, LBPWS10, LBPRZ
			d[2] = 0x02                      // thin provisioned
		}
		return page(d)
	}
	return nil
}

// designators returns VPD page 0x83's designation descriptors: the logical
// unit's NAA (locally assigned, from the ID) and T10 vendor identifiers, the
// target port's relative number and the target device's iSCSI name.
func (lu *LU) designators() []byte {
	var d []byte
	desc := func(codeSet, piv, assoc, typ byte, proto byte, v []byte) {
		b0 := codeSet
		if piv != 0 {
			b0 |= proto << 4
		}
		d = append(d, b0, piv<<7|assoc<<4|typ, 0, byte(len(v)))
		d = append(d, v...)
	}
	naa := make([]byte, 8)
	binary.BigEndian.PutUint64(naa, 3<<60|lu.cfg.ID&(1<<60-1)) // NAA 3: locally assigned
	desc(1, 0, 0, 3, 0, naa)
	desc(2, 0, 0, 1, 0, []byte(vendorID+lu.serial))
	desc(1, 1, 1, 4, 5, []byte{0, 0, 0, 1}) // relative target port 1, iSCSI
	if lu.cfg.TargetName != "" {
		name := []byte(lu.cfg.TargetName)
		name = append(name, 0) // null-terminated, padded to a multiple of 4
		for len(name)%4 != 0 {
			name = append(name, 0)
		}
		desc(3, 1, 2, 8, 5, name)
	}
	return d
}

func (lu *LU) modeSense(c *Command) Result {
	if c.sub != 0 && !(c.sub == 0xff && c.page == 0x3f) {
		return check(invalidField(3))
	}
	var pages []byte
	add := func(code byte) bool {
		if c.page != 0x3f && c.page != code {
			return false
		}
		p := lu.modePage(code, c.pc == 1)
		pages = append(pages, p...)
		return true
	}
	found := false
	for _, code := range modePages {
		found = add(code) || found
	}
	if !found {
		return check(invalidField(2))
	}
	var bd []byte
	if !c.dbd {
		n := lu.blocks()
		if c.llbaa && c.ten {
			bd = make([]byte, 16)
			binary.BigEndian.PutUint64(bd[0:], n)
			binary.BigEndian.PutUint32(bd[12:], uint32(lu.bs))
		} else {
			bd = make([]byte, 8)
			binary.BigEndian.PutUint32(bd[0:], uint32(min(n, 0xffffffff)))
			binary.BigEndian.PutUint32(bd[4:], uint32(lu.bs)) // byte 4 is reserved; the length is 24 bits
		}
	}
	var devSpecific byte = 0x10 // DPOFUA
	if lu.readOnly {
		devSpecific |= 0x80 // WP
	}
	var d []byte
	if c.ten {
		d = make([]byte, 8)
		if len(bd) == 16 {
			d[4] = 0x01 // LONGLBA
		}
		d[3] = devSpecific
		binary.BigEndian.PutUint16(d[6:], uint16(len(bd)))
		d = append(append(d, bd...), pages...)
		binary.BigEndian.PutUint16(d[0:], uint16(len(d)-2))
	} else {
		d = []byte{0, 0, devSpecific, byte(len(bd))}
		d = append(append(d, bd...), pages...)
		d[0] = byte(len(d) - 1)
	}
	return good(cut(d, c.alloc))
}

// modePages are the mode pages MODE SENSE reports and MODE SELECT takes.
var modePages = []byte{0x08, 0x0a, 0x1c}

// modeSelect runs MODE SELECT(6)/(10)'s parameter list (SPC-4 6.11, 7.5):
// a header, at most one block descriptor and mode pages. No mode parameter
// is changeable (MODE SENSE's changeable values say so): the caching page
// says write-through because every completed write is durable, and one
// access node's page could not change what the others serve. So a list that
// restates the current values is GOOD and any change is ILLEGAL REQUEST,
// INVALID FIELD IN PARAMETER LIST pointing at the byte; the list is checked
// whole before anything would apply.
func (lu *LU) modeSelect(c *Command, p []byte) Result {
	if len(p) == 0 {
		return good(nil) // no parameter list: not an error
	}
	hdr, mediumType, bdlField := 4, 1, 3
	var bdl int
	long := false
	if c.ten {
		hdr, mediumType, bdlField = 8, 2, 6
	}
	if len(p) < hdr {
		return check(sense(senseParamLenError))
	}
	if c.ten {
		bdl, long = int(binary.BigEndian.Uint16(p[6:])), p[4]&0x01 != 0
	} else {
		bdl = int(p[3])
	}
	// MODE DATA LENGTH and the device-specific parameter are reserved in
	// MODE SELECT (SPC-4 7.5.5, SBC-4 6.5.2); the medium type is 0.
	if p[mediumType] != 0 {
		return check(invalidParamField(mediumType))
	}
	descLen := 8
	if long {
		descLen = 16
	}
	if bdl != 0 && bdl != descLen {
		return check(invalidParamField(bdlField))
	}
	if hdr+bdl > len(p) {
		return check(sense(senseParamLenError))
	}
	if bdl > 0 {
		// The NUMBER OF LOGICAL BLOCKS is ignored (the capacity is not set
		// here, SBC-4 6.5.2); the block length cannot change.
		d, at := p[hdr:hdr+bdl], 5
		bl := uint32(d[5])<<16 | uint32(d[6])<<8 | uint32(d[7])
		if long {
			bl, at = binary.BigEndian.Uint32(d[12:]), 12
		}
		if bl != uint32(lu.bs) {
			return check(invalidParamField(hdr + at))
		}
	}
	off := hdr + bdl
	if off < len(p) && !c.pf {
		return check(invalidField(1)) // vendor-specific pages: none
	}
	for off < len(p) {
		rest := p[off:]
		if len(rest) < 2 {
			return check(sense(senseParamLenError))
		}
		code := rest[0] & 0x3f
		// PS (bit 7) is reserved here; SPF (bit 6) would be a subpage: none.
		if rest[0]&0x40 != 0 || !slices.Contains(modePages, code) {
			return check(invalidParamField(off))
		}
		n := 2 + int(rest[1])
		cur, changeable := lu.modePage(code, false), lu.modePage(code, true)
		if n != len(cur) {
			return check(invalidParamField(off + 1))
		}
		if n > len(rest) {
			return check(sense(senseParamLenError))
		}
		for i := 2; i < n; i++ {
			if (rest[i]^cur[i])&^changeable[i] != 0 {
				return check(invalidParamField(off + i))
			}
		}
		off += n
	}
	return good(nil) // nothing changeable: nothing to apply
}

// modePage returns a mode page's current (or, with changeable, its mask of
// changeable bits: none).
func (lu *LU) modePage(code byte, changeable bool) []byte {
	var p []byte
	switch code {
	case 0x08: // Caching: write-through (every completed write is durable)
		p = make([]byte, 20)
	case 0x0a: // Control
		p = make([]byte, 12)
		if !changeable {
			p[3] = 0x10                               // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
			binary.BigEndian.PutUint16(p[8:], 0xffff) // BUSY TIMEOUT PERIOD: unlimited
		}
	case 0x1c: // Informational Exceptions Control
		p = make([]byte, 12)
	}
	p[0], p[1] = code, byte(len(p)-2)
	return p
}

// opcode describes one command for REPORT SUPPORTED OPERATION CODES.
type opcode struct {
	op    byte
	sa    uint16
	hasSA bool
	usage []byte // CDB usage data: the bits of each CDB byte the target looks at
}

var opcodes = []opcode{
	{op: opTestUnitReady, usage: []byte{0x00, 0, 0, 0, 0, 0x04}},
	{op: opRequestSense, usage: []byte{0x03, 0x01, 0, 0, 0xff, 0x04}},
	{op: opRead6, usage: []byte{0x08, 0x1f, 0xff, 0xff, 0xff, 0x04}},
	{op: opWrite6, usage: []byte{0x0a, 0x1f, 0xff, 0xff, 0xff, 0x04}},
	{op: opInquiry, usage: []byte{0x12, 0x01, 0xff, 0xff, 0xff, 0x04}},
	{op: opModeSelect6, usage: []byte{0x15, 0x11, 0, 0, 0xff, 0x04}},
	{op: opReserve6, usage: []byte{0x16, 0, 0, 0, 0, 0x04}},
	{op: opRelease6, usage: []byte{0x17, 0, 0, 0, 0, 0x04}},
	{op: opModeSense6, usage: []byte{0x1a, 0x08, 0xff, 0xff, 0xff, 0x04}},
	{op: opStartStopUnit, usage: []byte{0x1b, 0x01, 0, 0x0f, 0xf7, 0x04}},
	{op: opReadCapacity10, usage: []byte{0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0x04}},
	{op: opRead10, usage: []byte{0x28, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04}},
	{op: opWrite10, usage: []byte{0x2a, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04}},
	{op: opWriteVerify10, usage: []byte{0x2e, 0x12, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04}},
	{op: opVerify10, usage: []byte{0x2f, 0x16, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04}},
	{op: opPrefetch10, usage: []byte{0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04}},
	{op: opSyncCache10, usage: []byte{0x35, 0, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04}},
	{op: opWriteSame10, usage: []byte{0x41, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04}},
	{op: opUnmap, usage: []byte{0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04}},
	{op: opModeSelect10, usage: []byte{0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04}},
	{op: opModeSense10, usage: []byte{0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveIn, sa: 0, hasSA: true, usage: []byte{0x5e, 0x00, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveIn, sa: 1, hasSA: true, usage: []byte{0x5e, 0x01, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveIn, sa: 2, hasSA: true, usage: []byte{0x5e, 0x02, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveIn, sa: 3, hasSA: true, usage: []byte{0x5e, 0x03, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveOut, sa: 0, hasSA: true, usage: []byte{0x5f, 0x00, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveOut, sa: 1, hasSA: true, usage: []byte{0x5f, 0x01, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveOut, sa: 2, hasSA: true, usage: []byte{0x5f, 0x02, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveOut, sa: 3, hasSA: true, usage: []byte{0x5f, 0x03, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveOut, sa: 4, hasSA: true, usage: []byte{0x5f, 0x04, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveOut, sa: 5, hasSA: true, usage: []byte{0x5f, 0x05, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04}},
	{op: opPersistentReserveOut, sa: 6, hasSA: true, usage: []byte{0x5f, 0x06, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04}},
	{op: opRead16, usage: []byte{0x88, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opCompareAndWrite, usage: []byte{0x89, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0, 0x04}},
	{op: opWrite16, usage: []byte{0x8a, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opWriteVerify16, usage: []byte{0x8e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opVerify16, usage: []byte{0x8f, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opPrefetch16, usage: []byte{0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opSyncCache16, usage: []byte{0x91, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opWriteSame16, usage: []byte{0x93, 0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opServiceActionIn16, sa: saReadCapacity16, hasSA: true, usage: []byte{0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opServiceActionIn16, sa: saGetLBAStatus, hasSA: true, usage: []byte{0x9e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opReportLuns, usage: []byte{0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opMaintenanceIn, sa: saReportOpcodes, hasSA: true, usage: []byte{0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opRead12, usage: []byte{0xa8, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opWrite12, usage: []byte{0xaa, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opWriteVerify12, usage: []byte{0xae, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
	{op: opVerify12, usage: []byte{0xaf, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04}},
}

func (lu *LU) served(o opcode) bool {
	switch o.op {
	case opPersistentReserveIn, opPersistentReserveOut, opReserve6, opRelease6:
		return lu.pr != nil
	case opUnmap:
		return lu.canTrim
	case opCompareAndWrite:
		return !lu.readOnly && lu.caw != nil
	case opWrite6, opWrite10, opWrite12, opWrite16, opWriteVerify10, opWriteVerify12,
		opWriteVerify16, opWriteSame10, opWriteSame16:
		return !lu.readOnly
	}
	return true
}

// timeouts is the command timeouts descriptor (RCTD): no timeouts given.
var timeouts = []byte{0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func (lu *LU) reportOpcodes(c *Command) Result {
	var d []byte
	switch c.rcOpts {
	case 0: // all commands
		d = make([]byte, 4)
		for _, o := range opcodes {
			if !lu.served(o) {
				continue
			}
			e := make([]byte, 8)
			e[0] = o.op
			binary.BigEndian.PutUint16(e[2:], o.sa)
			if o.hasSA {
				e[5] |= 0x01 // SERVACTV
			}
			if c.rctd {
				e[5] |= 0x02 // CTDP
			}
			binary.BigEndian.PutUint16(e[6:], uint16(len(o.usage)))
			d = append(d, e...)
			if c.rctd {
				d = append(d, timeouts...)
			}
		}
		binary.BigEndian.PutUint32(d[0:], uint32(len(d)-4))
	default: // one command: by opcode (1), opcode and service action (2), either (3)
		i := slices.IndexFunc(opcodes, func(o opcode) bool {
			return o.op == c.rcOp && (!o.hasSA || o.sa == c.rcSA)
		})
		var o opcode
		if i >= 0 {
			o = opcodes[i]
			switch {
			case c.rcOpts == 1 && o.hasSA:
				return check(invalidField(2))
			case c.rcOpts == 2 && !o.hasSA:
				return check(invalidField(2))
			}
		} else if c.rcOpts == 1 && slices.ContainsFunc(opcodes, func(o opcode) bool { return o.op == c.rcOp && o.hasSA }) {
			return check(invalidField(2))
		}
		d = make([]byte, 4)
		if i >= 0 && lu.served(o) {
			d[1] = 0x03 // supported, as the standard says
			binary.BigEndian.PutUint16(d[2:], uint16(len(o.usage)))
			d = append(d, o.usage...)
		} else {
			d[1] = 0x01 // not supported
		}
		if c.rctd {
			d[1] |= 0x80 // CTDP
			d = append(d, timeouts...)
		}
	}
	return good(cut(d, c.alloc))
}
