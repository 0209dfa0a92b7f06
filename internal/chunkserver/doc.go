// Package chunkserver is the chunkserver process: one data directory (one
// disk), the copysets the MDS assigns to it, and the data plane that serves
// their IO (docs/design.md §3–§6, §8).
//
// # Pieces
//
//	network ──▶ transport.Server ──▶ handler (validate at the edge)
//	                                   │ write/trim/zeroes: raftstore.Host.Propose
//	                                   │ read: [fence] → ReadBarrier → Copyset.ReadAt
//	                                   │ mapped: [fence] → ReadBarrier → Copyset.DataExtents
//	                                   │ compare-and-write: write gate → ReadBarrierTerm →
//	                                   │   Copyset.ReadAt, compare → ProposeInTerm (caw.go)
//	                                   │ OpRaft, OpSnapshot: raftnet.Receiver → Host.Step,
//	                                   │                     Host.ReceiveSnapshot
//	                                   ▼
//	raftstore.Host (workers) ──▶ stateMachine (one per copyset) ──▶ datastore.Copyset
//	       │  └─▶ wal.WAL (one per chunkserver, group commit)
//	       └─▶ raftnet.Transport (one connection and sender goroutine per peer)
//
// A ChunkServer's Run registers with the MDS (retrying until it answers),
// restarts the groups found in the WAL, serves the listener, and heartbeats
// every HeartbeatInterval. Each heartbeat response lists every copyset this
// chunkserver is a member of — a copyset with epoch 0 is bootstrapped with its
// members (join=false), any later one is joined empty (join=true) and filled by
// its leader — and the addresses of its peers. A changed volumes_revision
// reloads the volume cache. When the WAL holds more than MaxWALSegments
// segments, the groups pinning the oldest one are made to snapshot.
//
// # Membership
//
// The MDS changes a copyset's members by editing its member list and bumping
// its epoch; the chunkservers carry the change out through Raft, one step at a
// time on the copyset's leader, which looks at every heartbeat and every
// 200 ms in between (reconcileInterval): a listed member missing from the group
// joins as a learner; a learner no longer listed is removed; once every listed
// learner caught up (it installed its snapshot and its log is within 64 entries
// of the leader's last index), one joint change (ConfChangeV2) promotes them and
// removes the voters no longer listed, and raft leaves the joint configuration
// by itself (raftstore.NextMoveStep; docs/reliability.md, "Moving a replica").
// So a moving copyset never runs on fewer voters than its replica count, and the
// heartbeat reports both halves of a joint configuration. A leader
// that is itself no longer listed hands leadership to its most caught-up
// voter (the MDS only tells members about a copyset). A replica that is not
// listed deletes its copy once its own configuration excludes it, once it
// was unlisted for OrphanTimeout without knowing a leader (removed while it
// was down, it never hears of the removal), or at once if a disk error
// stopped it (the MDS moved it away for that). A heartbeat answer's
// transfer_leaders make the named copysets' leaders hand over (balancing);
// its pools give the chunk sizes of new copysets.
//
// # On-disk layout
//
//	DataDir/id     the chunkserver id, decimal + "\n"; created atomically (temp,
//	               fsync, rename, fsync dir) after the first registration and sent
//	               on every later one. The MDS answering another id, or not
//	               knowing the id, is ErrIdentity (Run fails; it never retries
//	               that). A heartbeat answered NotFound registers again.
//	DataDir/wal/   the shared Raft log (internal/wal)
//	DataDir/data/  chunk files and per-copyset meta (internal/datastore)
//
// # Replicated command format (Raft entry data)
//
// Every normal entry of a copyset's log is one command; all integers big-endian:
//
//	 0  uint8   version (2)
//	 1  uint8   op: 1 write, 2 trim, 3 write-zeroes, 4 fence, 5 delete-volume
//	 2  uint16  reserved, 0
//	 4  uint32  length: bytes of the IO (0 for fence and delete-volume)
//	 8  uint64  volume id
//	16  uint64  epoch of the writer (docs/design.md §6); 0 for delete-volume
//	24  uint64  offset: byte offset in the volume
//	32  uint64  seq: the request's number (api.Header.Seq); 0: not numbered
//	40  uint64  settled: the request's api.Header.Settled
//	48  ...     data: exactly length bytes for write, nothing otherwise
//
// Version 1 (no seq and settled: the data at 32) is still read, as unnumbered
// commands, so a WAL written before version 2 replays; a version-1 replica
// cannot read version 2 (upgrade every chunkserver together).
// The chunk is offset / chunkSize; a command never crosses a chunk (the
// handler refuses such IO, and Apply answers OUT_OF_RANGE should one appear).
// testdata/command.golden freezes the format.
//
// # Apply (stateMachine)
//
// Per volume the state machine keeps the highest epoch applied. A command with
// a lower epoch is refused with FENCED and changes nothing; a higher one is
// recorded first (a fence), then the write, discard or zeroing goes to the
// chunk file with a plain pwrite (no fsync: the WAL made it durable). Every
// command is a blind overwrite, so applying an entry twice (WAL replay after a
// crash, a log replayed over a snapshot taken while writes went on) converges.
// A rejection is a result; a disk error is not: Apply returns a non-api error,
// raftstore stops the group, and the heartbeat's disk state becomes FULL or
// IO_ERROR (api.DiskState; raftstore.DiskFailure tells a full disk from other
// errors, for the state machine and the raft host alike).
//
// # Retried requests (retried.go)
//
// Blind overwrites converge under replay, but not under a client's retry: a
// retry is a new entry, and when the first attempt was applied too (its answer
// lost with its leader) the retry lands after any newer write to the block
// acknowledged meanwhile, and undoes it. So the client numbers each write,
// trim and write-zeroes per copyset (api.Header.Seq, the same on every
// attempt) and says which numbers it settled (Settled: it sends none below
// again). Per volume the state machine keeps the current writer's window: the
// highest Settled seen and the ranges of numbers at or above it applied
// (consecutive numbers are one range, so only gaps cost: at most
// maxSeqRanges). Apply records a new number and applies the command; a number
// in the window is a retry of an applied request, answered OK without applying
// it; a number below Settled is refused with STALE_REQUEST (a copy of an
// attempt the client gave up on cannot land after the writes that followed
// it). A new epoch (a new writer) drops the window. The windows travel with
// the epoch table (meta records, snapshots), so every replica decides alike.
//
// Deleting a volume is a command too (deletes.go). The leader of a copyset
// reads the volumes it has epochs or chunks of, then a fresh volume list from
// the MDS; a volume on the first and not on the second was deleted (it was
// created before the copyset had anything of it, and ids are never reused),
// and the leader proposes delete-volume for it. Applying it sets the
// volume's epoch to the tombstone (max uint64) and removes its chunks
// (Copyset.DeleteVolume: into the chunk-file pool's recycle/, chunks/ and
// recycle/ fsynced before it returns). Every later command of the volume is
// refused with NO_SUCH_VOLUME, by every replica alike, and the tombstone
// travels with the epoch table in meta records and snapshots. So a replica
// that was down at the deletion applies it when it catches up, a replayed
// log cannot bring chunks back for good (the delete is replayed after the
// writes), and Recover and InstallSnapshot sweep any chunk of a tombstoned
// volume still on disk. Passes run when the volume cache sees volumes go and
// every 10 s; the epoch table keeps 16 bytes per deleted volume.
//
// Capture is the epoch table: uint8 version (1), uint32 count, then count ×
// (uint64 volume, uint64 epoch) sorted by volume. Persist(index, state) syncs
// the copyset's dirty chunks, then saves the meta record — uint8 version (1),
// uint64 index, epoch table — with Copyset.SaveMeta; Recover loads it.
//
//	INVARIANT: the meta record never names an index whose effects are not
//	synced to the chunk files (Persist syncs before SaveMeta).
//	INVARIANT: a volume's recorded epoch never decreases, except when a
//	snapshot from the leader replaces the whole table.
//	INVARIANT: no chunk of a tombstoned volume outlives the apply of its
//	delete-volume entry, a restart, or a snapshot install.
//
// # Data plane (handler)
//
// Frames are pkg/api's (moved by internal/transport). Each IO request is checked once, here, in
// this order, and answered with the first status that applies:
//
//	unknown op                                   BAD_REQUEST
//	Length 0; write payload length != Length;
//	  payload on a read, trim or write-zeroes    BAD_REQUEST
//	volume unknown after a refresh of the
//	  volume cache begun after the request
//	  came, or deleted (tombstoned here)         NO_SUCH_VOLUME
//	  (the MDS unreachable for that refresh:     BUSY)
//	Offset+Length > volume size, or the IO
//	  crosses a chunk boundary                   OUT_OF_RANGE
//	Length > 64 MiB (api.MaxPayload), or a
//	  write whose raft entry (data + 40 bytes)
//	  exceeds raftnet.MaxEntryData (64 MiB
//	  less 4 KiB)                                BAD_REQUEST
//	Copyset != api.CopysetOf(...)                BAD_REQUEST
//	copyset not hosted here                      NO_SUCH_COPYSET
//	write/trim/zeroes with Epoch 0               READ_ONLY
//	replica stopped by a disk error              NO_SPACE (disk full) or
//	                                             IO_ERROR: the client tries
//	                                             the other members, and gives
//	                                             up once a majority says so
//	Epoch (non-zero) < the copyset's epoch       FENCED
//
// Writes, trims and write-zeroes are proposed (the command is encoded into a
// pooled buffer that goes back to the pool when the proposal is answered:
// raft copies it into its log; a write of 16 KiB or more is read by the
// transport straight into such a buffer, after room for the proposal's
// header — handler.AllocPayload — so its data is not copied); the reply is
// sent from the proposal's callback. statusOf (classify.go) is the one place that maps an
// outcome to a wire status: a replicated result (*api.Error) as it is;
// raftstore's typed errors as ErrNotLeader → NOT_LEADER with the leader in
// Header.Hint, ErrStopped → NOT_LEADER (no hint), ErrNoGroup →
// NO_SUCH_COPYSET, ErrDiskFull → NO_SPACE (a full disk, the chunk files' or
// the WAL's), ErrIO and any failed read → IO_ERROR. A read
// whose epoch is newer than the copyset's first commits a fence, then waits
// for Host.ReadBarrier (lease read, or ReadIndex) and reads the chunk file
// into a pooled buffer that is released once the reply was written. OpMapped
// takes the same way to the chunk file and answers its data extents
// (SEEK_DATA, on a goroutine) as a bitmap (api.MapGranule).
// OpCompareAndWrite (payload: Length bytes to compare, then Length to write;
// Length ≤ api.MaxCompareAndWrite, else BAD_REQUEST; epoch ≠ 0 and the
// writer's capability as for a write) is decided on the leader and logged
// as a plain cmdWrite with the request's Seq: the replica's write gate
// (gate.go: every write, trim and write-zeroes holds its byte range from
// before its proposal until its callback; a compare-and-write holds its range
// exclusively), a read barrier that tells its term, the retried-request
// table (a retry whose write was applied is OK), a read and compare
// (MISCOMPARE, Hint = offset of the first differing byte, nothing proposed),
// and Host.ProposeInTerm in the barrier's term (NOT_LEADER if the term moved).
// caw.go says why each step is there and why replicas never compare. Flush and
// Ping answer OK (an acknowledged write is already durable). Nothing a client
// sends can crash the process: a malformed frame closes the connection
// (transport), anything else gets a status. Raft traffic is another matter:
// its content is trusted (internal/raftnet, "Trust").
//
// OpFence (a takeover Open, pkg/client): request Volume, Epoch (the new
// writer's, non-zero, else READ_ONLY), Copyset (< the pool's copyset count),
// Offset = Length = 0 and no payload (else BAD_REQUEST). The volume is looked
// up as for IO (NO_SUCH_VOLUME, NO_SUCH_COPYSET, NO_SPACE / IO_ERROR of a
// stopped replica); an Epoch below the copyset's is FENCED. Otherwise a
// cmdFence is proposed and the reply sent once it applied: from then on every
// replica refuses the older epochs of the volume in that copyset.
//
// OpChecksum (scrub, tests): request Volume = pool id, Copyset = copyset id;
// reply payload = uint32 count, then count × (uint64 volume, uint64 chunk
// index, uint32 crc32c of the whole chunk), sorted by volume then index.
// Chunks that read as all zeros are left out, so a never-written chunk and a
// trimmed one compare equal across replicas. scrub.DecodeChecksums parses it.
//
// # Peer transport
//
// internal/raftnet carries the raft traffic between chunkservers: a
// raftnet.Transport is the raft host's raftstore.Transport, and its Receiver
// serves the OpRaft and OpSnapshot frames the handler passes on. The
// chunkserver only wires them: peer addresses from every heartbeat answer
// (Transport.SetPeers), the snapshot bandwidth (Config.SnapshotRate).
//
// # Goroutines and ownership
//
//   - Run's goroutine: heartbeats, creates and removes groups, drives
//     membership changes, refreshes the volume cache, forces WAL compaction.
//     It alone adds to and removes from replicas (under ChunkServer.mu) and
//     owns the unlisted map.
//   - transport.Server: a reader and a writer per connection; the reader runs
//     ServeFrame (the handler never blocks it on the network; a snapshot data
//     frame blocks it on the pipe, which is the transfer's flow control).
//   - Reads are served where the barrier's callback runs (the reader, or a
//     raft worker) when the page cache holds the data (preadv2 RWF_NOWAIT),
//     else on a goroutine each; proposal callbacks only queue replies. A request for an
//     unknown volume waits for the cache refresh on a goroutine of its own;
//     those refreshes run one at a time on volumeCache.runMisses, each shared
//     by every miss that arrived before it began.
//   - deleteLoop: the delete passes (deletes.go).
//   - watchStall: the WAL stall watchdog (stall.go): when the WAL has waited
//     Config.WALStallTimeout for its disk, it hands every leadership to a
//     peer (handOff, drain.go) and refuses new ones until the disk answers.
//   - raftstore workers: Apply/Capture/InstallSnapshot; a snapshot goroutine:
//     Persist, WriteSnapshot, SendSnapshot.
//   - raftnet: a sender goroutine per peer, a goroutine per incoming
//     snapshot transfer (see its doc).
//
// Fault injection: Config.Knobs hands wal.Knobs and datastore.Knobs down
// (slow or failing fsync, full disk); Knobs.AfterDeleteVolume runs right after
// a delete-volume entry was applied (a crash there); Knobs.Transport wraps the
// raft transport and Knobs.AfterMoveStep runs when a move's membership change
// applied on its leader (internal/faultpoint's named points use them).
//
// Lock order: volumeCache.refreshMu (held across the MDS calls of a refresh)
// → volumeCache.mu; volumeCache.missMu is a leaf.
// ChunkServer.mu, volumeCache.mu and stateMachine.mu are leaves: nothing else
// is locked while one is held.
//
// # Metrics
//
// With MetricsListen set, /metrics serves a registry of its own:
// basalt_chunkserver_io_{ops_total,bytes_total,latency_seconds} per op,
// copyset_io_{ops,bytes}_total per copyset and op, per-copyset applied index,
// leader, term and health, the raft host's latency histograms and counters,
// the WAL's counters and its wal_{write,fsync}_seconds histograms (per batch);
// Go's /debug/pprof/ only on basalt chunkserver --debug-listen. An embedded NBD front end (below) adds
// its basalt_nbd_* and basalt_client_* metrics to the same registry.
//
// # Local fast path (local.go)
//
// A front end may run inside the chunkserver process (basalt chunkserver
// --nbd-listen/--nbd-socket, docs/design.md §7): its volumes' clients get the
// ChunkServer as client.Config.Local. ChunkServer.LocalID is this chunkserver's
// id; ChunkServer.Go takes an attempt the client would have sent here over a
// socket and hands it to the same handler (serveIO: same validation, same
// statuses, same raft path), with a ReplyWriter (localReply) that hands the
// reply header to the client's callback: a read is made straight into the
// client's buffer (handler.readNow asks the ReplyWriter for it), a write's
// payload is the client's buffer (copied into the proposal, as for a frame). The callback runs on whichever goroutine answers (a raft worker for
// writes, the reading goroutine for reads) and never blocks. Before Run serves
// the data plane and from shutdown on, Go answers NOT_LEADER with no hint
// (the client retries with backoff). Attempts to copysets another chunkserver
// leads go over the network as usual (NOT_LEADER with a hint redirects them).
package chunkserver
