package chunkserver

import (
	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/datastore"
)

// chunkID names one chunk file of a copyset.
type chunkID = datastore.ChunkID

// raftMessage is one raft message of one group (raftstore.Message).
type raftMessage struct {
	Group uint64
	Msg   *raftpb.Message
}
