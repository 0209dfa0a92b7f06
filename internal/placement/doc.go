// Package placement is the pure arithmetic of which chunkservers are the
// members of each copyset (placement) and which members move when the cluster
// changes (the scheduler's decisions). It does no I/O, keeps no state and is
// deterministic, so the MDS and simulations get the same answer from the same
// input. Which copyset holds a chunk (routing) is part of the wire contract
// between client and chunkserver and lives in pkg/api (CopysetOf, GroupID).
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
