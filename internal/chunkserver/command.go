package chunkserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/basalt-storage/basalt/internal/bufpool"
	"github.com/basalt-storage/basalt/internal/raftstore"
)

// cmdOp is the operation of one replicated command (a Raft log entry). It is
// not api.Op, the request enum, on purpose: a command is what a request
// became once validated — reads and flushes never become one, a fence is no
// request at all — and its codes are in the WAL on disk (frozen by
// testdata/command.golden), numbered before api.Op existed.
type cmdOp uint8

// Command ops. Part of the on-disk format of the WAL: never renumber.
const (
	cmdWrite       cmdOp = 1 // write Data at Offset
	cmdTrim        cmdOp = 2 // discard [Offset, Offset+Length)
	cmdWriteZeroes cmdOp = 3 // write zeros over [Offset, Offset+Length)
	cmdFence       cmdOp = 4 // only raise the volume's epoch
	// cmdDeleteVolume tombstones Volume (its epoch becomes tombstoneEpoch, so
	// every later command of it is refused) and removes its chunks. Proposed
	// by a leader that found the volume gone from the MDS (deletes.go).
	cmdDeleteVolume cmdOp = 5
)

// tombstoneEpoch is the epoch a deleted volume has in the epoch table: no
// writer's epoch reaches it, so a stale writer is refused forever, and the
// table (persisted with every snapshot) carries the deletion to replicas
// and restarts.
const tombstoneEpoch = ^uint64(0)

func (o cmdOp) String() string {
	switch o {
	case cmdWrite:
		return "write"
	case cmdTrim:
		return "trim"
	case cmdWriteZeroes:
		return "write-zeroes"
	case cmdFence:
		return "fence"
	case cmdDeleteVolume:
		return "delete-volume"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// cmdVersion is the command format version (byte 0 of every command).
const cmdVersion = 1

// cmdHeaderSize is the fixed part of a command; see doc.go for the layout.
const cmdHeaderSize = 32

// command is one decoded replicated operation.
type command struct {
	Op     cmdOp
	Volume uint64
	Epoch  uint64
	Offset uint64 // byte offset in the volume
	Length uint32
	Data   []byte // cmdWrite only; len(Data) == Length
}

// Errors of the command and epoch-table codecs. Both formats are produced only by
// this package, so a decode error means corruption or a bug, never bad user input.
var (
	// ErrBadCommand: a Raft entry is not a valid command.
	ErrBadCommand = errors.New("chunkserver: malformed command")
	// ErrBadEpochTable: a captured or persisted epoch table is malformed.
	ErrBadEpochTable = errors.New("chunkserver: malformed epoch table")
)

// encodeCommand returns the command's encoding: header followed by data.
func encodeCommand(c command) []byte {
	return appendCommand(make([]byte, 0, cmdHeaderSize+len(c.Data)), c)
}

// proposalRoom is what a proposal holds before a write's data: the room
// Propose reserves, and the command header.
const proposalRoom = raftstore.ProposalHeader + cmdHeaderSize

// propose replicates c through group g of host; done gets the outcome. The
// proposal is a pooled buffer, which goes back to the pool once done ran: the
// host keeps no reference to a proposal's data past that (raft copies it into
// its log). in, when not nil, is a pooled buffer whose bytes from proposalRoom
// on are c.Data already (the transport read the payload there): the header
// goes in front, and the data is not copied. Otherwise c is encoded into a
// new one.
func propose(host raftHost, g uint64, c command, in *[]byte, done func(error)) {
	p := in
	if p != nil && len(c.Data) > 0 && len(*p) >= proposalRoom+len(c.Data) && &(*p)[proposalRoom] == &c.Data[0] {
		appendCommandHeader((*p)[:raftstore.ProposalHeader], c)
		*p = (*p)[:proposalRoom+len(c.Data)]
	} else {
		p = bufpool.Get(proposalRoom + len(c.Data))
		*p = appendCommand((*p)[:raftstore.ProposalHeader], c)
	}
	host.Propose(g, *p, func(err error) {
		bufpool.Put(p)
		done(err)
	})
}

// appendCommand appends c's encoding to b.
func appendCommand(b []byte, c command) []byte {
	return append(appendCommandHeader(b, c), c.Data...)
}

// appendCommandHeader appends the cmdHeaderSize bytes of c's header to b.
func appendCommandHeader(b []byte, c command) []byte {
	be := binary.BigEndian
	b = append(b, cmdVersion, byte(c.Op), 0, 0)
	b = be.AppendUint32(b, c.Length)
	b = be.AppendUint64(b, c.Volume)
	b = be.AppendUint64(b, c.Epoch)
	return be.AppendUint64(b, c.Offset)
}

// decodeCommand parses b. Data aliases b.
func decodeCommand(b []byte) (command, error) {
	if len(b) < cmdHeaderSize {
		return command{}, fmt.Errorf("%w: %d bytes", ErrBadCommand, len(b))
	}
	if b[0] != cmdVersion {
		return command{}, fmt.Errorf("%w: version %d", ErrBadCommand, b[0])
	}
	be := binary.BigEndian
	if be.Uint16(b[2:]) != 0 {
		return command{}, fmt.Errorf("%w: reserved bytes set", ErrBadCommand)
	}
	c := command{
		Op:     cmdOp(b[1]),
		Length: be.Uint32(b[4:]),
		Volume: be.Uint64(b[8:]),
		Epoch:  be.Uint64(b[16:]),
		Offset: be.Uint64(b[24:]),
	}
	data := b[cmdHeaderSize:]
	switch c.Op {
	case cmdWrite:
		if len(data) != int(c.Length) {
			return command{}, fmt.Errorf("%w: write of %d bytes carries %d", ErrBadCommand, c.Length, len(data))
		}
		c.Data = data
	case cmdTrim, cmdWriteZeroes, cmdFence, cmdDeleteVolume:
		if len(data) != 0 {
			return command{}, fmt.Errorf("%w: %v carries data", ErrBadCommand, c.Op)
		}
	default:
		return command{}, fmt.Errorf("%w: op %d", ErrBadCommand, b[1])
	}
	return c, nil
}

// epochTableVersion is byte 0 of an encoded epoch table.
const epochTableVersion = 1

// encodeEpochs encodes the per-volume highest epochs, sorted by volume id so that
// equal tables encode to equal bytes.
func encodeEpochs(m map[uint64]uint64) []byte {
	vols := make([]uint64, 0, len(m))
	for v := range m {
		vols = append(vols, v)
	}
	sort.Slice(vols, func(i, j int) bool { return vols[i] < vols[j] })
	b := make([]byte, 5+16*len(vols))
	b[0] = epochTableVersion
	binary.BigEndian.PutUint32(b[1:], uint32(len(vols)))
	p := b[5:]
	for _, v := range vols {
		binary.BigEndian.PutUint64(p, v)
		binary.BigEndian.PutUint64(p[8:], m[v])
		p = p[16:]
	}
	return b
}

// decodeEpochs parses an epoch table. An empty b is the empty table (a copyset
// that never persisted anything).
func decodeEpochs(b []byte) (map[uint64]uint64, error) {
	m := make(map[uint64]uint64)
	if len(b) == 0 {
		return m, nil
	}
	if len(b) < 5 || b[0] != epochTableVersion {
		return nil, fmt.Errorf("%w: header", ErrBadEpochTable)
	}
	n := binary.BigEndian.Uint32(b[1:])
	p := b[5:]
	if uint64(len(p)) != 16*uint64(n) {
		return nil, fmt.Errorf("%w: %d entries in %d bytes", ErrBadEpochTable, n, len(p))
	}
	for ; len(p) > 0; p = p[16:] {
		m[binary.BigEndian.Uint64(p)] = binary.BigEndian.Uint64(p[8:])
	}
	return m, nil
}

// metaVersion is byte 0 of the copyset meta record saved through SaveMeta.
const metaVersion = 1

// encodeMeta is the copyset meta record: version, applied index, epoch table.
func encodeMeta(index uint64, state []byte) []byte {
	b := make([]byte, 9+len(state))
	b[0] = metaVersion
	binary.BigEndian.PutUint64(b[1:], index)
	copy(b[9:], state)
	return b
}

func decodeMeta(b []byte) (uint64, []byte, error) {
	if len(b) < 9 || b[0] != metaVersion {
		return 0, nil, fmt.Errorf("%w: meta record of %d bytes", ErrBadEpochTable, len(b))
	}
	state := b[9:]
	if _, err := decodeEpochs(state); err != nil {
		return 0, nil, err
	}
	return binary.BigEndian.Uint64(b[1:]), state, nil
}
