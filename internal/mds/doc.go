// Package mds is basalt's metadata service (docs/design.md §2, §6, §8): topology
// (zones, servers, chunkservers), pools and their copysets, volumes, and
// writer sessions with fencing epochs, all kept in etcd and served over the
// gRPC API of pkg/api (mds.proto).
//
// # Processes and election
//
// Two or three MDS processes share one etcd: by default a single-member
// etcd embedded in the MDS (Config.DataDir), or an external cluster
// (Config.EtcdEndpoints). All MDS of a cluster must use the same etcd:
// either an external cluster, or — for a small setup — the etcd embedded in
// the first MDS, given to the others as EtcdEndpoints (that MDS is then a
// single point of failure for the metadata, though not for the election).
// Each campaigns in an etcd election
// (client/v3/concurrency, session TTL Config.ElectionTTL, 3 s by default).
// The winner is the active MDS and serves every RPC; the others are
// standbys that answer every RPC with gRPC Unavailable and the message
// "not the active MDS; active is ADDR" (pkg/mdsclient follows it). When
// the active MDS dies its election lease expires and a standby takes over
// within about ElectionTTL; a clean stop resigns, so the hand-over is
// immediate.
//
// INVARIANT: every write to etcd runs in a transaction that also reads this
// MDS's election key (Server.txn). A deposed MDS — its session expired
// while a request was in flight — therefore cannot commit: the key is
// gone, the transaction fails with ErrNotActive. Two MDS never both write.
//
// All persistent state is in etcd. The only in-memory state is what
// heartbeats report (liveness, capacity, copyset replica statuses and
// leaders); a newly active MDS starts with none and rebuilds it from the
// heartbeats that chunkservers send every second. Until a chunkserver's
// first heartbeat reaches it, the chunkserver counts as offline.
//
// # etcd layout
//
// Values are JSON (readable with etcdctl). Ids are zero-padded to 20 digits
// in keys so that keys sort by id.
//
//	/basalt/election/<lease hex>     election candidates; value: MDS address
//	/basalt/ids/<kind>               last id issued or reserved; kind: chunkserver, pool, volume,
//	                                 session. Ids start at 1 and are never reused. Volume and
//	                                 session ids are reserved 128 at a time (idAllocator), so
//	                                 they have gaps and, after a failover, need not follow
//	                                 creation order.
//	/basalt/chunkservers/<id>        {id, zone, server, addr, data_dir, capacity_bytes, registered_unix_ms}
//	/basalt/pools/<id>               {id, name, replicas, chunk_size, copyset_count, created_unix_ms}
//	/basalt/pool-names/<name>        pool id (decimal)
//	/basalt/copysets/<pool id>       [{id, members: [chunkserver ids], epoch, move?}, ...] — every
//	                                 copyset of the pool; move = {from, to, reason, started_unix_ms},
//	                                 present while a member change is in flight (Scheduler)
//	/basalt/volumes/<id>             {id, name, size, pool_id, pool_name, created_unix_ms, epoch, writer,
//	                                 attachments: [{node, read_only, attached_unix_ms}, ...]}
//	/basalt/volume-names/<name>      volume id (decimal)
//	/basalt/volumes-revision         its ModRevision is the volumes revision: bumped by
//	                                 every volume create, resize and delete
//	/basalt/topology-revision        its ModRevision moves with every change to chunkservers,
//	                                 pools or copysets (lets an MDS cache them)
//	/basalt/sessions/<id>            {id, volume, read_only, epoch, client, lease, opened_unix_ms};
//	                                 attached to an etcd lease of Config.SessionLease
//	/basalt/nodes/<id>               {id, zone, server, registered_unix_ms}: a host that attaches
//	                                 volumes (the CSI node plugin registers itself; RegisterNode)
//	/basalt/access-nodes/<id>        {id, addr, name, registered_unix_ms}: NVMe/TCP access nodes
//	                                 (RegisterAccessNode; the same addr keeps its id)
//	/basalt/nvmf-subsystems/<nqn>    {nqn, policy}: a subsystem's ANA policy, inherit or balance
//	                                 (the NQN path-escaped; absent: inherit)
//	/basalt/reservations/<volume-id> {state, last_request}: a volume's persistent reservations
//	                                 (internal/reservation.State), deleted with the volume
//	/basalt/chap/<volume-id>         {user, secret, mutual_user?, mutual_secret?}: the CHAP of the
//	                                 volume's iSCSI target (chap.go), deleted with the volume;
//	                                 secrets in clear (a target needs them), never logged
//	/basalt/ana-assignments          [{subsystem, host, nsid, optimized, non_optimized}, ...]:
//	                                 the ANA paths of every host and namespace (ana.go)
//
// Every change touching more than one key (allocating an id, creating a
// pool with its name index and copysets, opening a volume) is one etcd
// software transaction with serializable-snapshot isolation: it retries when
// a key it read changed, so concurrent requests never lose updates.
//
// # NVMe/TCP access nodes and ANA (ana.go)
//
// Access nodes (basalt nvmf --multipath) register once and heartbeat every
// second with the (subsystem, host, namespaces) connected through them;
// liveness is in memory like the chunkservers'. Each heartbeat recomputes
// the assignment with placement.AssignANA over the live nodes (each host
// only over the nodes it is connected to), sticky to the stored one, and
// stores it when it changed; the answer carries the live nodes (the
// discovery log's ports) and the reporting node's hosts' assignments. For
// HeartbeatTimeout after a takeover the stored assignment is only read, so
// that a new active MDS does not move paths off nodes it has not heard yet.
//
// # Pools and copysets
//
// CreatePool places the pool's copysets once with internal/placement on the
// chunkservers online at that moment: members in distinct zones (distinct
// servers when there are fewer zones than replicas), balanced, wide scatter
// width. A copyset's epoch starts at 0; chunkservers bootstrap its Raft
// group with those members. Member moves of the scheduler bump it.
//
// # Scheduler (docs/design.md §8)
//
// Every Config.ScheduleInterval the active MDS runs one scheduler round
// (scheduler.go). The decisions are pure functions of internal/placement
// (Repairs, Balance, LeaderTransfers, Budget); the MDS feeds them the
// topology from etcd and the heartbeat state, and carries the results out.
//
// Chunkservers, as a round sees them:
//
//   - dead: offline, its last heartbeat older than Config.RecoveryGrace
//     (10 min by default; counted from the takeover for a chunkserver the
//     new active MDS never heard from; never with a negative grace);
//   - sick: online, but its heartbeat's disk state (api.DiskState) is FULL
//     or IO_ERROR: a replica stopped on a disk error;
//   - serving: online with disk state OK (or UNKNOWN: no heartbeat yet); a
//     target besides when its disk is less than 95% full. Only targets
//     receive replicas.
//
// A member move replaces one member of a copyset in its record, bumps the
// copyset's epoch and records the move ("move": from, to, reason,
// started). The chunkservers do the rest through Raft: the copyset's leader
// adds the new member as a learner, which catches up (InstallSnapshot, then
// the log); once caught up, one joint change promotes it and removes the old
// member, and raft leaves the joint configuration by itself (internal/chunkserver
// members.go, raftstore.NextMoveStep). A move is in flight until the leader's
// heartbeat reports exactly the listed members as voters, no learners and no
// joint configuration (voters_outgoing empty: while it is joint, the incoming
// half already lists the new members but the old one still counts for quorum);
// the next round then clears the record ("copyset move done", with how long
// it took). A move whose target went bad (dead, sick, or its replica
// stopped) is a failed move: it stops counting and the copyset is repaired
// again, to another target.
//
// INVARIANT: a copyset record with a move lists move.to among its members
// and not move.from, and its epoch was bumped by the same transaction that
// wrote the move. A copyset has at most one move record; a new move (only
// after a failed one) replaces it.
//
// Each round, in order:
//
//  1. Repairs. Members that are sick or whose replica reports itself
//     stopped (reason "disk") are replaced at once, without the grace
//     period, then dead members (reason "dead"); one move per copyset at a
//     time, only while the copyset has a leader among its online members.
//     The replacement is a target in a failure domain (zone, or server when
//     the cluster has fewer zones than replicas — the level placement.Place
//     uses) none of the remaining members uses, the least loaded, then the
//     one sharing fewest copysets with the remaining members.
//  2. Copyset balancing, only when every member of every copyset is
//     serving (nothing to repair, nobody down even within the grace). Per
//     replicated pool (a pool of one replica is left as placed: it is meant
//     to be placed by fit, not by count, docs/design.md §9, which is not built yet),
//     the most loaded target gives a copyset to the least loaded one that
//     can take it while their counts differ by two or more
//     (reason "balance"); copysets with a member too full to be a target
//     stay put. A chunkserver that joins thus receives copysets until
//     counts are even.
//  3. Leader balancing, only when calm as in 2 and no move is in flight:
//     leader transfers (at most Config.MaxLeaderTransfers in flight, each
//     forgotten after max(10 s, 3 rounds)) from the serving chunkserver
//     leading the most copysets to the serving member of one of them that
//     leads the fewest — or, when no single transfer can even the counts
//     (every copyset of the busiest leaves out the idlest), a chain of two
//     through a member leading one fewer. A transfer in flight counts as
//     done when the next ones are planned (heartbeats lag; planning from the
//     old leader overshoots). The transfer rides in the heartbeat answers to
//     the current leader (HeartbeatResponse.transfer_leaders), which asks
//     Raft to transfer.
//
// Rate limits: moves of every kind share one budget: at most
// Config.MaxRecoveryMoves in flight cluster-wide (default 4) and at most
// Config.MaxMovesPerChunkserver (default 2) involving one chunkserver, as
// the receiver of the new replica or as the copyset's leader, which streams
// the snapshot (the leader when the move is planned: leadership may move
// later, by an election or a hand-over). Foreground IO is further protected
// on the chunkservers, whose snapshot streams are bandwidth-limited.
// Config.DisableBalance turns steps 2 and 3 off. Every move started and
// done is logged with the copyset, from, to and reason (and every leader
// transfer requested); basalt_mds_copyset_moves_total,
// basalt_mds_copyset_moves_in_flight and basalt_mds_leader_transfers_total
// count them, and ClusterStatus reports moves_in_flight.
//
// # Volumes and sessions (docs/design.md §6)
//
// A volume is one small record whatever its size; routing is computed
// (api.CopysetOf). OpenVolume read-write increments the volume's
// epoch, makes the new session its writer and so supersedes the previous
// writer: that session's RenewSession then fails with FailedPrecondition
// "superseded by a newer writer". Read-only sessions have epoch 0 and
// coexist with the writer. A session lives as long as its etcd lease:
// RenewSession refreshes it; an unrenewed session disappears after
// SessionLease and its renewals answer NotFound. A volume with a live
// writer session cannot be deleted.
//
// INVARIANT: a volume's epoch only grows (one transaction reads it, adds
// one and names the new writer), so no two read-write opens ever share an
// epoch, across restarts and MDS failovers alike.
// INVARIANT: volume.writer != 0 implies the session of that id was opened
// read-write with epoch == volume.epoch (it may have expired since).
//
// # API rules
//
// Each error of errors.go is one gRPC code; the message says what to do.
//
//   - InvalidArgument: a pool or volume name outside 1 to 128 characters of
//     [A-Za-z0-9._-]; a volume size that is not a positive multiple of 4096
//     or exceeds 4 PiB; replicas outside 1..MaxReplicas; a chunk size that is
//     not a power of two from 1 MiB to 1 GiB; more than MaxCopysetsPerPool
//     copysets; a resize that shrinks (resizing to the same size is a no-op);
//     CreateVolume without a pool while several pools exist, none of them
//     named "default" (with one pool, that pool is used).
//   - NotFound: an unknown pool, volume or chunkserver (a Heartbeat from an
//     unregistered id, a registration naming an id the MDS does not know); a
//     RenewSession whose session lapsed or was closed, or whose volume was
//     deleted.
//   - AlreadyExists: a pool or volume name in use.
//   - FailedPrecondition: CreatePool with fewer online chunkservers or failure
//     domains than replicas; CreateVolume with no pool at all; DeleteVolume of a
//     volume with any live session (writer or reader); RenewSession of a superseded writer.
//   - Unavailable: this MDS is a standby (see above).
//
// CloseSession of an unknown or lapsed session succeeds: it is gone either way.
//
// # Health
//
// A chunkserver is online while its last heartbeat (or registration) is
// younger than Config.HeartbeatTimeout. A copyset's leader hint is the
// leader reported with the highest term by an online member. ClusterStatus
// counts a copyset healthy when every member is online, a leader is known
// and its Raft voters are the listed members; unavailable when no majority
// is online; degraded otherwise (a member down, no leader yet, a move in
// flight).
//
// # Goroutines
//
//   - Run's goroutine owns the etcd client and the election loop (campaign):
//     the etcd session, becoming active and standby.
//   - one goroutine serves gRPC; handlers run on gRPC's goroutines and share
//     Server.live and Server.elKey under Server.mu (no other locks; never
//     held across an etcd call); the cached topology (Server.topo) is under
//     Server.topoMu, never held together with mu.
//   - monitor logs chunkservers going offline and updates gauges.
//   - schedule runs the scheduler every Config.ScheduleInterval while this
//     MDS is active; its writes go through Server.txn; the leader transfers
//     it arms (Server.transfers) are under Server.mu and read by Heartbeat.
//   - optional: the /metrics HTTP server (our own Prometheus registry, never
//     the default one that the embedded etcd fills); pprof only on
//     basalt mds --debug-listen.
//
// # Security
//
// With Config.TLS the gRPC API is mutual TLS 1.3 and every RPC is
// authorized by the caller's role (authz.go: one table, an RPC missing
// from it is refused); the embedded etcd serves TLS with client
// certificates. docs/security.md states the model.
package mds
