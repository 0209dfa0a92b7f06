// Package raftstore is basalt's multi-Raft host: it runs one go.etcd.io/raft/v3
// RawNode per copyset (Raft group) on a chunkserver and does everything the library
// leaves to its user — storage, transport, ticking, applying, snapshots — for
// hundreds of groups with a handful of goroutines.
//
// # Groups, workers and the ready-queue
//
// A Host keeps its groups in a map. Everything that can give a group work — a tick,
// raft messages (Step), a proposal, a read barrier, a conf change, a leadership
// transfer, the end of a snapshot — is appended to the group's inbox and the group
// is signalled to the scheduler, a FIFO ready-queue. Config.Workers goroutines pop
// batches of up to MaxBatchGroups groups and run one round over each batch.
//
// INVARIANT: a group is in the ready-queue at most once and held by at most one
// worker at a time; a group signalled while held is re-queued when the round ends.
//
// # Goroutines and what they own
//
//   - Workers (Config.Workers). The worker holding a group (group.procMu) owns its
//     RawNode and all of its host-side state: pending proposals and reads, lease,
//     applied index, conf state, snapshot bookkeeping. Only it calls the
//     StateMachine's Apply, Capture and InstallSnapshot, and LogStore.SaveAsync.
//   - The log's committer runs SaveAsync's callbacks (Host.appended): it sends
//     durable appends' responses to peers (Transport.Send, which never blocks;
//     workers send the rest) and puts the others in inboxes.
//   - The ticker (one per host) only appends ticks to inboxes.
//   - Snapshot creators (one per group at most, while group.snapping): call
//     StateMachine.Persist and LogStore.CreateSnapshot, then report to the inbox.
//   - Snapshot senders (one per follower being streamed to): call
//     Transport.SendSnapshot with StateMachine.WriteSnapshot, then report to the inbox.
//   - Callers of the API (Propose, Step, ReadBarrier, ...) touch only an inbox
//     (inbox.mu) and the scheduler (scheduler.mu). ReceiveSnapshot also calls
//     StateMachine.ReceiveSnapshot on the caller's goroutine, concurrently with applies.
//
// Lock order: Host.mu → group.procMu → inbox.mu → scheduler.mu; group.statusMu is a
// leaf. Callbacks (done) run on the worker with the group's procMu held: they must be
// short and must not call RemoveGroup or Stop (anything else is fine).
//
// # The round: the one Ready handler
//
// Raft runs with AsyncStorageWrites: a round never waits for the disk, so a group
// keeps stepping messages, committing, applying and answering while its log appends
// are being made durable (with the synchronous Ready/Advance contract a group was
// held for a whole fsync per round, and a write waited for about four rounds at
// QD32). Host.processBatch, per batch of groups:
//
//  0. Each group drains its inbox into raft: the outcomes of its log appends
//     first (a received snapshot is installed, StateMachine.InstallSnapshot, then
//     the append's responses to this node are stepped: raft learns what is
//     durable), then ticks and messages (a leader steps the messages first,
//     any other role the ticks: group.prepare says why), snapshot reports,
//     transfers, proposals, reads; then it takes its Ready.
//  1. Messages to peers go at once. A leader's MsgApp leaves before its own
//     append is durable (docs/design.md §3.4): raft counts the leader in a commit quorum
//     only when the append's self-acknowledgement is stepped. What must wait for
//     durability — a follower's MsgAppResp, a vote — raft keeps in the
//     MsgStorageAppend's responses.
//  2. The Ready's MsgStorageAppend (HardState, entries, received snapshot) becomes
//     the group's append job. The round's jobs of every group go to one
//     LogStore.SaveAsync (group commit, one fsync for all; the WAL also
//     coalesces the rounds that reach it during an fsync), called while the
//     round holds the groups: a group's appends take their place in the log in
//     round order, so a group may have several in flight (the next batch is
//     written while the last one syncs) and a commit-only HardState (raft.MustSync
//     false: no entries, snapshot, term or vote) can be written without an
//     fdatasync (wal.Update.NoSync) — the WAL writes batches one after another,
//     so everything before it is durable by then. Once a save is durable, the
//     WAL's committer sends its responses to peers and puts the rest in each
//     group's inbox (step 0 of a later round), in save order.
//  3. Apply: the Ready's MsgStorageApply entries in index order (Apply for normal
//     entries, ApplyConfChange for conf changes), answering their proposers, then
//     its response is stepped; then the ReadStates. Raft hands out only entries
//     that are committed and durable on this node, so an answer to a client never
//     precedes the local fsync, and a snapshot of the state machine never gets
//     ahead of the durable log.
//
// A failed Save stops every group that had something in it (the WAL refuses
// everything after a failed fsync anyway). In manual mode the Save runs inside the
// round and its outcome waits in the inboxes for the next round.
//
// # Entry format and proposals
//
// A normal entry's data is an 8-byte big-endian proposal id followed by the caller's
// bytes; the StateMachine sees only the caller's bytes. The caller of Propose leaves
// the room for the id (ProposalHeader) at the start of its buffer, which becomes the
// entry as it is: no copy of a write's data on the way into the log. An empty normal entry is a new
// leader's no-op and is not applied. A conf change entry is a marshalled
// raftpb.ConfChangeV2 whose Context is the 8-byte proposal id (V1 ConfChange entries
// come only from Bootstrap).
//
// The proposal ids come from a per-host counter. A proposal remembers its leader term;
// its log index is learned from the Ready that persists it (the round's proposals are
// the last entries of that Ready, in order). When the entry at that index applies,
// the proposal is answered if the entry has the proposal's term and id. Since only
// the leader of a term writes entries of that term, and a host can be leader of a
// term only once (a restart must win a new election, the vote being durable), (index,
// term) identifies the proposal; the id is checked as well.
//
// INVARIANT: every proposal's done runs exactly once: with Apply's result (nil or an
// *api.Error), with ErrNotLeader (not leader; raft dropped it; leadership or term lost
// before it applied — then it may still have been committed by the next leader, which
// is harmless because every basalt operation is an idempotent blind overwrite and the
// client retries), with ErrDiskFull or ErrIO (the group failed), with ErrNoGroup when
// the group is removed, or with ErrStopped when the host stops. These are the host's
// typed errors (errors.go); the data plane maps them to wire statuses in one place.
//
// # Reads: the leader lease
//
// Raft runs with CheckQuorum, PreVote and ReadOnlySafe; the host keeps its own lease
// on top. A ReadBarrier on the leader while its lease is valid takes the current
// commit index as the read index and completes as soon as it is applied: no network
// round trip. Without a valid lease the barrier issues a raft ReadIndex: a heartbeat
// round a quorum must acknowledge; its answer both serves the read (once the read
// index is applied) and renews the lease. A leader that served reads lately renews the
// lease in the background each tick once half of it is gone, so busy groups never
// pay the round trip.
//
// Safety argument. A ReadIndex issued at host-clock time t is answered only after a
// quorum acknowledged a heartbeat sent after t, in the leader's term. With
// CheckQuorum, a follower that heard from the leader ignores (pre)vote requests for
// ElectionTicks of its ticks (raft's "in lease" check); its first tick may come right
// after the heartbeat, so it guards at least (ElectionTicks-1) tick intervals after
// receiving the heartbeat, which is after t. A new leader needs votes from a quorum,
// which intersects the acknowledging quorum, so no other leader can be elected before
// t + (ElectionTicks-1)·TickInterval in real time. The lease ends at
// t + 0.9·(ElectionTicks-1)·TickInterval: the 10% margin covers clock-rate differences
// of up to about ±5% between leader and followers (a follower's ticker drifting fast,
// the leader's monotonic clock slow). The leader's clock is the monotonic wall clock,
// not its tick count (a slow ticker would stretch the lease); followers missing ticks
// only lengthen their guard. Leadership transfers void the lease: MsgTimeoutNow lets
// the transferee win votes at once, so no lease is granted by a ReadIndex issued
// before a transfer was last seen. A restarted host has forgotten whom it heard from,
// so it drops vote requests for its first ElectionTicks ticks per group (vote block).
// Residual risks, documented rather than solved: clock-rate drift beyond the margin,
// and a MsgTimeoutNow delayed in the network for longer than an election timeout.
//
// (b) of a barrier: done(nil) only once applied >= the read index, which is >= the
// commit index known when the read arrived. A barrier still waiting when leadership
// is lost gets ErrNotLeader. Followers never serve reads.
//
// Fast path: at the end of each round a leader whose lease is valid and that has
// applied everything it knows committed publishes its lease end in an atomic
// (group.fastLease); a ReadBarrier arriving before that time completes at once on the
// caller's goroutine, with no hand-off to a worker. It is as safe as the lease read:
// no other leader exists before the lease ends, and every write acknowledged to a
// client was applied before its acknowledgement, so a read that starts after that
// acknowledgement sees it. A transfer, a lost leadership, a failure or a removal clear
// the atomic before anything else happens (in particular before a MsgTimeoutNow is
// sent). Fast reads count as reads for lease renewal.
//
// # Catching up a follower
//
// Raft reads the entries of a MsgApp from the log (LogStore's Entries: older
// entries are pread from their WAL segment) inside Step, on the worker, while
// the worker holds every group of its batch: a round that reads much delays
// the ticks, heartbeats and answers of all of them, and a delay of an election
// timeout makes leaders step down and followers campaign. Two things bound
// what one round reads for one follower:
//
//   - Config.MaxInflightBytes (2 MiB): a follower in StateReplicate gets no
//     more than that unacknowledged (raft's MaxInflightMsgs × MaxSizePerMsg
//     alone allowed 256 MiB per group in one Step).
//   - A run of MsgHeartbeat or MsgHeartbeatResp from one sender and term in a
//     round is stepped once (heartbeat.go): the last, with the run's highest
//     read-index context (raft's acknowledgements are cumulative). For a
//     follower in StateProbe raft sends a MsgApp (up to MaxSizePerMsg) per
//     MsgHeartbeatResp; a chunkserver resumed after a pause (SIGSTOP) finds
//     ~10 queued heartbeats per group and second of pause and answered each,
//     so the new leader read and sent the same megabyte a hundred times per
//     group in one round — 1.5–2.5 s of a worker holding every copyset of
//     the chunkserver (TestResumedPeerHeartbeatBacklog; docs/reliability.md,
//     "Leader paused").
//
// # Snapshots and log compaction
//
// After SnapshotEntries applied entries since the last snapshot (or on Host.Snapshot),
// the worker captures StateMachine.Capture() at the applied index S (consistent with
// S: no apply runs meanwhile) and hands off; a background goroutine calls
// Persist(S, state) — which syncs the dirty chunks, docs/design.md §3.6 — and only then
// LogStore.CreateSnapshot(group, {S, term(S), ConfState as of S, state}, compactTo).
//
// INVARIANT: the log below a snapshot index is dropped only after the state machine
// made every effect up to that index durable (Persist returned).
//
// compactTo = S − CatchUpEntries, and never beyond the index of a snapshot still being
// streamed to a follower: that follower continues from that index + 1. A leader
// also keeps what a live follower (heard from within two election timeouts) still
// needs from the log, everything after its Match: one that has just installed a
// long snapshot is behind by every write made while it streamed, and compacting
// past it sent it snapshot after snapshot under steady writes. A follower the log
// cannot catch up anyway, or not heard from lately, holds nothing back. A
// compaction chosen before a stream began (the stream sending the snapshot
// before the one being written) still keeps the log after the streamed index
// (group.compact, under compactMu); a stream that finds the log already
// compacted past its snapshot gives up and raft retries with the newer one. The
// snapshot-send log line says why the peer needed one (peer_match, peer_next,
// log_first). Host.Snapshot (for groups that keep old WAL segments alive) compacts
// to S itself, live followers or not — except a follower that took a streamed
// snapshot within releaseGrace (30 election timeouts): the WAL asks while the
// stream holds the log, and compacting past the follower the moment its snapshot
// was in sent it another, for ever under steady writes; if the group
// applied nothing since its last snapshot, its leader first appends an empty entry
// so that a newer snapshot index exists (a follower waits for the leader's next
// entry: the WAL ignores a snapshot not newer than its current one).
//
// When raft wants to send a snapshot (MsgSnap), the host does not pass it to
// Transport.Send: a goroutine calls Transport.SendSnapshot(msg,
// StateMachine.WriteSnapshot) — the chunk data is streamed live, labelled with S,
// which is from before the copy began, and the follower replays from S+1 (docs/design.md §5)
// — and reports SnapshotFinish or SnapshotFailure to raft. If the stored snapshot
// predates the peer's membership (a new learner), raft on the peer would refuse it,
// so the host reports a failure, forces a new snapshot (which includes the peer, its
// conf change having applied) and raft retries.
//
// The receiving host stages the data (Host.ReceiveSnapshot →
// StateMachine.ReceiveSnapshot) and then steps the MsgSnap. When raft accepts it, the
// Ready carries the snapshot: step 2 persists it (the group's log restarts after S)
// and step 4 calls StateMachine.InstallSnapshot(S, state) before any later entry.
//
// # Restart
//
// CreateGroup on a group with state in the LogStore restarts it. raft.Config.Applied
// is the log's snapshot index; entries after it are replayed from the log, but normal
// entries up to min(Recover index, commit) are skipped (they reached the chunks
// durably), while conf changes among them are still applied to raft. Using
// Recover's index directly as Applied, as one might, would skip those conf changes.
// If the log's snapshot is newer than Recover's index, the process died between
// persisting a received snapshot and installing it: InstallSnapshot is called again
// (the staged data is still on disk, kept under the snapshot's index: a
// StateMachine installs only the data staged for the index it is given). A new group bootstraps (join=false: every
// initial member passes the same peers) or starts empty and waits for its leader
// (join=true: it gets the log or a snapshot).
//
// # Failures
//
// An Apply error that is not an *api.Error is a disk failure: the group stops for
// good (it never applies past the failed entry, never advances), GroupStatus.Healthy
// turns false with the cause in GroupStatus.Err, it is logged with the group id, and
// every pending and later callback gets that error. A failed log append stops the
// groups of its round the same way, and so does a failed snapshot (Persist or
// LogStore.CreateSnapshot), which is never retried: a second fsync can succeed
// after the kernel dropped the pages the first could not write. The error wraps ErrDiskFull when the cause is a
// full disk (ENOSPC, EDQUOT), ErrIO otherwise (DiskFailure, the one place that tells
// them apart). Other groups go on.
//
// # Messages from the network (guard.go)
//
// Raft trusts its input: a heartbeat committing past the log, or a storage
// thread's response, makes it panic. So every message Step delivers is
// screened on the worker, against the group's own state, before raft sees it:
//
//   - its type is one a peer sends (MsgApp, MsgAppResp, MsgHeartbeat(Resp),
//     MsgVote(Resp), MsgPreVote(Resp), MsgTimeoutNow; MsgSnap only through
//     ReceiveSnapshot). Local types (raft.IsLocalMsg: the storage threads'
//     MsgStorageAppend/Apply and responses, MsgHup, MsgBeat, ...) and the
//     forwarding ones this host never sends (MsgProp, MsgReadIndex,
//     MsgTransferLeader, MsgForgetLeader) are never accepted;
//   - To is this node; From is not 0, not this node, not a local thread;
//     Term is not 0 (raft steps a term-0 message as a local one);
//   - From is a member of the applied configuration (voter, learner, either
//     side of a joint one) or one the control plane lists (CreateGroup's
//     peers, Host.SetMembers): a replica that missed the conf change adding its
//     new leader still hears from it. A group with neither (a replica joined
//     empty, before its first snapshot) accepts any sender — the transport
//     authenticates chunkservers before a frame is read;
//   - a heartbeat commits no further than raft's last index, a MsgAppResp
//     acknowledges no further, a MsgApp's entries follow its index one by one
//     with terms between its LogTerm and Term (lastIndex follows the Readys).
//
// A refused message is counted (Stats.MessagesDropped) and logged at most every
// 10 s per group. What screening cannot catch (a member that lies within the
// rules) is contained: a panic in a group's round (raft's, or the state
// machine's) is recovered, stops that group only — GroupStatus.Err wraps
// ErrRaftPanic, with the panic and a stack in the log — and every pending and
// later callback gets the error. The process and the other groups go on; the
// chunkserver reports the replica unhealthy (not its disk), and the control
// plane replaces it.
//
// # Tests drive the host
//
// With Config.Manual the host has no goroutines: a test calls Tick and ProcessReady
// (which also runs snapshot creation and streaming), on one goroutine, so a seeded
// simulated network makes every run reproducible. The groups are ticked in id order.
//
// # Metrics
//
// Host.Stats returns histograms of propose→commit, Apply and LogStore.Save latency and
// counters of rounds, groups per round (the group-commit width), reads and snapshots.
// Nothing is registered globally; the chunkserver exports them.
package raftstore
