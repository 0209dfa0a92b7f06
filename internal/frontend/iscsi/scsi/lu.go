package scsi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/basalt-storage/basalt/internal/bufpool"
	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/reservation"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Config describes one logical unit. Backend and Info are required.
type Config struct {
	Backend frontend.Backend
	// Info is the export as of the attach (block sizes checked); the size is
	// re-read from Backend.Info for every command, so a resize is seen.
	Info frontend.Info
	// Classify wraps a failed IO's error in its frontend class; nil: as is.
	Classify func(error) error
	// ID identifies the device for ever (VPD page 0x83's NAA designator and the
	// unit serial number): derive it from the cluster and volume.
	ID uint64
	// TargetName is the iSCSI target's name, reported as the SCSI target
	// device name on VPD page 0x83.
	TargetName string
	// MaxTransfer is the largest READ or WRITE in bytes (Block Limits page);
	// default 8 MiB, and never above the backend's maximum.
	MaxTransfer int
	// PR, if set, serves persistent reservations (PERSISTENT RESERVE
	// IN/OUT) and checks every command against them; nil: those commands
	// are not served.
	PR *PR
	// MayWrite, if set, is asked before every command that writes (WRITE,
	// WRITE AND VERIFY, WRITE SAME, UNMAP, COMPARE AND WRITE) to a
	// writable LU: false refuses it as fenced (senseFenced), an error with
	// NOT READY, BECOMING READY (retried). The iSCSI target passes its
	// session's frontend.WriteGate.Allow. nil: writes are allowed.
	MayWrite func() (bool, error)
	// Group is the export's LUs in this process (one per session): unit
	// attentions are raised on all of them and COMPARE AND WRITE is
	// serialized among them; nil: a group of this LU alone. Close the LU
	// when its session ends.
	Group *Group
}

// LU is a SCSI logical unit (a direct-access block device) over one backend.
// It is safe for concurrent use: Execute may run many commands at once.
type LU struct {
	cfg         Config
	b           frontend.Backend
	bs          int   // logical block size
	maxXfer     int   // bytes, a multiple of bs
	chunk       int64 // the largest single backend IO for trim/zero/write-same
	readOnly    bool
	canTrim     bool
	canZero     bool
	canFlush    bool
	group       *Group
	ua          attentions
	serial      string
	maxCAWBlock int
	// caw is the backend's atomic compare-and-write; nil: COMPARE AND
	// WRITE is not served.
	caw    frontend.CompareAndWriter
	pr     *PR
	prSeen prNexus
}

// Result is a command's outcome: its status, the sense data of a CHECK
// CONDITION, and the Data-In bytes (already cut to the allocation length).
type Result struct {
	Status byte
	Sense  *Sense
	Data   []byte
	// Release, if set, gives Data back (to bufpool) once the caller is
	// done with it; a caller that never calls it only costs the pool a
	// buffer. Call it at most once: the buffer is reused at once.
	Release func()
}

func good(data []byte) Result { return Result{Status: StatusGood, Data: data} }

func check(s *Sense) Result { return Result{Status: StatusCheckCondition, Sense: s} }

const (
	maxUnmapDescriptors = 256
	maxWriteSameBytes   = 1 << 30 // one WRITE SAME covers at most this much
	// maxCAWBlocks is the MAXIMUM COMPARE AND WRITE LENGTH: one block, as
	// Linux LIO reports and VMware's ATS uses. The backend's compare-and-write
	// takes a range within one aligned api.MaxCompareAndWrite block (for a
	// basalt volume, one chunk), which one aligned block of at most 64 KiB
	// always is; two blocks can straddle a chunk boundary.
	maxCAWBlocks = 1
)

// New returns the logical unit cfg describes.
func New(cfg Config) *LU {
	info := cfg.Info
	bs := 512
	if int(info.BlockSizes.Minimum) > bs {
		bs = int(info.BlockSizes.Minimum)
	}
	if cfg.MaxTransfer <= 0 {
		cfg.MaxTransfer = 8 << 20
	}
	if m := int(info.BlockSizes.Maximum); m > 0 && m < cfg.MaxTransfer {
		cfg.MaxTransfer = m
	}
	maxXfer := max(cfg.MaxTransfer/bs*bs, bs)
	chunk := int64(maxWriteSameBytes)
	if m := int64(info.BlockSizes.Maximum); m > 0 {
		chunk = max(m/int64(bs)*int64(bs), int64(bs))
	}
	if cfg.Classify == nil {
		cfg.Classify = func(err error) error { return err }
	}
	if cfg.Group == nil {
		cfg.Group = NewGroup()
	}
	lu := &LU{
		cfg: cfg, b: cfg.Backend, bs: bs, maxXfer: maxXfer, chunk: chunk,
		readOnly: info.ReadOnly, canTrim: info.CanTrim && !info.ReadOnly,
		canZero: info.CanWriteZeroes && !info.ReadOnly, canFlush: info.CanFlush,
		group: cfg.Group, serial: fmt.Sprintf("%016x", cfg.ID),
		pr: cfg.PR,
	}
	if c, ok := cfg.Backend.(frontend.CompareAndWriter); ok && bs <= api.MaxCompareAndWrite {
		lu.caw, lu.maxCAWBlock = c, maxCAWBlocks
	}
	lu.ua.blocks.Store(lu.blocks())
	cfg.Group.join(lu)
	return lu
}

// BlockSize is the logical block size in bytes.
func (lu *LU) BlockSize() int { return lu.bs }

// MaxTransfer is the largest READ or WRITE in bytes.
func (lu *LU) MaxTransfer() int { return lu.maxXfer }

func (lu *LU) blocks() uint64 { return uint64(lu.b.Info().Size) / uint64(lu.bs) }

// inRange reports whether [lba, lba+n) lies on the device.
func (lu *LU) inRange(lba uint64, n uint64) bool {
	total := lu.blocks()
	return lba <= total && n <= total-lba
}

// Execute runs c (from Decode) with dataOut, the Data-Out bytes received (at
// most c.DataOut; fewer if the initiator sent fewer), and calls done exactly
// once, on any goroutine, maybe before Execute returns.
func (lu *LU) Execute(c *Command, dataOut []byte, done func(Result)) {
	if (c.kind == kPRIn || c.kind == kPROut || c.kind == kReserve6 || c.kind == kRelease6) && lu.pr == nil {
		done(check(sense(senseInvalidOpcode)))
		return
	}
	// The reservation state (its attentions for this nexus first).
	var pr *reservation.State
	if lu.pr != nil && c.reportsAttention() {
		st, expires, s := lu.prState(c)
		if s != nil {
			done(check(s))
			return
		}
		pr = st
		if a := c.access(); !expires.IsZero() && (a == reservation.AccessRead || a == reservation.AccessWrite) {
			done = lu.recheckAfter(expires, done)
		}
	}
	if c.reportsAttention() {
		if s := lu.attention(); s != nil {
			if c.kind == kRequestSense {
				// REQUEST SENSE returns the condition as its data.
				done(good(cut(s.data(c.desc), c.alloc)))
				return
			}
			done(check(s))
			return
		}
	}
	if pr.Conflicts(lu.prNexus(), c.access()) {
		done(Result{Status: StatusReservationConflict})
		return
	}
	if c.writes() && !lu.readOnly && lu.cfg.MayWrite != nil {
		switch ok, err := lu.cfg.MayWrite(); {
		case err != nil:
			done(check(sense(senseBecomingReady)))
			return
		case !ok:
			done(check(sense(senseFenced)))
			return
		}
	}
	if c.Dir == DirOut && len(dataOut) < c.DataOut {
		// The initiator's expected transfer length is shorter than the CDB's.
		done(check(invalidField(0)))
		return
	}
	switch c.kind {
	case kNone:
		done(good(nil))
	case kPRIn:
		done(lu.persistentReserveIn(c, pr))
	case kPROut:
		// A call to the store that may take a while: on a goroutine.
		go func() { done(lu.persistentReserveOut(c, dataOut[:c.DataOut])) }()
	case kReserve6:
		go func() { done(lu.spc2(reservation.ReserveSPC2)) }()
	case kRelease6:
		go func() { done(lu.spc2(reservation.ReleaseSPC2)) }()
	case kModeSelect:
		done(lu.modeSelect(c, dataOut[:c.DataOut]))
	case kRead, kWrite:
		lu.readWrite(c, dataOut, done)
	case kPrefetch:
		// Nothing to load ahead into: GOOD once the range is checked.
		if !lu.inRange(c.lba, uint64(c.blocks)) {
			done(check(sense(senseLBAOutOfRange)))
			return
		}
		done(good(nil))
	case kSync:
		if !lu.canFlush {
			done(good(nil))
			return
		}
		lu.b.Submit(api.OpFlush, nil, 0, 0, func(err error) {
			if err != nil {
				done(check(ErrorSense(lu.cfg.Classify(err), true)))
				return
			}
			done(good(nil))
		})
	case kVerify, kWriteSame, kCompareAndWrite, kUnmap, kGetLBAStatus:
		if s := lu.precheck(c); s != nil {
			done(check(s))
			return
		}
		// Several backend IOs in a row: on a goroutine of their own.
		go func() { done(lu.slow(c, dataOut)) }()
	default:
		done(lu.info(c))
	}
}

// transferLengthField is the CDB byte of a READ or WRITE's TRANSFER LENGTH.
func transferLengthField(op byte) int {
	switch op {
	case opRead6, opWrite6:
		return 4
	case opRead12, opWrite12, opWriteVerify12:
		return 6
	case opRead16, opWrite16, opWriteVerify16:
		return 10
	}
	return 7
}

// DataOutTooLong is the refusal of a command whose Data-Out is more than
// this LU takes in one command (MAXIMUM TRANSFER LENGTH; for COMPARE AND
// WRITE its maximum length), nil if it fits. The target asks before it
// receives the data, and so before it makes room for it: an initiator
// naming a 4 GiB WRITE must not make the target allocate 4 GiB.
func (lu *LU) DataOutTooLong(c *Command) *Sense {
	switch {
	case c.kind == kCompareAndWrite && int(c.blocks) > lu.maxCAWBlock:
		return invalidField(13)
	case c.DataOut <= lu.maxXfer:
		return nil
	case c.kind == kWrite:
		return invalidField(transferLengthField(c.Op))
	}
	return sense(senseParamLenError)
}

// precheck validates what the slow commands need before any IO.
func (lu *LU) precheck(c *Command) *Sense {
	switch c.kind {
	case kVerify:
		if !lu.inRange(c.lba, uint64(c.blocks)) {
			return sense(senseLBAOutOfRange)
		}
		if c.bytchk == 1 && int(c.blocks)*lu.bs > lu.maxXfer {
			return invalidField(7)
		}
	case kWriteSame:
		if lu.readOnly {
			return sense(senseWriteProtected)
		}
		if (c.unmap || c.ndob) && !lu.canZero && !lu.canTrim {
			return invalidField(1)
		}
		if uint64(c.blocks)*uint64(lu.bs) > maxWriteSameBytes {
			return invalidField(10)
		}
		if !lu.inRange(c.lba, uint64(c.blocks)) {
			return sense(senseLBAOutOfRange)
		}
	case kCompareAndWrite:
		if lu.readOnly {
			return sense(senseWriteProtected)
		}
		if lu.caw == nil {
			return sense(senseInvalidOpcode)
		}
		if int(c.blocks) > lu.maxCAWBlock {
			return invalidField(13)
		}
		if !lu.inRange(c.lba, uint64(c.blocks)) {
			return sense(senseLBAOutOfRange)
		}
	case kUnmap:
		if !lu.canTrim {
			if lu.readOnly {
				return sense(senseWriteProtected)
			}
			return sense(senseInvalidOpcode)
		}
	case kGetLBAStatus:
		if c.lba >= lu.blocks() {
			return sense(senseLBAOutOfRange)
		}
	}
	return nil
}

func (lu *LU) readWrite(c *Command, dataOut []byte, done func(Result)) {
	write := c.kind == kWrite
	if write && lu.readOnly {
		done(check(sense(senseWriteProtected)))
		return
	}
	if !lu.inRange(c.lba, uint64(c.blocks)) {
		done(check(sense(senseLBAOutOfRange)))
		return
	}
	n := int(c.blocks) * lu.bs
	if n > lu.maxXfer {
		done(check(invalidField(transferLengthField(c.Op))))
		return
	}
	if n == 0 {
		done(good(nil))
		return
	}
	off := int64(c.lba) * int64(lu.bs)
	if write {
		lu.b.Submit(api.OpWrite, dataOut[:n], off, int64(n), func(err error) {
			if err != nil {
				done(check(ErrorSense(lu.cfg.Classify(err), true)))
				return
			}
			done(good(nil))
		})
		return
	}
	// Pooled: a fresh buffer per read was most of the target's garbage
	// (and GC most of its CPU per read); the read's callbacks too.
	op := getReadOp()
	op.lu, op.buf, op.done = lu, bufpool.Get(n), done
	lu.b.Submit(api.OpRead, *op.buf, off, int64(n), op.readFn)
}

// readOp is one READ in the backend and then its data until the caller's
// Result.Release; pooled, with its callbacks bound once.
type readOp struct {
	lu        *LU
	buf       *[]byte
	done      func(Result)
	readFn    func(error) // op.read
	releaseFn func()      // op.release
}

var readOps sync.Pool

func getReadOp() *readOp {
	if op, ok := readOps.Get().(*readOp); ok {
		return op
	}
	op := &readOp{}
	op.readFn, op.releaseFn = op.read, op.release
	return op
}

// read is the backend's callback.
func (op *readOp) read(err error) {
	done := op.done
	if err != nil {
		classified := op.lu.cfg.Classify(err)
		op.release()
		done(check(ErrorSense(classified, false)))
		return
	}
	done(Result{Status: StatusGood, Data: *op.buf, Release: op.releaseFn})
}

// release gives the buffer and op back.
func (op *readOp) release() {
	bufpool.Put(op.buf)
	op.lu, op.buf, op.done = nil, nil, nil
	readOps.Put(op)
}

// io runs one backend IO and waits for it.
func (lu *LU) io(op api.Op, buf []byte, off, n int64) error {
	ch := make(chan error, 1)
	lu.b.Submit(op, buf, off, n, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		return lu.cfg.Classify(err)
	}
	return nil
}

// zero writes zeros (or trims, which reads back as zeros) over the range, in
// chunks the backend takes.
func (lu *LU) zero(off, n int64, trim bool) error {
	op := api.OpWriteZeroes
	if trim && lu.canTrim || !lu.canZero {
		op = api.OpTrim
	}
	for n > 0 {
		k := min(n, lu.chunk)
		if err := lu.io(op, nil, off, k); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// slow runs the commands that take several backend IOs; prechecked.
func (lu *LU) slow(c *Command, dataOut []byte) Result {
	bs := int64(lu.bs)
	off := int64(c.lba) * bs
	n := int64(c.blocks) * bs
	switch c.kind {
	case kVerify:
		if c.bytchk == 0 || n == 0 {
			return good(nil)
		}
		buf := make([]byte, n)
		if err := lu.io(api.OpRead, buf, off, n); err != nil {
			return check(ErrorSense(err, false))
		}
		want := dataOut[:c.DataOut]
		for i := int64(0); i < n; i += int64(len(want)) {
			if j := mismatch(buf[i:i+int64(len(want))], want); j >= 0 {
				s := sense(senseMiscompare)
				s.Info, s.InfoValid = uint64(i)+uint64(j), true
				if c.bytchk == 3 {
					s.Info = uint64(j)
				}
				return check(s)
			}
		}
		return good(nil)

	case kWriteSame:
		if c.ndob || (c.unmap && allZero(dataOut[:bs])) {
			if err := lu.zero(off, n, c.unmap); err != nil {
				return check(ErrorSense(err, true))
			}
			return good(nil)
		}
		pattern := dataOut[:bs]
		if allZero(pattern) && lu.canZero {
			if err := lu.zero(off, n, false); err != nil {
				return check(ErrorSense(err, true))
			}
			return good(nil)
		}
		buf := bytes.Repeat(pattern, int(min(n, 1<<20)/bs))
		for n > 0 {
			k := min(n, int64(len(buf)))
			if err := lu.io(api.OpWrite, buf[:k], off, k); err != nil {
				return check(ErrorSense(err, true))
			}
			off, n = off+k, n-k
		}
		return good(nil)

	case kCompareAndWrite:
		if n == 0 {
			return good(nil)
		}
		// The backend compares and writes atomically against every other IO
		// of the volume, from any access node (frontend.CompareAndWriter).
		ch := make(chan error, 1)
		lu.caw.CompareAndWrite(dataOut[:2*n], off, n, func(err error) { ch <- err })
		var me *frontend.MiscompareError
		switch err := <-ch; {
		case errors.As(err, &me):
			s := sense(senseMiscompare)
			s.Info, s.InfoValid = uint64(me.Offset), true
			return check(s)
		case err != nil:
			return check(ErrorSense(lu.cfg.Classify(err), true))
		}
		return good(nil)

	case kUnmap:
		return lu.unmap(dataOut[:c.DataOut])

	case kGetLBAStatus:
		return lu.lbaStatus(c)
	}
	return check(sense(senseInternalError))
}

// lbaStatusWindow bounds the range one GET LBA STATUS looks at (from its
// starting LBA): a few chunks, one backend request each.
const lbaStatusWindow = 64 << 20

// lbaRun is one LBA status descriptor's worth: n blocks from lba.
type lbaRun struct {
	lba, n      uint64
	deallocated bool
}

// lbaStatus answers GET LBA STATUS (SBC-3 5.8) from the backend's map of the
// blocks that hold data (frontend.Mapper): runs of mapped and deallocated
// blocks from the starting LBA, as many descriptors as the allocation length
// takes, over at most lbaStatusWindow bytes. A backend without a map (or
// that cannot trim: LBPME is off) has every block mapped.
func (lu *LU) lbaStatus(c *Command) Result {
	total := lu.blocks()
	runs := []lbaRun{{lba: c.lba, n: total - c.lba}}
	if m, ok := lu.b.(frontend.Mapper); ok && lu.canTrim {
		var err error
		if runs, err = lu.mapRuns(m, c.lba, total, max((c.alloc-8)/16, 1)); err != nil {
			return check(ErrorSense(err, false))
		}
	}
	d := make([]byte, 8, 8+16*len(runs))
	for _, r := range runs {
		for r.n > 0 { // a descriptor counts at most 2^32-1 blocks
			k := min(r.n, 0xffffffff)
			var e [16]byte
			binary.BigEndian.PutUint64(e[0:], r.lba)
			binary.BigEndian.PutUint32(e[8:], uint32(k))
			if r.deallocated {
				e[12] = 1 // PROVISIONING STATUS: deallocated
			}
			d = append(d, e[:]...)
			r.lba, r.n = r.lba+k, r.n-k
		}
	}
	binary.BigEndian.PutUint32(d[0:], uint32(len(d)-4))
	return good(cut(d, c.alloc))
}

// mapRuns reads the backend's map from block lba on (at most
// lbaStatusWindow bytes) and returns at most maxRuns runs of mapped or
// deallocated blocks, the first starting at lba. A block is mapped if any
// of it may hold data. The device's tail past its last whole api.MapAlign,
// which the map does not cover, is reported mapped.
func (lu *LU) mapRuns(m frontend.Mapper, lba, total uint64, maxRuns int) ([]lbaRun, error) {
	bs := int64(lu.bs)
	size := int64(total) * bs
	whole := size / api.MapAlign * api.MapAlign // the part the map covers
	from := int64(lba) * bs / api.MapAlign * api.MapAlign
	to := min(from+lbaStatusWindow, whole)
	if to <= from || uint64(to/bs) <= lba {
		return []lbaRun{{lba: lba, n: total - lba}}, nil // all in the tail
	}
	bits := make([]byte, api.MappedBytes(to-from))
	ch := make(chan error, 1)
	m.Mapped(bits, from, to-from, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		return nil, lu.cfg.Classify(err)
	}
	mapped := func(b uint64) bool { // block b, wholly inside [from, to)
		g0 := (int64(b)*bs - from) / api.MapGranule
		g1 := ((int64(b)+1)*bs - from + api.MapGranule - 1) / api.MapGranule
		for g := g0; g < g1; g++ {
			if bits[g/8]&(1<<(g%8)) != 0 {
				return true
			}
		}
		return false
	}
	end := uint64(to / bs) // the blocks wholly inside the map
	var runs []lbaRun
	add := func(b, n uint64, dealloc bool) bool {
		if k := len(runs); k > 0 && runs[k-1].deallocated == dealloc {
			runs[k-1].n += n
			return true
		}
		if len(runs) == maxRuns {
			return false
		}
		runs = append(runs, lbaRun{lba: b, n: n, deallocated: dealloc})
		return true
	}
	for b := lba; b < end; b++ {
		if !add(b, 1, !mapped(b)) {
			return runs, nil
		}
	}
	if to == whole && end < total {
		add(end, total-end, false)
	}
	return runs, nil
}

// unmap runs UNMAP's parameter list (SBC-3 5.28.2).
func (lu *LU) unmap(p []byte) Result {
	if len(p) == 0 {
		return good(nil)
	}
	if len(p) < 8 {
		return check(sense(senseParamLenError))
	}
	dl := int(binary.BigEndian.Uint16(p[2:]))
	if dl > len(p)-8 {
		dl = len(p) - 8 // as much as was sent (SBC-3: not an error)
	}
	if dl%16 != 0 {
		return check(sense(senseParamLenError))
	}
	if dl/16 > maxUnmapDescriptors {
		return check(invalidParamField(2))
	}
	descs := p[8 : 8+dl]
	for i := 0; i < len(descs); i += 16 {
		lba := binary.BigEndian.Uint64(descs[i:])
		n := binary.BigEndian.Uint32(descs[i+8:])
		if !lu.inRange(lba, uint64(n)) {
			return check(sense(senseLBAOutOfRange))
		}
	}
	bs := int64(lu.bs)
	for i := 0; i < len(descs); i += 16 {
		lba := int64(binary.BigEndian.Uint64(descs[i:]))
		n := int64(binary.BigEndian.Uint32(descs[i+8:]))
		if n == 0 {
			continue
		}
		if err := lu.zero(lba*bs, n*bs, true); err != nil {
			return check(ErrorSense(err, true))
		}
	}
	return good(nil)
}

func mismatch(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// cut returns at most alloc bytes of b.
func cut(b []byte, alloc int) []byte {
	if len(b) > alloc {
		return b[:alloc]
	}
	return b
}
