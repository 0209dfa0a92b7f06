package scsi

import (
	"encoding/binary"
	"testing"
)

func modeSense6(pc, page byte) []byte { return []byte{0x1a, 0, pc<<6 | page, 0, 0xff, 0} }

func modeSelect6(pf, sp bool, n int) []byte {
	cdb := []byte{0x15, 0, 0, 0, byte(n), 0}
	if pf {
		cdb[1] |= 0x10
	}
	if sp {
		cdb[1] |= 0x01
	}
	return cdb
}

func modeSelect10(n int) []byte {
	cdb := []byte{0x55, 0x10, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(cdb[7:], uint16(n))
	return cdb
}

// selectList turns MODE SENSE data into a MODE SELECT parameter list: the
// mode data length and each page's PS bit are reserved there.
func selectList(sense []byte, ten bool) []byte {
	p := append([]byte(nil), sense...)
	hdr, bdl := 4, int(p[3])
	if ten {
		hdr, bdl = 8, int(binary.BigEndian.Uint16(p[6:]))
		p[0], p[1] = 0, 0
	} else {
		p[0] = 0
	}
	for off := hdr + bdl; off < len(p); off += 2 + int(p[off+1]) {
		p[off] &^= 0x80
	}
	return p
}

func wantSense(t *testing.T, what string, r Result, key, asc byte, field int) {
	t.Helper()
	if r.Status != StatusCheckCondition || r.Sense == nil || r.Sense.Key != key || r.Sense.ASC != asc {
		t.Fatalf("%s: status %#x sense %+v, want CHECK CONDITION %x/%02x", what, r.Status, r.Sense, key, asc)
	}
	if field >= 0 && (!r.Sense.FieldValid || int(r.Sense.Field) != field) {
		t.Fatalf("%s: field pointer %+v, want byte %d", what, r.Sense, field)
	}
}

// MODE SELECT takes back what MODE SENSE reports, and refuses to change any
// bit MODE SENSE's changeable values do not mark changeable (none: the
// caching page's WCE stays 0, basalt being write-through), pointing at the
// byte, without changing anything.
func TestModeSelect(t *testing.T) {
	lu := newLU(t, 1<<20, false)
	good := func(what string, r Result) {
		t.Helper()
		if r.Status != StatusGood {
			t.Fatalf("%s: status %#x sense %+v", what, r.Status, r.Sense)
		}
	}

	cur := run(t, lu, modeSense6(0, 0x3f), nil)
	good("MODE SENSE(6)", cur)
	list := selectList(cur.Data, false)
	good("MODE SELECT(6) of the current values", run(t, lu, modeSelect6(true, false, len(list)), list))
	good("MODE SELECT(6) with no parameter list", run(t, lu, modeSelect6(true, false, 0), nil))

	// MODE SENSE(10) with long LBA descriptors, back through MODE SELECT(10).
	cur10 := run(t, lu, []byte{0x5a, 0x10, 0x3f, 0, 0, 0, 0, 0x10, 0, 0}, nil)
	good("MODE SENSE(10)", cur10)
	list10 := selectList(cur10.Data, true)
	good("MODE SELECT(10) of the current values", run(t, lu, modeSelect10(len(list10)), list10))

	// Every bit MODE SENSE does not call changeable is refused, at its byte.
	chg := run(t, lu, modeSense6(1, 0x3f), nil)
	good("MODE SENSE(6) changeable", chg)
	hdr := 4 + int(list[3])
	if len(chg.Data)-4-int(chg.Data[3]) != len(list)-hdr {
		t.Fatalf("the changeable values have %d bytes of pages, the current %d", len(chg.Data)-4-int(chg.Data[3]), len(list)-hdr)
	}
	chgPages := chg.Data[4+int(chg.Data[3]):]
	wce := -1
	for off := hdr; off < len(list); off += 2 + int(list[off+1]) {
		if list[off] == 0x08 {
			wce = off + 2
		}
		for i := off + 2; i < off+2+int(list[off+1]); i++ {
			for bit := range 8 {
				if chgPages[i-hdr]&(1<<bit) != 0 {
					t.Fatalf("page %#x byte %d bit %d is changeable; MODE SELECT keeps nothing", list[off], i-off, bit)
				}
				bad := append([]byte(nil), list...)
				bad[i] ^= 1 << bit
				wantSense(t, "a change", run(t, lu, modeSelect6(true, false, len(bad)), bad), KeyIllegalRequest, 0x26, i)
			}
		}
	}
	if wce < 0 {
		t.Fatal("no caching page")
	}
	after := run(t, lu, modeSense6(0, 0x08), nil)
	if after.Data[4+int(after.Data[3])+2]&0x04 != 0 {
		t.Fatal("WCE changed")
	}

	wantSense(t, "SP (no saved pages)", run(t, lu, modeSelect6(true, true, len(list)), list), KeyIllegalRequest, 0x24, 1)
	wantSense(t, "pages without PF", run(t, lu, modeSelect6(false, false, len(list)), list), KeyIllegalRequest, 0x24, 1)
	unknown := append(append([]byte(nil), list[:hdr]...), 0x19, 6, 0, 0, 0, 0, 0, 0)
	wantSense(t, "a page not served", run(t, lu, modeSelect6(true, false, len(unknown)), unknown), KeyIllegalRequest, 0x26, hdr)
	short := append([]byte(nil), list...)
	short[hdr+1]--
	wantSense(t, "a page length not the page's", run(t, lu, modeSelect6(true, false, len(short)), short), KeyIllegalRequest, 0x26, hdr+1)
	cutList := list[:len(list)-3]
	wantSense(t, "a list that ends inside a page", run(t, lu, modeSelect6(true, false, len(cutList)), cutList), KeyIllegalRequest, 0x1a, -1)
	wantSense(t, "a header cut short", run(t, lu, modeSelect6(true, false, 3), list[:3]), KeyIllegalRequest, 0x1a, -1)
	bs := append([]byte(nil), list...)
	bs[4+6] ^= 0x10 // block length 512 -> 4096+512
	wantSense(t, "another block length", run(t, lu, modeSelect6(true, false, len(bs)), bs), KeyIllegalRequest, 0x26, 4+5)
	bdl := append([]byte(nil), list...)
	bdl[3] = 4
	wantSense(t, "a block descriptor length that is not 8", run(t, lu, modeSelect6(true, false, len(bdl)), bdl), KeyIllegalRequest, 0x26, 3)
}
