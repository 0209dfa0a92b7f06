// Package placement is the pure arithmetic of where data lives: which
// copyset holds a chunk (routing) and which chunkservers are the members of
// each copyset (placement). It does no I/O, keeps no state and is
// deterministic, so the MDS, the chunkservers, the client library and
// simulations all get the same answer from the same input.
//
// # Routing (DESIGN §2)
//
// Chunk i of volume v lives in copyset (VolumeHash(v) + i) mod copysetCount
// of the volume's pool (CopysetOf). VolumeHash is FNV-1a 64 over the eight
// big-endian bytes of the volume id.
//
// INVARIANT: VolumeHash and CopysetOf never change; changing either would
// move every chunk of every volume.
//
// A copyset's Raft group id is pool<<32 | copyset (GroupID, SplitGroupID).
//
// # Placement
//
// Place picks the members of a pool's copysets once, when the pool is
// created. Members of one copyset sit in distinct zones, or on distinct
// servers when the pool spans fewer zones than it has replicas (Domains).
// Within that rule it balances the number of copysets per chunkserver
// (max-min <= 1 whenever no failure domain holds more than 1/replicas of the
// chunkservers) and widens the scatter width — the number of distinct peers
// a chunkserver shares copysets with, i.e. how many disks help when it is
// re-replicated (ScatterWidth). The algorithm is greedy, one member at a
// time, followed by same-domain swaps that add distinct peer pairs; see
// Place for the order of its rules.
//
// DefaultCopysets gives a pool's default copyset count: about
// CopysetsPerNode (100) copyset replicas per chunkserver.
package placement
