package chunkserver

// chunkID names one chunk file of a copyset.
type chunkID struct{ Volume, Index uint64 }
