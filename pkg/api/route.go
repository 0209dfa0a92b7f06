package api

import "encoding/binary"

// VolumeHash is the stable hash h(v) of docs/design.md §2: FNV-1a 64 over the eight
// big-endian bytes of the volume id. Client and chunkservers must agree on it
// forever: changing it moves every chunk.
func VolumeHash(volume uint64) uint64 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], volume)
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// CopysetOf returns the copyset that holds chunk index of volume in a pool with
// copysetCount copysets: (h(v) + i) mod copysetCount.
func CopysetOf(volume, chunk uint64, copysetCount uint32) uint32 {
	return uint32((VolumeHash(volume) + chunk) % uint64(copysetCount))
}

// GroupID is the Raft group id of a copyset: the pool id in the high 32 bits.
func GroupID(pool, copyset uint32) uint64 { return uint64(pool)<<32 | uint64(copyset) }

// SplitGroupID is the inverse of GroupID.
func SplitGroupID(g uint64) (pool, copyset uint32) { return uint32(g >> 32), uint32(g) }
