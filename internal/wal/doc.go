// Package wal is basalt's write-ahead log: one segmented, append-only Raft
// log per chunkserver, shared by every copyset (Raft group) on it.
//
// A hundred Raft groups with a log file each would cost a hundred fsyncs per
// Ready round. Here all groups append to the same files, and whatever any
// caller hands to Save while the previous fdatasync is running goes to disk
// with one write and one fdatasync (group commit). The package keeps an
// in-memory index per group — every entry's term and on-disk location, plus
// a bounded cache of the newest entries' data — and serves each group as a
// raft.Storage (go.etcd.io/raft/v3).
//
// # Using it
//
//	w, err := wal.Open(wal.Config{Dir: dataDir + "/wal"})
//	st := w.Storage(group)                 // give to raft.Config.Storage
//	err = w.Save([]wal.Update{{Group: g, HardState: rd.HardState,
//	        Entries: rd.Entries, Snapshot: rd.Snapshot}}) // before sending / Advance
//	err = w.CreateSnapshot(g, snap, compactTo) // after the chunks are synced
//	for _, g := range w.PinningGroups() { /* make g snapshot soon */ }
//
// Save returns only once its records are durable. Saves from many
// goroutines may run at once, but Saves for one group must not overlap (the
// caller's order is the log's order; the Raft host handles a group on one
// worker at a time). Entries handed to Save are kept by reference in the
// cache and returned by Storage.Entries: nobody may mutate them afterwards,
// as raft already requires.
//
// # Files
//
// The WAL directory holds segment files named by a 16-digit lower-case hex
// sequence number, "0000000000000001.wal", "0000000000000002.wal", ...; the
// sequence has no holes. A new segment is written as "<name>.tmp" (header
// and checkpoint), preallocated by writing zeros up to Config.SegmentSize (or
// more, for a batch larger than that), fsynced, renamed, and the directory
// fsynced, so a segment exists only complete. Open creates the WAL
// directory, and any parent it needs, with fsdir.MkdirAll, which fsyncs the
// parent of each directory it makes. Leftover .tmp files are deleted by
// Open. Because the file is preallocated with written blocks (not
// fallocate(2)'s unwritten extents, whose conversion would make each
// fdatasync commit the file system journal), a record write never changes
// the file size or the block map and fdatasync(2) needs no metadata flush.
// The zeros go with O_DIRECT where the file system takes it (not through the
// page cache: copying them cost as much as the records' own writes), so the
// committer writes whole pages: each write starts again at the page boundary
// before the end of the log (the same bytes) and pads the rest of its last
// page with zeros; a partial write into an uncached page would make the kernel
// read it from disk first. Batches of 64 KiB and more are written with O_DIRECT
// too: through the page cache their pages cost an allocation, a copy and the
// writeback in fdatasync; the kernel writes back and drops cached pages a
// direct write covers, so the two kinds of write mix. A direct write gathers
// the batch's records in a page-aligned buffer, except the data of large
// entries (16 KiB and more), which goes to the disk from the entries
// themselves: O_DIRECT wants every piece of a write to start and end on a
// 512-byte boundary (the disk's logical block size), so such an entry is
// padded until its data's place in the file agrees with its address in memory
// modulo 512, its batch starts on a 512-byte boundary (after a pad record if
// need be), and only the first and last few hundred bytes of its data are
// copied (direct.go). The files of the last eight removed segments are kept as
// "<name>.recycle.tmp" and reused for new segments instead of zero-filling
// fresh ones (which doubled the WAL's disk writes under sequential writes);
// the records of their old segment stay in them and read as the end of the
// log, because every record carries its segment's tag.
//
// # Segment format
//
// All integers are little-endian.
//
//	segment  = header checkpoint-record* (batch record*)* rest
//	header   = "BWAL" | version u32 (=4) | seq u64            (16 bytes)
//	record   = length u32 | crc u32 | tag u32 | payload[length]
//	tag      = low 32 bits of seq, with bit 31 set
//	crc      = CRC-32C (Castagnoli) over the payload, then the 4 length
//	           bytes, then the 4 tag bytes
//	payload  = type u8 | body
//
// The records end at the first length of 0 or tag other than the segment's:
// the rest is zero-fill, or records of the segment a recycled file held
// before (fewer than 12 bytes left at the end of a full segment end it too).
// Every write of the committer (a batch) starts with a batch record; the
// checkpoint that starts a segment does not need one (it is fsynced before
// the segment exists). Version 3 is version 4 without batch records, and
// version 2 is version 3 without padded entries and pad records; both are
// read (and an old last segment is closed with a rollover at Open, so that
// no batch record is ever appended to it). Any other version (1 had no tag
// and an 8-byte record header) is ErrVersion, naming the version. Record
// types and bodies:
//
//	1 entries      group u64 | first index u64 | count u32 |
//	               count × (term u64 | etype u8 | dlen u32 |
//	                        [pad u16 | pad × 0] | data[dlen])
//	               etype: raftpb.EntryType in bits 0-5; bit 7 (0x80) set
//	               when Data was non-nil (so empty and nil Data differ);
//	               bit 6 (0x40) set when the pad count and padding precede
//	               the data (pad < 512: aligns the data for a direct write).
//	               Indexes are first, first+1, ...; an index <= the group's
//	               last replaces the log from there (Raft truncation). An
//	               Update's entries are split over several records so that
//	               no payload exceeds 1 GiB (the replay limit).
//	2 hard state   group u64 | term u64 | vote u64 | commit u64
//	3 snapshot     group u64 | flags u8 | index u64 | term u64 |
//	               compact index u64 | compact term u64 |
//	               auto-leave u8 | voters | learners | voters-outgoing |
//	               learners-next | dlen u32 | data[dlen]
//	               where each list is n u32 | n × u64.
//	               flags bit 0 (reset): a snapshot received from the leader;
//	               the group's log becomes empty after compact index (which
//	               equals index). Without it: the latest snapshot is set (if
//	               index is not older) and entries <= compact index are
//	               dropped (CreateSnapshot, and checkpoints).
//	4 group removed  group u64: forget the group and all its state.
//	5 pad          zero bytes: nothing (moves the next record to a 512-byte
//	               boundary of the file; at least 13 bytes in all).
//	6 batch        mark u64: the durable mark, the offset of this segment up
//	               to which it was known fdatasynced when the batch was
//	               written (after the last synced batch; after the
//	               checkpoint in a new segment; the end of the records that
//	               Open read, and synced, in a reopened one). 21 bytes in all.
//	               In a batch with entry data written by reference, a pad
//	               record follows it.
//
// testdata/segment.golden freezes this format (TestGoldenSegment).
//
// # Checkpoints and segment removal
//
// When a batch does not fit in the active segment, the committer creates the
// next one and starts it with a checkpoint: for every group with durable
// state, a snapshot record without the reset flag (latest snapshot and
// compaction point) and its latest hard-state record, as of the batches
// already applied. The batch then follows the checkpoint.
//
// INVARIANT: the state that replay rebuilds from segments k..n is the same
// as from 1..n for every group whose entries in 1..k-1 are all compacted:
// segment k's checkpoint restates each group's hard state and snapshot, and
// every later change is in k..n. Hence a segment can be deleted as soon as,
// for every live group, the highest entry index the segment holds for it is
// <= the group's compact index. Only the oldest segments are deleted, never
// the active one, and the directory is fsynced after deletion.
//
// A checkpoint costs, per group, one hard-state record and one snapshot
// record including the snapshot's Data; snapshot Data is therefore meant to
// be small (the state machine's few KiB of epochs, not chunk data — that is
// streamed separately by the Raft host).
//
// PinningGroups names the live groups that keep the oldest segment alive;
// the host makes them snapshot. PinningIndexes adds the compaction index
// each needs to reach (an idle group with a short log must compact further
// than a keep-the-last-N-entries policy would). RemoveGroup unpins a group
// at once.
//
// # Open and repair
//
// Open reads the segments in order, checks every CRC and applies every
// record to the in-memory state. Where a segment's records end before its
// zero-fill (a record with the segment's tag that is incomplete or fails its
// CRC, or any non-zero bytes after the last record, which is what damage to
// a length or tag looks like), Open must tell a torn tail from corruption:
//
//   - A torn tail is a batch that was being written, never fdatasynced, when
//     the machine died: nobody was told it was durable, so it may go.
//   - Corruption is damage to bytes that had been fdatasynced, records whose
//     Saves returned (acknowledged writes, HardState votes): dropping them,
//     and every record after them, would break Raft's promises.
//
// The batch records decide it (version 4). If any readable batch record of
// the segment after the damage at offset X carries a mark > X, the batch was
// written when X was already durable: ErrCorrupt, and the file is left
// untouched for the operator (the replica's copysets are rebuilt from the
// other replicas). If every later mark is <= X, the damage lies after the
// last sync: a torn tail, logged (slog, Warn), the file truncated at X and
// preallocated again (zeros), and the log continues from there. (Records
// after damage cannot be walked, since a damaged length is possible, so
// Open searches the rest of the segment for the tag and type bytes of batch
// records and checks each candidate's length and CRC.) Non-zero bytes after
// the end of the last segment's records without such proof are cleared the
// same way (quietly): they may hold a record of this segment written out of
// order before a crash, which a later append ending exactly where it starts
// would otherwise bring back. A bad record in any other segment is ErrCorrupt
// (a segment is synced in full before the next one is created), as is a
// record whose CRC is good but whose body does not decode, a missing
// sequence number or a bad header: the WAL never skips data silently. Open
// fdatasyncs the last segment before it appends, so that the next batch's
// mark (the end of what Open read) is true even after a process crash that
// left unsynced bytes in the page cache.
//
// The limit: damage inside the last synced batch, with no batch written
// after it, looks exactly like a torn tail, and is cut (with the warning).
// Raft then loses that replica's last acknowledged batch, as it would on a
// disk that lost the write; the other replicas of each copyset still hold
// it, and the replica catches up from them. Segments of versions 2 and 3
// carry no marks: in their last segment the first bad record starts a torn
// tail, as before. The scheme assumes that a rewrite of the same bytes (the
// committer rewrites the start of the last page) cannot damage them, that
// is, that the disk writes a sector whole or not at all.
//
// Replay tolerates one thing that only segment removal produces: a group's
// first surviving entries record may start after its last known index
// (older entries were in deleted segments). The log restarts there; a later
// snapshot record must compact past the hole, else Open fails with
// ErrCorrupt.
//
// # In-memory state
//
// Per group: the hard state, the latest snapshot (metadata and Data), the
// compaction point (index and term, which answers Term(FirstIndex-1)), and
// one entryLoc (term, type, segment, offset, length) per retained entry.
// The newest entries themselves are cached so that raft's reads of
// just-appended entries (MsgApp to followers, CommittedEntries) do not touch
// the disk; older ones are read back with pread. Entries the host has not
// applied yet (SetApplied) stay cached up to 32 × Config.CacheBytes per group,
// applied ones up to Config.CacheBytes (1 MiB by default: a hundred idle
// groups cost at most 100 MiB; 32 × that only while applies lag behind).
//
// # Goroutines and locks
//
// One committer goroutine (started by Open, stopped by Close) owns the
// writes: it takes the pending batch, rolls over if needed, writes it with
// one pwrite, fdatasyncs, then applies the batch to the in-memory index,
// detaches the segments no longer needed, wakes the batch's callers, and
// only then unlinks (or keeps for reuse) the detached files and syncs the
// directory. The records of a batch are sealed with the active segment's tag
// just before the write, once the rollover decided which segment that is.
// Once the active segment is half full, the committer starts a short-lived
// preparer goroutine that takes a recycled file, or else creates the next
// segment file under a temporary name ("<name>.prep.tmp"), preallocates and
// fsyncs it, and hands it over under WAL.mu; the rollover then only writes
// the header and checkpoint, fdatasyncs, renames and syncs the directory
// (about 0.6 ms instead of 2 ms here). Close waits for it and deletes an
// unused spare and the recycled files.
//
// Callers (Save, CreateSnapshot, RemoveGroup) validate their input and encode
// their records into the pending batch under WAL.mu, kick the committer and
// wait. SaveAsync does the same without the wait: the committer calls its
// callback after the batch (in call order), so a group may have several saves
// in flight; validation then checks a group's entries against the last index
// queued for it (group.queuedLast), not only the durable one. Entry data of
// 16 KiB or more is not copied into the batch: the batch's buffer holds
// everything else, a reference says where in the batch the data goes, and the
// write takes it from the entry itself (the entries are immutable, and the
// batch holds them until written; a direct write hands most of it to the
// kernel in place, see Files). So a batch's buffer stays small however large
// its writes (it is reused from batch to batch). Storage methods take
// WAL.mu briefly and read the disk without it.
// WAL.mu is a leaf lock; nothing else is held while taking it.
//
// INVARIANT: the in-memory index reflects exactly the batches that were
// durably written, in write order; a batch is applied after its fdatasync,
// never before, so raft cannot read back anything that is not durable. The
// one exception is a batch of nothing but Update.NoSync records (HardStates
// whose only change is the commit index, raft.MustSync false): it is written
// without an fdatasync and applied at once, and becomes durable with the next
// synced batch (or the old segment is fdatasynced before a rollover, so a torn
// record can only be in the last segment). Losing it in a crash only lowers the
// commit index recovered, which raft tolerates. This takes one fdatasync off
// the leader's path from commit to apply.
//
// Config.OnCommit reports each batch's write and fdatasync time (for latency
// histograms); Stats counts synced batches and UnsyncedWrites.
//
// INVARIANT: after a write or fdatasync error the WAL accepts nothing more
// (ErrFailed): what reached the disk is unknown until Open re-reads it.
//
// # Code map
//
//	wal.go      the WAL type, Open, the public calls, Close
//	recover.go  Open's replay: segment scan, torn tail or corruption, record replay
//	segment.go  segment files: create, preallocate (zeros), spare, rollover
//	commit.go   the commit pipeline: batches, validation, the committer, writes
//	compact.go  snapshots, pinning, removing and recycling old segments
//	format.go   record encoding; group.go the per-group index and entry cache;
//	storage.go  raft.Storage; direct.go O_DIRECT writes; stats.go counters
//
// # Fault injection
//
// Config.Knobs has hooks after the write, before and after the fdatasync
// (BeforeSync may fail the batch), and a SyncDelay that simulates a slow
// disk. They are nil in production.
package wal
