// Package raftnet is the Raft peer transport of a chunkserver: it carries the
// raft messages of every copyset between chunkservers, batched per peer, over
// internal/transport connections, and streams snapshots. Transport is the
// raftstore.Transport (outbound); Receiver serves the OpRaft and OpSnapshot
// frames a chunkserver's transport.Server reads (inbound) and hands them to
// the raftstore.Host.
//
//	raftstore.Host ──Send──▶ Transport ── one transport.Conn per peer ──▶ peer's Receiver ──Step──▶ peer's Host
//	               ──SendSnapshot──▶ a connection per transfer ──▶ Receiver ──ReceiveSnapshot──▶ Host
//
// # OpRaft frames
//
// An OpRaft frame is one-way (no reply); its header's Hint is the sender's
// chunkserver id, its Length the batch format version, BatchVersion (2), and
// its Offset an alignment hint: 0, or 1 + the payload offset that the
// receiver should place on a 512-byte boundary in memory, Config.AlignSkip
// bytes into the frame's first entry data of 64 KiB or more (where a
// chunkserver's write data starts, so a follower writes it with O_DIRECT
// without a copy). Receivers that predate the hint ignore it. A
// receiver drops a frame of another version (and says so in its log, at most
// every 10 s): chunkservers of one cluster run one version. The payload is a
// sequence of records, one per raft message; all integers are big-endian:
//
//	record  = group u64 | mlen u32 | count u32 | message[mlen] | count × entry | data
//	entry   = flags u8 | type u8 | term u64 | index u64 | dlen u32        (22 bytes)
//	data    = the entries' Data, dlen bytes each, concatenated in entry order
//
// message is the marshalled raftpb.Message without its Entries, and with no
// field this version's raftpb lacks (such a record is refused: a raft upgrade
// that adds a field changes BatchVersion); its count entries are the entry
// headers that follow and their data. flags tells
// which optional fields of the raftpb.Entry are set (bit 0 Term, bit 1
// Index, bit 2 Type, bit 3 Data; other bits 0), so that absent and empty
// data stay apart (raft's empty entry has none); an unset field is 0 on the
// wire; type is one of raft's entry types (0-2). testdata/raftbatch.golden freezes the format (TestBatchGolden);
// FuzzDecodeBatch feeds the decoder garbage.
//
// Why the entries are not inside the protobuf message: a 256 KiB write is
// one entry of 256 KiB, and marshalling it into the message copied it once
// per follower on the leader and unmarshalling copied it again on each
// follower, each copy into fresh memory. Here the data never moves in user
// space: Send makes each entry's data (of 512 bytes or more; shorter data is
// copied into the frame's small part) a piece of the frame's payload, which
// the connection writes with the frame's other pieces in one writev
// (transport.Conn.SendAsync); raft never modifies an entry, so the pieces
// stay valid while they are written. A Receiver reads a payload of 64 KiB
// or more into a buffer of its own (transport.PayloadAllocator) and the
// decoded entries' Data are slices of it, kept for as long as raft and the
// WAL keep the entries; a smaller payload is read into the transport's
// pooled buffer, and its entries' data are copied out (one allocation).
//
// # Sending
//
// Send only encodes and queues, it never blocks: messages to one peer from
// one Send (one Ready round) become one frame (split at 16 MiB). While the
// peer's connection is up and nothing waits in its queue, Send hands the
// frame to the connection's writer itself (one goroutine hand-off less on
// every replication round trip); otherwise the frame is queued and the peer's
// sender goroutine dials, drains the queue in order, and then lets Send write
// directly again. An unreachable peer's messages are dropped (raft retries)
// and it is redialed at most every 200 ms; more than 64 MiB queued for one
// peer is dropped too. A Receiver drops messages not addressed to its
// chunkserver, and MsgSnap outside a snapshot transfer.
//
// # Trust
//
// A Receiver checks the format of what it reads and drops a malformed frame
// whole. The content is screened by raftstore.Host.Step against each group's
// state (raftstore's doc, "Messages from the network"): local message types,
// strangers, term-0 messages and messages that contradict the log never reach
// raft, and a raft panic stops one group, never the process
// (TestForgedRaftFramesDoNotCrashChunkservers sends issue 14's attack frames
// to real chunkservers).
//
// # Snapshot transfer
//
// SendSnapshot opens a dedicated connection and sends OpSnapshot frames, each
// answered before the next is sent:
//
//	Volume  transfer id (random, odd), Offset  sequence number from 0,
//	Length  kind: 1 begin, 2 data, 3 end,      Hint    sender's id
//	begin:  payload = one record (format above) holding the MsgSnap
//	data:   payload = the next ≤ 1 MiB of StateMachine.WriteSnapshot's stream
//	end:    no payload; answered once Host.ReceiveSnapshot returned:
//	        OK when the data is staged, IO_ERROR otherwise
//
// The Receiver pipes data frames into Host.ReceiveSnapshot running on its own
// goroutine; an out-of-sequence frame, or one on another connection than the
// begin frame's, answers BAD_REQUEST (the former abandons the transfer); a
// transfer idle for 30 s is abandoned, and one whose connection closed (the
// sender crashed mid-stream) at once, so that the group's next leader need not
// wait out the 30 s (TestSnapshotSenderGoneFreesGroup). One transfer per group at a time: a
// begin frame for a group whose transfer is under way answers BUSY, and the
// sender's raftstore reports the snapshot failed to raft, which retries once
// the first transfer ended (two overlapping streams once made a follower
// record a snapshot's index over another snapshot's data;
// TestSnapshotReceiverOneStreamPerGroup) — after a second's pause, so a busy
// follower is not offered a stream on every heartbeat. A begin frame from a
// newer term than the transfer under way ends that one (a former leader's,
// whose snapshot raft would drop) and is itself refused until its receive
// unwound (TestSnapshotStreamFromFormerLeaderEnds). A frame the receiver has not
// answered within 60 s (snapStallTimeout) ends the transfer: SendSnapshot
// closes the connection and fails, so that a follower whose disk hangs while
// staging cannot hold the leader's log for ever (a stream's hold keeps the log
// after its index); TestSnapshotStalledReceiverGivesUp.
//
// Bandwidth: one token bucket per chunkserver (Config.SnapshotRate, default
// 64 MiB/s, burst one frame; throttle.go) covers the snapshot bytes it sends
// and receives together: the sender waits for a data frame's bytes before
// sending it, the receiver before handing it on (holding the connection's
// reader, so the sender, waiting for each answer, slows down too). Rebuilds
// and rebalancing thus leave disk and network to foreground IO.
//
// # Goroutines and ownership
//
//   - Send runs on raftstore workers and on the WAL's committer (durable
//     appends' responses); SendSnapshot on a raftstore snapshot goroutine,
//     with a connection of its own.
//   - One sender goroutine per peer owns that peer's transport.Conn (dials,
//     closes, drains the queue); once drained it publishes the Conn in
//     peer.conn (under peer.mu) for Send to queue frames on directly.
//   - Receiver: frames arrive on the transport.Server's connection readers
//     (ServeFrame); one goroutine per incoming snapshot transfer runs
//     Host.ReceiveSnapshot.
//
// Lock order: Transport.mu and peer.mu are taken one at a time; peer.mu is
// held while queuing on a Conn (whose lock comes after it). Receiver.mu is a
// leaf.
package raftnet
