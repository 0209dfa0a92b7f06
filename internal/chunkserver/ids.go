package chunkserver

import (
	"github.com/basalt-storage/basalt/internal/datastore"
	"github.com/basalt-storage/basalt/internal/raftstore"
)

// chunkID names one chunk file of a copyset.
type chunkID = datastore.ChunkID

// raftMessage is one raft message of one group.
type raftMessage = raftstore.Message
