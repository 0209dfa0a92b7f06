package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"unsafe"

	pb "go.etcd.io/raft/v3/raftpb"
)

// On-disk constants; doc.go specifies the format they describe.
const (
	segMagic   = "BWAL"
	segVersion = 4
	// minSegVersion is the oldest segment format Open reads: version 3 is
	// version 4 without batch records, version 2 is version 3 without padded
	// entries and pad records.
	minSegVersion = 2
	// markSegVersion is the first version whose batches start with a batch
	// record (the durable mark).
	markSegVersion = 4
	segHeaderSize  = 16 // magic[4] | version u32 | seq u64
	recHeaderSize  = 12 // length u32 | crc32c u32 | tag u32

	// maxRecord bounds a record's payload length; a larger length on disk is
	// treated like a bad CRC (torn or corrupt), never allocated.
	maxRecord = 1 << 30
)

// entriesRecordMax is the payload size above which Save splits an Update's
// entries into several records (a variable so that tests can lower it).
var entriesRecordMax = maxRecord

// Record types (the first payload byte).
const (
	recEntries      byte = 1
	recHardState    byte = 2
	recSnapshot     byte = 3
	recGroupRemoved byte = 4
	recPad          byte = 5 // nothing: aligns the next record (see dioAlign)
	recBatch        byte = 6 // starts a batch: the segment's durable mark
)

// batchRecordSize is the size of a batch record: header, type, mark u64.
const batchRecordSize = recHeaderSize + 1 + 8

// Snapshot record flags.
const (
	snapFlagReset byte = 1 // a snapshot received from the leader: the log restarts after it
)

// entryHasData is set in an entry's type byte when its Data is non-nil (even
// if empty), so that entries read back are proto.Equal to those saved.
const entryHasData byte = 0x80

// entryPadded is set in an entry's type byte when a pad count (u16) and
// that many zero bytes come between its data length and its data.
const entryPadded byte = 0x40

// dioAlign is the alignment of O_DIRECT (the disk's logical block size, 512
// here): every piece of a direct write must start at an address that is a
// multiple of it and be a multiple of it long. Entry data can go to the disk
// from where it lies in memory if its address and its place in the file
// agree modulo dioAlign (directWriter); padded entries and pad records make
// them agree.
const dioAlign = 512

// Padding sizes: a padded entry's pad count, its largest padding, and the
// smallest pad record (header and type byte).
const (
	padCountSize = 2
	maxEntryPad  = padCountSize + dioAlign - 1
	minPadRecord = recHeaderSize + 1
)

// Fixed sizes inside payloads.
const (
	entriesHeadSize = 1 + 8 + 8 + 4 // type | group | first index | count
	entryHeadSize   = 8 + 1 + 4     // term | entry type | data length
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// le is the byte order of every integer in the WAL.
var le = binary.LittleEndian

func appendSegmentHeader(buf []byte, seq uint64) []byte {
	buf = append(buf, segMagic...)
	buf = le.AppendUint32(buf, segVersion)
	return le.AppendUint64(buf, seq)
}

// segTag is the tag every record of segment seq carries. A recycled segment
// file still holds records of an older segment after the new ones; their
// other tag marks the end. Bit 31 keeps it apart from zero-fill.
func segTag(seq uint64) uint32 { return uint32(seq) | 1<<31 }

// beginRecord reserves a record header and returns the record's start offset.
func beginRecord(buf []byte) ([]byte, int) {
	start := len(buf)
	return append(buf, make([]byte, recHeaderSize)...), start
}

// endRecord fills in the length of the record that starts at start and the
// CRC of its payload. The record is complete once sealRecords has added the
// segment's tag; the CRC is finished then without reading the payload again.
func endRecord(buf []byte, start int) {
	n := len(buf) - start - recHeaderSize
	le.PutUint32(buf[start:], uint32(n))
	le.PutUint32(buf[start+4:], crc32.Checksum(buf[start+recHeaderSize:], castagnoli))
}

// sealRecords tags every record of a batch for segment seq and finishes its
// CRC: CRC-32C over the payload, then the length and tag bytes. The batch is
// buf with the data of refs inserted (whole records, as built by the append
// functions); the data's bytes are not read again.
func sealRecords(buf []byte, refs []dataRef, seq uint64) {
	tag := segTag(seq)
	shift := 0 // bytes of refs' data before buf[off]
	for off := 0; off+recHeaderSize <= len(buf); {
		h := buf[off : off+recHeaderSize]
		le.PutUint32(h[8:], tag)
		crc := crc32.Update(le.Uint32(h[4:]), castagnoli, h[:4])
		le.PutUint32(h[4:], crc32.Update(crc, castagnoli, h[8:12]))
		end := off + shift + recHeaderSize + int(le.Uint32(h)) // in the batch
		for len(refs) > 0 && refs[0].off < end {
			shift += len(refs[0].data)
			refs = refs[1:]
		}
		off = end - shift
	}
}

// appendEntries encodes one entries record. ents must be consecutive. With
// refs (those of the batch so far), entry data of refMinBytes or more is not
// copied: a dataRef says where in the batch it goes (the batch is buf with
// the refs' data inserted), for the write to take the data from the entry
// itself; the record's length and CRC cover the data. Such an entry is padded
// so that its data's offset in the batch and its address agree modulo
// dioAlign: written at a dioAlign-aligned file offset (commit makes sure), the
// data can go to the disk straight from the entry.
func appendEntries(buf []byte, group uint64, ents []*pb.Entry, refs *[]dataRef) []byte {
	shift := 0 // the batch's bytes before buf[len(buf)] that are not in buf
	if refs != nil && len(*refs) > 0 {
		last := (*refs)[len(*refs)-1]
		shift = last.off + len(last.data) - last.at
	}
	inRecord := 0 // this record's bytes not in buf
	buf, start := beginRecord(buf)
	buf = append(buf, recEntries)
	buf = le.AppendUint64(buf, group)
	buf = le.AppendUint64(buf, ents[0].GetIndex())
	buf = le.AppendUint32(buf, uint32(len(ents)))
	var crc uint32
	summed := start + recHeaderSize // buf[summed:] is not in crc yet
	for _, e := range ents {
		buf = le.AppendUint64(buf, e.GetTerm())
		t := byte(e.GetType())
		if e.Data != nil {
			t |= entryHasData
		}
		ref := refs != nil && len(e.Data) >= refMinBytes
		if ref {
			t |= entryPadded
		}
		buf = append(buf, t)
		buf = le.AppendUint32(buf, uint32(len(e.Data)))
		if !ref {
			buf = append(buf, e.Data...)
			continue
		}
		addr := uintptr(unsafe.Pointer(unsafe.SliceData(e.Data)))
		pad := int(addr-uintptr(len(buf)+shift+padCountSize)) & (dioAlign - 1)
		buf = le.AppendUint16(buf, uint16(pad))
		buf = append(buf, zeroPage[:pad]...)
		crc = crc32.Update(crc32.Update(crc, castagnoli, buf[summed:]), castagnoli, e.Data)
		*refs = append(*refs, dataRef{at: len(buf), off: len(buf) + shift, data: e.Data})
		shift += len(e.Data)
		inRecord += len(e.Data)
		summed = len(buf)
	}
	crc = crc32.Update(crc, castagnoli, buf[summed:])
	le.PutUint32(buf[start:], uint32(len(buf)-start-recHeaderSize+inRecord))
	le.PutUint32(buf[start+4:], crc)
	return buf
}

// refMinBytes: entry data this large is written from the entry, not copied
// into the batch (appendEntries); at 256 KiB per write the copy was 3 % of a
// chunkserver's CPU. A variable so that the golden test can lower it.
var refMinBytes = 16 << 10

// appendBatch appends a batch record: the offset of the segment up to which
// it was known durable (fdatasynced) when the batch was written.
func appendBatch(buf []byte, mark int64) []byte {
	buf, start := beginRecord(buf)
	buf = append(buf, recBatch)
	buf = le.AppendUint64(buf, uint64(mark))
	endRecord(buf, start)
	return buf
}

// appendPad appends a pad record of n bytes (at least minPadRecord).
func appendPad(buf []byte, n int) []byte {
	buf, start := beginRecord(buf)
	buf = append(buf, recPad)
	buf = append(buf, make([]byte, n-minPadRecord)...)
	endRecord(buf, start)
	return buf
}

// padBefore is the size of the pad record that moves a record from off to
// the next dioAlign boundary (0 when off is on one).
func padBefore(off int64) int {
	n := int(-off) & (dioAlign - 1)
	if n > 0 && n < minPadRecord {
		n += dioAlign
	}
	return n
}

// dataRef is entry data that a batch holds by reference: it goes between
// buf[:at] and buf[at:], at offset off of the batch (buf with every ref's data
// inserted).
type dataRef struct {
	at, off int
	data    []byte
}

// batchSize is the size of the batch that is buf with the data of refs.
func batchSize(buf []byte, refs []dataRef) int {
	if len(refs) == 0 {
		return len(buf)
	}
	last := refs[len(refs)-1]
	return len(buf) + last.off + len(last.data) - last.at
}

// batchIOV returns the batch (buf with the data of refs) as pieces, appended
// to iov.
func batchIOV(iov [][]byte, buf []byte, refs []dataRef) [][]byte {
	pos := 0
	for _, r := range refs {
		iov = append(iov, buf[pos:r.at], r.data)
		pos = r.at
	}
	return append(iov, buf[pos:])
}

// appendTail appends the last n bytes of the concatenation of pieces to dst.
func appendTail(dst []byte, pieces [][]byte, n int) []byte {
	i, skip := len(pieces), 0
	for n > 0 && i > 0 {
		i--
		if l := len(pieces[i]); l >= n {
			skip, n = l-n, 0
		} else {
			n -= l
		}
	}
	for j := i; j < len(pieces); j++ {
		p := pieces[j]
		if j == i {
			p = p[skip:]
		}
		dst = append(dst, p...)
	}
	return dst
}

// hardState is the value form of raftpb.HardState kept in memory.
type hardState struct {
	term, vote, commit uint64
}

func appendHardState(buf []byte, group uint64, hs hardState) []byte {
	buf, start := beginRecord(buf)
	buf = append(buf, recHardState)
	buf = le.AppendUint64(buf, group)
	buf = le.AppendUint64(buf, hs.term)
	buf = le.AppendUint64(buf, hs.vote)
	buf = le.AppendUint64(buf, hs.commit)
	endRecord(buf, start)
	return buf
}

// snapRecord is the content of a snapshot record.
type snapRecord struct {
	group        uint64
	flags        byte
	index, term  uint64
	compactIndex uint64 // entries <= compactIndex are dropped
	compactTerm  uint64 // term of entry compactIndex
	conf         *pb.ConfState
	data         []byte
}

func appendUint64s(buf []byte, vs []uint64) []byte {
	buf = le.AppendUint32(buf, uint32(len(vs)))
	for _, v := range vs {
		buf = le.AppendUint64(buf, v)
	}
	return buf
}

func appendSnapshot(buf []byte, s *snapRecord) []byte {
	buf, start := beginRecord(buf)
	buf = append(buf, recSnapshot)
	buf = le.AppendUint64(buf, s.group)
	buf = append(buf, s.flags)
	buf = le.AppendUint64(buf, s.index)
	buf = le.AppendUint64(buf, s.term)
	buf = le.AppendUint64(buf, s.compactIndex)
	buf = le.AppendUint64(buf, s.compactTerm)
	autoLeave := byte(0)
	if s.conf.GetAutoLeave() {
		autoLeave = 1
	}
	buf = append(buf, autoLeave)
	buf = appendUint64s(buf, s.conf.GetVoters())
	buf = appendUint64s(buf, s.conf.GetLearners())
	buf = appendUint64s(buf, s.conf.GetVotersOutgoing())
	buf = appendUint64s(buf, s.conf.GetLearnersNext())
	buf = le.AppendUint32(buf, uint32(len(s.data)))
	buf = append(buf, s.data...)
	endRecord(buf, start)
	return buf
}

func appendGroupRemoved(buf []byte, group uint64) []byte {
	buf, start := beginRecord(buf)
	buf = append(buf, recGroupRemoved)
	buf = le.AppendUint64(buf, group)
	endRecord(buf, start)
	return buf
}

// recState is what checkRecord found.
type recState int

const (
	recOK  recState = iota // a complete record with a good CRC
	recEnd                 // no record: zero-fill, or a record of an older segment (recycled file)
	recBad                 // this segment's tag but incomplete or a bad CRC: torn or corrupt
)

// checkRecord validates the record at b[0:] of the segment whose tag is tag
// and returns its payload length.
func checkRecord(b []byte, tag uint32) (n int, st recState) {
	if len(b) < recHeaderSize {
		return 0, recBad
	}
	l := le.Uint32(b)
	if l == 0 || le.Uint32(b[8:]) != tag {
		return 0, recEnd
	}
	if l > maxRecord || int(l) > len(b)-recHeaderSize {
		return 0, recBad
	}
	crc := crc32.Checksum(b[recHeaderSize:recHeaderSize+int(l)], castagnoli)
	crc = crc32.Update(crc, castagnoli, b[:4])
	crc = crc32.Update(crc, castagnoli, b[8:12])
	if crc != le.Uint32(b[4:]) {
		return 0, recBad
	}
	return int(l), recOK
}

// decoder reads fixed-width fields from a payload whose CRC was good; a
// structural error means a bug or corruption that the CRC did not catch.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) need(n int) bool {
	if d.err != nil {
		return false
	}
	if n < 0 || len(d.b)-d.off < n {
		d.err = fmt.Errorf("%w: record payload too short at byte %d", ErrCorrupt, d.off)
		return false
	}
	return true
}

func (d *decoder) u8() byte {
	if !d.need(1) {
		return 0
	}
	d.off++
	return d.b[d.off-1]
}

func (d *decoder) u16() uint16 {
	if !d.need(2) {
		return 0
	}
	d.off += 2
	return le.Uint16(d.b[d.off-2:])
}

func (d *decoder) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	d.off += 4
	return le.Uint32(d.b[d.off-4:])
}

func (d *decoder) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	d.off += 8
	return le.Uint64(d.b[d.off-8:])
}

func (d *decoder) bytes(n int) []byte {
	if !d.need(n) {
		return nil
	}
	d.off += n
	return d.b[d.off-n : d.off]
}

func (d *decoder) uint64s() []uint64 {
	n := int(d.u32())
	if !d.need(n * 8) {
		return nil
	}
	if n == 0 {
		return nil
	}
	vs := make([]uint64, n)
	for i := range vs {
		vs[i] = d.u64()
	}
	return vs
}

// decodeSnapshot decodes a snapshot payload (after the type byte). Data is
// copied so that the record buffer can be dropped.
func decodeSnapshot(d *decoder) *snapRecord {
	s := &snapRecord{}
	s.group = d.u64()
	s.flags = d.u8()
	s.index = d.u64()
	s.term = d.u64()
	s.compactIndex = d.u64()
	s.compactTerm = d.u64()
	autoLeave := d.u8() == 1
	cs := &pb.ConfState{}
	cs.Voters = d.uint64s()
	cs.Learners = d.uint64s()
	cs.VotersOutgoing = d.uint64s()
	cs.LearnersNext = d.uint64s()
	cs.AutoLeave = new(autoLeave)
	s.conf = cs
	n := int(d.u32())
	if data := d.bytes(n); len(data) > 0 {
		s.data = append([]byte(nil), data...)
	}
	return s
}
