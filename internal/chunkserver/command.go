package chunkserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

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

// cmdVersion is the command format version (byte 0 of every command) this
// code writes. Version 1 (no Seq, Settled) is still read: a WAL written before
// version 2 replays.
const cmdVersion = 2

// cmdHeaderSize is the fixed part of a command; see doc.go for the layout.
// cmdHeaderSizeV1 is that of version 1.
const (
	cmdHeaderSize   = 48
	cmdHeaderSizeV1 = 32
)

// command is one decoded replicated operation.
type command struct {
	Op     cmdOp
	Volume uint64
	Epoch  uint64
	Offset uint64 // byte offset in the volume
	Length uint32
	// Seq and Settled are the request's api.Header.Seq and Settled (retried.go);
	// 0 in commands that are no request and in version-1 commands.
	Seq, Settled uint64
	Data         []byte // cmdWrite only; len(Data) == Length
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
	p := proposalOf(c, in)
	host.Propose(g, *p, func(err error) {
		bufpool.Put(p)
		done(err)
	})
}

// proposeInTerm is propose through host.ProposeInTerm: refused NOT_LEADER
// unless g is still led by this node in term (caw.go).
func proposeInTerm(host raftHost, g uint64, c command, term uint64, done func(error)) {
	p := proposalOf(c, nil)
	host.ProposeInTerm(g, *p, term, func(err error) {
		bufpool.Put(p)
		done(err)
	})
}

// proposalOf is c's proposal in a pooled buffer (see propose).
func proposalOf(c command, in *[]byte) *[]byte {
	p := in
	if p != nil && len(c.Data) > 0 && len(*p) >= proposalRoom+len(c.Data) && &(*p)[proposalRoom] == &c.Data[0] {
		appendCommandHeader((*p)[:raftstore.ProposalHeader], c)
		*p = (*p)[:proposalRoom+len(c.Data)]
	} else {
		p = bufpool.Get(proposalRoom + len(c.Data))
		*p = appendCommand((*p)[:raftstore.ProposalHeader], c)
	}
	return p
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
	b = be.AppendUint64(b, c.Offset)
	b = be.AppendUint64(b, c.Seq)
	return be.AppendUint64(b, c.Settled)
}

// decodeCommand parses b. Data aliases b.
func decodeCommand(b []byte) (command, error) {
	size := cmdHeaderSize
	switch {
	case len(b) == 0:
		return command{}, fmt.Errorf("%w: empty", ErrBadCommand)
	case b[0] == 1:
		size = cmdHeaderSizeV1
	case b[0] != cmdVersion:
		return command{}, fmt.Errorf("%w: version %d", ErrBadCommand, b[0])
	}
	if len(b) < size {
		return command{}, fmt.Errorf("%w: %d bytes", ErrBadCommand, len(b))
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
	if size == cmdHeaderSize {
		c.Seq, c.Settled = be.Uint64(b[32:]), be.Uint64(b[40:])
	}
	data := b[size:]
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

// epochTableVersion is byte 0 of an encoded epoch table this code writes.
// Version 1 (epochs only) is still read.
const epochTableVersion = 2

// encodeEpochs encodes the per-volume highest epochs and the current writers'
// request windows, sorted by volume id so that equal tables encode to equal
// bytes: version, the epochs (count, then volume and epoch), the windows
// (count, then volume, settled, count and the ranges of applied numbers, each
// first and last).
func encodeEpochs(epochs map[uint64]uint64, windows map[uint64]*seqWindow) []byte {
	be := binary.BigEndian
	n := 9 + 16*len(epochs)
	for _, w := range windows {
		n += 20 + 16*len(w.applied)
	}
	b := make([]byte, 0, n)
	b = append(b, epochTableVersion)
	b = be.AppendUint32(b, uint32(len(epochs)))
	for _, v := range sortedKeys(epochs) {
		b = be.AppendUint64(b, v)
		b = be.AppendUint64(b, epochs[v])
	}
	b = be.AppendUint32(b, uint32(len(windows)))
	for _, v := range sortedKeys(windows) {
		w := windows[v]
		b = be.AppendUint64(b, v)
		b = be.AppendUint64(b, w.settled)
		b = be.AppendUint32(b, uint32(len(w.applied)))
		for _, r := range w.applied {
			b = be.AppendUint64(b, r.lo)
			b = be.AppendUint64(b, r.hi)
		}
	}
	return b
}

func sortedKeys[V any](m map[uint64]V) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// decodeEpochs parses an epoch table. An empty b is the empty table (a copyset
// that never persisted anything).
func decodeEpochs(b []byte) (map[uint64]uint64, map[uint64]*seqWindow, error) {
	epochs, windows := make(map[uint64]uint64), make(map[uint64]*seqWindow)
	if len(b) == 0 {
		return epochs, windows, nil
	}
	be := binary.BigEndian
	version := b[0]
	if version != 1 && version != epochTableVersion {
		return nil, nil, fmt.Errorf("%w: version %d", ErrBadEpochTable, version)
	}
	p := b[1:]
	if len(p) < 4 {
		return nil, nil, fmt.Errorf("%w: header", ErrBadEpochTable)
	}
	n := uint64(be.Uint32(p))
	p = p[4:]
	if uint64(len(p)) < 16*n || version == 1 && uint64(len(p)) != 16*n {
		return nil, nil, fmt.Errorf("%w: %d epochs in %d bytes", ErrBadEpochTable, n, len(p))
	}
	for ; n > 0; n-- {
		epochs[be.Uint64(p)] = be.Uint64(p[8:])
		p = p[16:]
	}
	if version == 1 {
		return epochs, windows, nil
	}
	if len(p) < 4 {
		return nil, nil, fmt.Errorf("%w: no window count", ErrBadEpochTable)
	}
	n = uint64(be.Uint32(p))
	p = p[4:]
	for ; n > 0; n-- {
		if len(p) < 20 {
			return nil, nil, fmt.Errorf("%w: short window", ErrBadEpochTable)
		}
		v, w, k := be.Uint64(p), &seqWindow{settled: be.Uint64(p[8:])}, uint64(be.Uint32(p[16:]))
		p = p[20:]
		if k > maxSeqRanges || uint64(len(p)) < 16*k {
			return nil, nil, fmt.Errorf("%w: window of %d ranges in %d bytes", ErrBadEpochTable, k, len(p))
		}
		w.applied = make([]seqRange, k)
		for i := range w.applied {
			r := seqRange{be.Uint64(p), be.Uint64(p[8:])}
			p = p[16:]
			if r.lo > r.hi || r.lo < w.settled || i > 0 && r.lo <= w.applied[i-1].hi+1 {
				return nil, nil, fmt.Errorf("%w: window of volume %d out of order", ErrBadEpochTable, v)
			}
			w.applied[i] = r
		}
		windows[v] = w
	}
	if len(p) != 0 {
		return nil, nil, fmt.Errorf("%w: %d trailing bytes", ErrBadEpochTable, len(p))
	}
	return epochs, windows, nil
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
	if _, _, err := decodeEpochs(state); err != nil {
		return 0, nil, err
	}
	return binary.BigEndian.Uint64(b[1:]), state, nil
}
