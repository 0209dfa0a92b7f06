package api

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// HeaderSize is the fixed size of every frame header.
const HeaderSize = 80

// Magic opens every frame: "BSLT" read as a big-endian uint32.
const Magic uint32 = 0x42534c54

// Version is the frame format version this code speaks (2 added Seq and
// Settled; a version-1 peer's frames are refused).
const Version uint8 = 2

// MaxPayload bounds the payload a peer may announce. Larger frames are refused
// before any memory is allocated for them.
const MaxPayload = 64 << 20

// Op says what a frame asks for; replies carry the op of their request. It is
// basalt's one operation enum: ops 1–5 are the block IO a volume serves, which
// the client library's Volume.Submit and every front end's backend take as is;
// the others are frames between a client and a chunkserver (ping, checksum) or
// between chunkservers (raft, snapshot) in the same one-byte namespace of the
// frame header, so a frame's op needs no translation on its way through. (The
// Raft log has its own command codes, internal/chunkserver's cmdOp: a command
// is not a request, and its bytes are on disk.)
type Op uint8

const (
	OpRead        Op = 1  // payload: none; reply payload: Length bytes
	OpWrite       Op = 2  // payload: Length bytes of data
	OpTrim        Op = 3  // discard [Offset, Offset+Length); reads as zeros after
	OpWriteZeroes Op = 4  // write zeros over [Offset, Offset+Length)
	OpFlush       Op = 5  // all earlier acknowledged writes are durable (they already are)
	OpPing        Op = 6  // liveness; empty reply
	OpChecksum    Op = 7  // per-chunk checksums of one copyset replica (scrub, tests)
	OpFence       Op = 8  // raise Volume's epoch to Epoch in copyset Copyset, through its raft log (writer takeover)
	OpAttach      Op = 9  // payload: the session capability for Volume, for the rest of this connection (docs/security.md)
	OpMapped      Op = 10 // which of [Offset, Offset+Length) holds data (MapGranule, MappedBytes); read on the leader
	// OpCompareAndWrite: payload is Length bytes to compare, then Length
	// bytes to write (Length <= MaxCompareAndWrite); the write happens only
	// if [Offset, Offset+Length) holds the first half, atomically with
	// respect to every other IO of the volume; else StatusMiscompare.
	OpCompareAndWrite Op = 11
	OpRaft            Op = 16 // payload: a batch of raft messages (peer to peer, no reply)
	OpSnapshot        Op = 17 // snapshot transfer between replicas (see raftstore)
)

var opNames = [...]string{
	OpRead: "read", OpWrite: "write", OpTrim: "trim", OpWriteZeroes: "write_zeroes", OpFlush: "flush",
	OpPing: "ping", OpChecksum: "checksum", OpFence: "fence", OpAttach: "attach", OpMapped: "mapped",
	OpCompareAndWrite: "compare_and_write", OpRaft: "raft",
	OpSnapshot: "snapshot",
}

// String is the op's name as logs and metric labels show it ("write_zeroes").
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// MapGranule is the unit OpMapped reports: a bit per 4 KiB, set when any of
// it holds data in the chunk file (SEEK_DATA / SEEK_HOLE on the leader's
// replica: a chunk never written, or a range trimmed away, holds none; such
// ranges read as zeros). An OpMapped request's Offset and Length are
// multiples of MapAlign; its reply payload is MappedBytes(Length) bytes, bit
// i (byte i/8, bit i%8 from the least significant) for the granule at
// Offset + i*MapGranule.
const (
	MapGranule = 4096
	MapAlign   = 8 * MapGranule
)

// MaxCompareAndWrite bounds an OpCompareAndWrite's Length (its payload is
// twice that). Like every IO it lies within one chunk.
const MaxCompareAndWrite = 64 << 10

// MappedBytes is the size of OpMapped's reply for length bytes.
func MappedBytes(length int64) int64 { return length / MapAlign }

// IsBlockIO reports whether op is one of the block IO ops a volume serves
// (OpRead to OpFlush).
func (o Op) IsBlockIO() bool { return o >= OpRead && o <= OpFlush }

// OneWay reports whether frames of op are peer traffic that does not count
// against a server's bound on requests in flight: OpRaft (never answered) and
// OpSnapshot (answered or not, as the snapshot protocol decides).
func (o Op) OneWay() bool { return o == OpRaft || o == OpSnapshot }

// Flags modify a request.
type Flags uint16

const (
	// FlagFUA asks that the write be durable before the reply (always true in basalt).
	FlagFUA Flags = 1 << 0
	// FlagReply marks a reply frame.
	FlagReply Flags = 1 << 15
)

// Header is the decoded fixed part of a frame. All integers are big-endian on the
// wire, at these offsets:
//
//	 0  uint32  Magic "BSLT"
//	 4  uint8   Version (1)
//	 5  uint8   Op
//	 6  uint16  Flags
//	 8  uint64  ID        request id, chosen by the sender, echoed in the reply
//	16  uint32  Status    Status; 0 in requests
//	20  uint32  PayloadLen bytes that follow the header
//	24  uint64  Volume    volume id
//	32  uint64  Epoch     writer epoch of the session (0 = read-only)
//	40  uint64  Offset    byte offset in the volume
//	48  uint32  Length    byte count of the IO
//	52  uint32  Copyset   copyset id within the volume's pool
//	56  uint64  Hint      NOT_LEADER: leader chunkserver id; OpRaft: sender's id
//	64  uint64  Seq       write, trim, write-zeroes, compare-and-write: the writer's number of this request in its copyset (0: none)
//	72  uint64  Settled   with Seq: every request of the writer to the copyset numbered below it is settled
//
// A request for one IO never crosses a chunk boundary: the client splits first.
// Seq and Settled let a copyset apply a retried request once (see Seq).
type Header struct {
	Op         Op
	Flags      Flags
	ID         uint64
	Status     Status
	PayloadLen uint32
	Volume     uint64
	Epoch      uint64
	Offset     uint64
	Length     uint32
	Copyset    uint32
	Hint       uint64
	// Seq numbers a writer session's (one epoch's) write, trim,
	// write-zeroes and compare-and-write requests to one copyset, from 1; every retry of a request
	// carries its number, so a copyset that applied it once does not apply it
	// again (a retry lands as a new raft entry, possibly after newer writes to
	// the same block). 0: not numbered, never deduplicated.
	Seq uint64
	// Settled: the writer will never send again any request to this copyset
	// numbered below it (each was answered, or given up on). A copyset refuses
	// such a request if it arrives later (STALE), so a copy of a write the
	// writer gave up on cannot land after the writes that followed it.
	Settled uint64
}

// Errors returned by DecodeHeader. A connection that yields one of them is closed:
// the stream can no longer be trusted to be in sync.
var (
	ErrBadMagic      = errors.New("api: bad frame magic")
	ErrBadVersion    = errors.New("api: unsupported frame version")
	ErrFrameTooLarge = errors.New("api: frame payload exceeds MaxPayload")
)

// IsReply reports whether the frame is a reply.
func (h *Header) IsReply() bool { return h.Flags&FlagReply != 0 }

// Encode writes h into b, which must be at least HeaderSize bytes.
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	be := binary.BigEndian
	be.PutUint32(b[0:], Magic)
	b[4] = Version
	b[5] = byte(h.Op)
	be.PutUint16(b[6:], uint16(h.Flags))
	be.PutUint64(b[8:], h.ID)
	be.PutUint32(b[16:], uint32(h.Status))
	be.PutUint32(b[20:], h.PayloadLen)
	be.PutUint64(b[24:], h.Volume)
	be.PutUint64(b[32:], h.Epoch)
	be.PutUint64(b[40:], h.Offset)
	be.PutUint32(b[48:], h.Length)
	be.PutUint32(b[52:], h.Copyset)
	be.PutUint64(b[56:], h.Hint)
	be.PutUint64(b[64:], h.Seq)
	be.PutUint64(b[72:], h.Settled)
}

// DecodeHeader parses a header from b (at least HeaderSize bytes). It checks only
// what keeps the stream in sync (magic, version, payload bound); the meaning of the
// fields is checked by whoever handles the op.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, io.ErrUnexpectedEOF
	}
	be := binary.BigEndian
	if be.Uint32(b[0:]) != Magic {
		return Header{}, ErrBadMagic
	}
	if b[4] != Version {
		return Header{}, fmt.Errorf("%w: %d", ErrBadVersion, b[4])
	}
	h := Header{
		Op:         Op(b[5]),
		Flags:      Flags(be.Uint16(b[6:])),
		ID:         be.Uint64(b[8:]),
		Status:     Status(be.Uint32(b[16:])),
		PayloadLen: be.Uint32(b[20:]),
		Volume:     be.Uint64(b[24:]),
		Epoch:      be.Uint64(b[32:]),
		Offset:     be.Uint64(b[40:]),
		Length:     be.Uint32(b[48:]),
		Copyset:    be.Uint32(b[52:]),
		Hint:       be.Uint64(b[56:]),
		Seq:        be.Uint64(b[64:]),
		Settled:    be.Uint64(b[72:]),
	}
	if h.PayloadLen > MaxPayload {
		return Header{}, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, h.PayloadLen)
	}
	return h, nil
}
