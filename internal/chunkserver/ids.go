package chunkserver

import (
	"github.com/basalt-storage/basalt/internal/datastore"
)

// chunkID names one chunk file of a copyset.
type chunkID = datastore.ChunkID
