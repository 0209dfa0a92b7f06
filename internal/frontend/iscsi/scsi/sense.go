package scsi

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/basalt-storage/basalt/internal/frontend"
)

// Status codes (SAM-5).
const (
	StatusGood           = 0x00
	StatusCheckCondition = 0x02
	StatusBusy           = 0x08
	StatusTaskSetFull    = 0x28
	StatusTaskAborted    = 0x40
)

// Sense keys (SPC-4 table 49).
const (
	KeyNoSense        = 0x0
	KeyNotReady       = 0x2
	KeyMediumError    = 0x3
	KeyHardwareError  = 0x4
	KeyIllegalRequest = 0x5
	KeyUnitAttention  = 0x6
	KeyDataProtect    = 0x7
	KeyAbortedCommand = 0xb
	KeyMiscompare     = 0xe
)

// Sense is a CHECK CONDITION's reason: sense key and additional sense code and
// qualifier, with the optional INFORMATION field (a miscompare's offset) and
// sense-key-specific field pointer (the CDB byte at fault).
type Sense struct {
	Key, ASC, ASCQ byte
	Info           uint64
	InfoValid      bool
	// Field is the CDB (or parameter list, with FieldInData) byte the
	// error is about; valid when FieldValid.
	Field       uint16
	FieldValid  bool
	FieldInData bool
}

func (s *Sense) Error() string {
	return fmt.Sprintf("scsi: sense key %#x asc/ascq %02x/%02x", s.Key, s.ASC, s.ASCQ)
}

// The sense data this package returns.
var (
	senseInvalidOpcode   = Sense{Key: KeyIllegalRequest, ASC: 0x20}
	senseLBAOutOfRange   = Sense{Key: KeyIllegalRequest, ASC: 0x21}
	senseInvalidParam    = Sense{Key: KeyIllegalRequest, ASC: 0x26}
	senseParamLenError   = Sense{Key: KeyIllegalRequest, ASC: 0x1a}
	senseSavingNotSupp   = Sense{Key: KeyIllegalRequest, ASC: 0x39}
	senseWriteProtected  = Sense{Key: KeyDataProtect, ASC: 0x27}
	senseSpaceAllocFail  = Sense{Key: KeyDataProtect, ASC: 0x27, ASCQ: 0x07}
	sensePortUnavailable = Sense{Key: KeyNotReady, ASC: 0x04, ASCQ: 0x0c}
	senseBecomingReady   = Sense{Key: KeyNotReady, ASC: 0x04, ASCQ: 0x01}
	senseNotReady        = Sense{Key: KeyNotReady, ASC: 0x04}
	senseReadError       = Sense{Key: KeyMediumError, ASC: 0x11}
	senseWriteError      = Sense{Key: KeyMediumError, ASC: 0x0c}
	senseInternalError   = Sense{Key: KeyHardwareError, ASC: 0x44}
	senseMiscompare      = Sense{Key: KeyMiscompare, ASC: 0x1d}
)

// senseFenced refuses a write from an initiator that may not write
// (Config.MayWrite: the volume was published to another node). It is
// DATA PROTECT, WRITE PROTECTED — what a read-only LU answers — rather
// than a status of its own because that is the answer every initiator
// handles as final: Linux's SCSI midlayer completes DATA PROTECT as a
// target failure (no retry, BLK_STS_TARGET), which dm-multipath does not
// take for a path error, so the write fails up at once instead of
// going round the paths (what DNR does for NVMe's ANA Inaccessible);
// QEMU's iSCSI driver makes it EACCES. Reads go on. NOT READY (ALUA
// transition, unavailable) would be retried, and failed over, for
// ever; RESERVATION CONFLICT would send clustering software looking
// for a persistent reservation that is not there; LOGICAL UNIT ACCESS
// NOT AUTHORIZED (74/71) is taken for a locked drive (a state of the
// whole LU) by USB disks and a proposed Linux sd change.
var senseFenced = senseWriteProtected

// invalidField is ILLEGAL REQUEST, INVALID FIELD IN CDB (24/00) pointing at
// CDB byte b.
func invalidField(b int) *Sense {
	return &Sense{Key: KeyIllegalRequest, ASC: 0x24, Field: uint16(b), FieldValid: true}
}

// invalidParamField is ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST
// (26/00) pointing at parameter byte b.
func invalidParamField(b int) *Sense {
	s := senseInvalidParam
	s.Field, s.FieldValid, s.FieldInData = uint16(b), true, true
	return &s
}

func sense(s Sense) *Sense { return &s }

// Fixed returns s in fixed format (SPC-4 4.5.3), 18 bytes.
func (s *Sense) Fixed() []byte {
	b := make([]byte, 18)
	b[0] = 0x70
	if s.InfoValid {
		b[0] |= 0x80
		binary.BigEndian.PutUint32(b[3:], uint32(s.Info))
	}
	b[2] = s.Key
	b[7] = 10
	b[12], b[13] = s.ASC, s.ASCQ
	if s.FieldValid {
		b[15] = 0x80 // SKSV
		if !s.FieldInData {
			b[15] |= 0x40 // C/D: the CDB
		}
		binary.BigEndian.PutUint16(b[16:], s.Field)
	}
	return b
}

// data returns s as REQUEST SENSE returns it: in descriptor format (SPC-4
// 4.5.2; key and codes only) when desc, else fixed.
func (s *Sense) data(desc bool) []byte {
	if desc {
		return []byte{0x72, s.Key, s.ASC, s.ASCQ, 0, 0, 0, 0}
	}
	return s.Fixed()
}

// ErrorSense maps an IO failure's class (frontend's error classes; see the
// table in package frontend's doc) to sense data. write says whether the IO
// wrote (to pick the medium error's ASC).
func ErrorSense(err error, write bool) *Sense {
	switch {
	case errors.Is(err, frontend.ErrReadOnly):
		return sense(senseWriteProtected)
	case errors.Is(err, frontend.ErrFenced):
		return sense(sensePortUnavailable)
	case errors.Is(err, frontend.ErrNoSpace):
		return sense(senseSpaceAllocFail)
	case errors.Is(err, frontend.ErrOutOfRange):
		return sense(senseLBAOutOfRange)
	case errors.Is(err, frontend.ErrInvalid):
		return invalidField(0)
	case errors.Is(err, frontend.ErrNotSupported):
		return sense(senseInvalidOpcode)
	case errors.Is(err, frontend.ErrUnavailable):
		return sense(senseBecomingReady)
	case errors.Is(err, frontend.ErrShuttingDown):
		return sense(senseNotReady)
	case write:
		return sense(senseWriteError)
	default:
		return sense(senseReadError)
	}
}
