package raftnet

import (
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/pkg/api"
)

// ErrBadBatch: an OpRaft payload (or a snapshot begin frame) is malformed.
var ErrBadBatch = errors.New("raftnet: malformed raft message batch")

// BatchVersion is the OpRaft payload format this package speaks, carried in
// the frame header's Length field; doc.go specifies it.
const BatchVersion = 2

// Sizes of the fixed parts of a record (see doc.go).
const (
	recordHeader = 16 // group u64, message length u32, entry count u32
	entryHeader  = 22 // flags u8, type u8, term u64, index u64, data length u32
)

// Entry flags: which optional fields of the raftpb.Entry are set.
const (
	entryHasTerm  = 1 << 0
	entryHasIndex = 1 << 1
	entryHasType  = 1 << 2
	entryHasData  = 1 << 3
	entryFlags    = entryHasTerm | entryHasIndex | entryHasType | entryHasData
)

// MaxEntryData is the most data one raft entry may carry: a MsgApp holding
// a larger one (alone: raft and Send never batch past it) would not fit in a
// frame, api.MaxPayload, and the follower's transport.Server would close the
// connection on it at every retry. 4 KiB covers the record header, the
// message and the entry header. The data plane refuses writes beyond it.
const MaxEntryData = api.MaxPayload - 4<<10

// inlineData: entry data shorter than this is copied into the frame's small
// part; longer data travels as a piece of its own (never copied).
const inlineData = 512

// record is one message ready to be encoded: its message without entries,
// marshalled size and byte counts.
type record struct {
	group   uint64
	msg     *raftpb.Message // without Entries
	entries []*raftpb.Entry
	msgLen  int
	size    int // the whole record, data included
}

func newRecord(m raftstore.Message) record {
	r := record{group: m.Group, msg: withoutEntries(m.Msg), entries: m.Msg.GetEntries()}
	r.msgLen = proto.Size(r.msg)
	r.size = recordHeader + r.msgLen + entryHeader*len(r.entries)
	for _, e := range r.entries {
		r.size += len(e.Data)
	}
	return r
}

// withoutEntries returns m, or a shallow copy of m with no Entries: the
// entries travel in the record's own encoding (TestMessageFields keeps this
// field list complete).
func withoutEntries(m *raftpb.Message) *raftpb.Message {
	if len(m.Entries) == 0 {
		return m
	}
	return &raftpb.Message{
		Type: m.Type, To: m.To, From: m.From, Term: m.Term, LogTerm: m.LogTerm, Index: m.Index,
		Commit: m.Commit, Vote: m.Vote, Snapshot: m.Snapshot, Reject: m.Reject, RejectHint: m.RejectHint,
		Context: m.Context, Responses: m.Responses,
	}
}

// frameBuilder encodes the records of one OpRaft payload: their small parts
// into one buffer, entry data of inlineData bytes or more as pieces of their
// own, which go between the buffer's bytes (cuts).
type frameBuilder struct {
	head []byte
	cuts []cut
	size int // payload bytes, data pieces included

	cutBytes int // data bytes in cuts
	// alignAt: 1 + the payload offset of the first entry data of
	// alignMinData bytes or more; 0 if none (the frame header's hint).
	alignAt int
}

// alignMinData: the entry data a frame's alignment hint points at is at
// least this long (a large write, which a follower writes with O_DIRECT).
const alignMinData = 64 << 10

// cut is entry data that belongs after head[:at].
type cut struct {
	at   int
	data []byte
}

// add encodes r.
func (f *frameBuilder) add(r *record) error {
	b := f.head
	start := len(b)
	b = binary.BigEndian.AppendUint64(b, r.group)
	b = binary.BigEndian.AppendUint32(b, uint32(r.msgLen))
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.entries)))
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, r.msg)
	if err != nil || len(b)-start != recordHeader+r.msgLen {
		f.head = b[:start]
		if err == nil {
			err = fmt.Errorf("raftnet: message of %d bytes marshalled to %d", r.msgLen, len(b)-start-recordHeader)
		}
		return err
	}
	for _, e := range r.entries {
		flags := byte(0)
		if e.Term != nil {
			flags |= entryHasTerm
		}
		if e.Index != nil {
			flags |= entryHasIndex
		}
		if e.Type != nil {
			flags |= entryHasType
		}
		if e.Data != nil {
			flags |= entryHasData
		}
		b = append(b, flags, byte(e.GetType()))
		b = binary.BigEndian.AppendUint64(b, e.GetTerm())
		b = binary.BigEndian.AppendUint64(b, e.GetIndex())
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Data)))
	}
	for _, e := range r.entries {
		switch {
		case len(e.Data) < inlineData:
			b = append(b, e.Data...)
		default:
			if f.alignAt == 0 && len(e.Data) >= alignMinData {
				f.alignAt = 1 + len(b) + f.cutBytes
			}
			f.cuts = append(f.cuts, cut{at: len(b), data: e.Data})
			f.cutBytes += len(e.Data)
		}
	}
	f.head = b
	f.size += r.size
	return nil
}

// pieces returns the payload as pieces for transport.Conn.SendAsync.
func (f *frameBuilder) pieces() [][]byte {
	out := make([][]byte, 0, 2*len(f.cuts)+1)
	pos := 0
	for _, c := range f.cuts {
		out = append(out, f.head[pos:c.at], c.data)
		pos = c.at
	}
	return append(out, f.head[pos:])
}

// appendRecord appends m's record, data included, to b.
func appendRecord(b []byte, m raftstore.Message) ([]byte, error) {
	r := newRecord(m)
	var f frameBuilder
	if err := f.add(&r); err != nil {
		return b, err
	}
	for _, p := range f.pieces() {
		b = append(b, p...)
	}
	return b, nil
}

// decodeBatch parses an OpRaft payload. With alias the entries' data are
// slices of b (the caller keeps b, unchanged, for as long as the messages
// live); without, they are copies and nothing aliases b.
func decodeBatch(b []byte, alias bool) ([]raftstore.Message, error) {
	var out []raftstore.Message
	for len(b) > 0 {
		if len(b) < recordHeader {
			return nil, fmt.Errorf("%w: truncated record header", ErrBadBatch)
		}
		group := binary.BigEndian.Uint64(b)
		msgLen := uint64(binary.BigEndian.Uint32(b[8:]))
		count := uint64(binary.BigEndian.Uint32(b[12:]))
		b = b[recordHeader:]
		if msgLen+count*entryHeader > uint64(len(b)) {
			return nil, fmt.Errorf("%w: record of %d message bytes and %d entries, %d bytes left",
				ErrBadBatch, msgLen, count, len(b))
		}
		msg := &raftpb.Message{}
		if err := proto.Unmarshal(b[:msgLen], msg); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadBatch, err)
		}
		if len(msg.Entries) != 0 {
			return nil, fmt.Errorf("%w: entries inside the message", ErrBadBatch)
		}
		if len(msg.ProtoReflect().GetUnknown()) != 0 {
			// A field this raft does not know (another version's, or entries
			// with a wrong wire type): withoutEntries would drop it.
			return nil, fmt.Errorf("%w: message has fields unknown to this version", ErrBadBatch)
		}
		b = b[msgLen:]
		table := b[:count*entryHeader]
		b = b[count*entryHeader:]
		var err error
		if msg.Entries, b, err = decodeEntries(table, int(count), b, alias); err != nil {
			return nil, err
		}
		out = append(out, raftstore.Message{Group: group, Msg: msg})
	}
	return out, nil
}

// decodeEntries decodes count entries from their table and their data at the
// start of b, and returns what follows the data.
func decodeEntries(table []byte, count int, b []byte, alias bool) ([]*raftpb.Entry, []byte, error) {
	if count == 0 {
		return nil, b, nil
	}
	var total uint64
	for t := table; len(t) > 0; t = t[entryHeader:] {
		if t[0]&^entryFlags != 0 {
			return nil, nil, fmt.Errorf("%w: entry flags %#x", ErrBadBatch, t[0])
		}
		n := uint64(binary.BigEndian.Uint32(t[18:]))
		if t[0]&entryHasData == 0 && n != 0 {
			return nil, nil, fmt.Errorf("%w: %d data bytes of an entry without data", ErrBadBatch, n)
		}
		total += n
	}
	if total > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: %d bytes of entry data, %d left", ErrBadBatch, total, len(b))
	}
	data := b[:total:total]
	if !alias {
		data = append(make([]byte, 0, total), data...)
	}
	// One allocation each for the entries and for their optional fields.
	ents := make([]raftpb.Entry, count)
	vals := make([]uint64, 2*count)
	types := make([]raftpb.EntryType, count)
	out := make([]*raftpb.Entry, count)
	for i := range out {
		t := table[i*entryHeader:]
		e := &ents[i]
		flags := t[0]
		if flags&entryHasType != 0 {
			if _, known := raftpb.EntryType_name[int32(t[1])]; !known {
				// Raft would store it and apply nothing; the WAL keeps only 7 bits.
				return nil, nil, fmt.Errorf("%w: entry type %d", ErrBadBatch, t[1])
			}
			types[i] = raftpb.EntryType(t[1])
			e.Type = &types[i]
		} else if t[1] != 0 {
			return nil, nil, fmt.Errorf("%w: entry type %d without its flag", ErrBadBatch, t[1])
		}
		if flags&entryHasTerm != 0 {
			vals[2*i] = binary.BigEndian.Uint64(t[2:])
			e.Term = &vals[2*i]
		} else if binary.BigEndian.Uint64(t[2:]) != 0 {
			return nil, nil, fmt.Errorf("%w: entry term without its flag", ErrBadBatch)
		}
		if flags&entryHasIndex != 0 {
			vals[2*i+1] = binary.BigEndian.Uint64(t[10:])
			e.Index = &vals[2*i+1]
		} else if binary.BigEndian.Uint64(t[10:]) != 0 {
			return nil, nil, fmt.Errorf("%w: entry index without its flag", ErrBadBatch)
		}
		if flags&entryHasData != 0 {
			n := binary.BigEndian.Uint32(t[18:])
			e.Data, data = data[:n:n], data[n:]
		}
		out[i] = e
	}
	return out, b[total:], nil
}
