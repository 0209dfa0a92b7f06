package frontend

import (
	"context"
	"fmt"

	"github.com/basalt-storage/basalt/pkg/api"
)

// Backend is one open block device: what a protocol server submits IO to.
// Exports opens it through an Opener and shares it among every attachment to
// its export.
type Backend interface {
	// Submit starts one IO and calls done exactly once, maybe on another
	// goroutine, maybe before Submit returns. buf is the read destination or the
	// write source (len(buf) == length); Flush, Trim and WriteZeroes pass nil.
	// Every completed write is durable. The protocol server has already checked
	// the request against Info (range, alignment, read-only, capabilities). A
	// failure is classified by the Opener's Classify.
	Submit(op api.Op, buf []byte, off, length int64, done func(error))
	// Info describes the device as it is now: its size may grow while it is open.
	Info() Info
	// Check is called when another attachment joins the open backend. It
	// re-reads what may have changed (the size) and returns nil, or why the
	// backend can serve no more IO (wrapping ErrFenced when a newer writer took
	// the device over); Exports then opens a fresh backend for the newcomer.
	Check(ctx context.Context) error
	// Close releases the device (its sessions and connections). Exports calls it
	// once: after the last attachment detached, with no IO in flight, or from
	// Exports.Close, when IO still in flight must complete (it may fail) and
	// later IO must fail without touching the storage.
	Close() error
}

// Mapper is an optional Backend ability of a thin device: which of its
// blocks hold data (the iSCSI GET LBA STATUS command). Blocks that hold none
// read as zeros.
type Mapper interface {
	// Mapped fills bits with one bit per api.MapGranule of [off,
	// off+length): bit i (byte i/8, bit i%8 from the least significant) set
	// when the granule at off + i*api.MapGranule may hold data, clear when
	// it holds none. off and length are multiples of api.MapAlign; bits
	// has api.MappedBytes(length) bytes. done runs once, as Submit's.
	Mapped(bits []byte, off, length int64, done func(error))
}

// CompareAndWriter is an optional Backend ability: a write that happens only
// if the device holds given data where it goes, atomically with respect to
// every other IO of the device, through whichever front end it comes (SCSI
// COMPARE AND WRITE; for basalt volumes the copyset's leader compares,
// docs/iscsi.md). A protocol without the ability on its backend has no
// atomic compare-and-write to offer.
type CompareAndWriter interface {
	// CompareAndWrite compares [off, off+length) with buf[:length] and, if
	// equal, writes buf[length:2*length] there. length is at most
	// api.MaxCompareAndWrite and the range lies within one aligned
	// api.MaxCompareAndWrite block (one logical block of a protocol does).
	// done gets nil (written), a *MiscompareError (nothing written), or an
	// IO failure as Submit's; it runs once, as Submit's.
	CompareAndWrite(buf []byte, off, length int64, done func(error))
}

// MiscompareError is CompareAndWrite's answer when the device held other
// data: nothing was written. Offset is that of the first differing byte,
// from the start of the range.
type MiscompareError struct{ Offset int64 }

func (e *MiscompareError) Error() string {
	return fmt.Sprintf("frontend: miscompare at byte %d", e.Offset)
}

// Info is what a protocol advertises about an export before any IO.
type Info struct {
	Size     int64
	ReadOnly bool // every write, trim and write-zeroes is refused before the backend

	// The commands besides read and write that the backend serves. FUA means a
	// write may carry Force Unit Access: every completed write is durable anyway,
	// so the flag never reaches the backend.
	CanFlush, CanFUA, CanTrim, CanWriteZeroes bool

	BlockSizes BlockSizes
	// Description is for people (NBD_INFO_DESCRIPTION); it may be empty.
	Description string
}

// BlockSizes are the sizes IO must respect. Zero fields take the defaults;
// Exports hands protocol servers only checked, defaulted values.
type BlockSizes struct {
	// Minimum divides every offset and length: 1 (the default) or a power of two
	// up to 64 KiB.
	Minimum uint32
	// Preferred is the size and alignment the device serves best: a power of two
	// of at least max(Minimum, 512); default max(Minimum, 4096).
	Preferred uint32
	// Maximum is the largest IO the device takes; 0 = no limit of its own (the
	// protocol's limit still applies). A multiple of Minimum, at least Preferred.
	Maximum uint32
}

// checked returns info with default block sizes filled in, or ErrBadInfo.
func (info Info) checked() (Info, error) {
	bs := &info.BlockSizes
	if bs.Minimum == 0 {
		bs.Minimum = 1
	}
	if bs.Preferred == 0 {
		bs.Preferred = max(bs.Minimum, 4096)
	}
	pow2 := func(v uint32) bool { return v&(v-1) == 0 }
	switch {
	case info.Size < 0:
		return info, fmt.Errorf("%w: size %d", ErrBadInfo, info.Size)
	case !pow2(bs.Minimum) || bs.Minimum > 64<<10:
		return info, fmt.Errorf("%w: minimum block size %d is not a power of two up to 64 KiB", ErrBadInfo, bs.Minimum)
	case !pow2(bs.Preferred) || bs.Preferred < max(bs.Minimum, 512):
		return info, fmt.Errorf("%w: preferred block size %d is not a power of two of at least max(minimum %d, 512)",
			ErrBadInfo, bs.Preferred, bs.Minimum)
	case bs.Maximum != 0 && (bs.Maximum < bs.Preferred || bs.Maximum%bs.Minimum != 0):
		return info, fmt.Errorf("%w: maximum block size %d is below the preferred %d or not a multiple of the minimum %d",
			ErrBadInfo, bs.Maximum, bs.Preferred, bs.Minimum)
	}
	return info, nil
}

// Opener is the storage behind the exports: package volumes over the client
// library, or a test's memory disks.
type Opener interface {
	// Open opens the named device for IO, or fails with ErrNoSuchExport. It must
	// not take the device's exclusive writer role: a backend claims that on its
	// first write, so attaching only to read (nbdinfo, a standby multipath path)
	// never fences the writer that another front end serves.
	Open(ctx context.Context, name string) (Backend, error)
	// Stat describes the named device from its metadata alone, without opening it
	// (NBD_OPT_INFO), or fails with ErrNoSuchExport.
	Stat(ctx context.Context, name string) (Info, error)
	// List returns the names of the devices that can be opened.
	List(ctx context.Context) ([]string, error)
	// Classify returns err, the failure of an IO of one of its backends, wrapped
	// in its class (ErrFenced, ErrNoSpace, ...); an error it has no class for is
	// returned as is, and protocols treat it as ErrIO.
	Classify(err error) error
}
