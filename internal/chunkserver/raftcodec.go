package chunkserver

import (
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// ErrBadRaftBatch: an OpRaft payload (or a snapshot begin frame) is malformed.
var ErrBadRaftBatch = errors.New("chunkserver: malformed raft message batch")

// raftRecordHeader is the size of the header of one message in an OpRaft batch:
// uint64 group id, uint32 length of the marshalled raftpb.Message.
const raftRecordHeader = 12

// appendRaftRecord appends one batch record for msg of group to b.
func appendRaftRecord(b []byte, group uint64, msg *raftpb.Message) ([]byte, error) {
	start := len(b)
	b = binary.BigEndian.AppendUint64(b, group)
	b = binary.BigEndian.AppendUint32(b, 0)
	b, err := proto.MarshalOptions{}.MarshalAppend(b, msg)
	if err != nil {
		return b[:start], err
	}
	binary.BigEndian.PutUint32(b[start+8:], uint32(len(b)-start-raftRecordHeader))
	return b, nil
}

// decodeRaftBatch parses an OpRaft payload. The messages do not alias b.
func decodeRaftBatch(b []byte) ([]raftMessage, error) {
	var out []raftMessage
	for len(b) > 0 {
		if len(b) < raftRecordHeader {
			return nil, fmt.Errorf("%w: truncated record header", ErrBadRaftBatch)
		}
		group := binary.BigEndian.Uint64(b)
		n := binary.BigEndian.Uint32(b[8:])
		b = b[raftRecordHeader:]
		if uint64(n) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: record of %d bytes, %d left", ErrBadRaftBatch, n, len(b))
		}
		msg := &raftpb.Message{}
		if err := proto.Unmarshal(b[:n], msg); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadRaftBatch, err)
		}
		b = b[n:]
		out = append(out, raftMessage{Group: group, Msg: msg})
	}
	return out, nil
}
