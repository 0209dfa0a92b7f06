// Package datastore stores the chunk files of a chunkserver disk: one file
// per chunk, grouped by copyset, with a pool of preallocated files, a dirty
// set that defers fsync until the Raft log is compacted (docs/design.md §3 step 6),
// atomic per-copyset metadata, and snapshot streaming for InstallSnapshot
// (docs/design.md §5).
//
// # Write path and durability
//
// Copyset.WriteAt is a plain pwrite into the page cache — no O_DSYNC, no
// fsync — because the shared WAL already made the write durable. The chunk
// joins its copyset's dirty set. Copyset.Sync, called by the state machine's
// Persist before the log is cut, swaps the dirty set out, fdatasyncs every
// chunk in it exactly once (after starting write-back of the whole batch
// with sync_file_range, then four fdatasyncs in flight, so the device sees
// the batch at once), and fsyncs the chunks/ directory if chunk files were created or
// removed. Only then may the caller record its applied index (SaveMeta) and
// compact the log. A crash loses unsynced chunk writes; the WAL replays them.
// Every operation (write, discard, zero, delete volume) is a blind overwrite,
// so replaying one that did reach the file is harmless.
//
// INVARIANT: a chunk changed before Sync was called is durable when Sync
// returns nil. A chunk changed while Sync runs is either synced by it or is
// still in the dirty set afterwards (the set is swapped before the first
// fdatasync, and a write marks its chunk dirty after its pwrite).
// INVARIANT: if Sync fails, everything it took stays dirty.
//
// Thin chunks: a chunk file appears on its first write. Absent chunks, never
// written ranges of a chunk file (preallocated extents), discarded ranges
// (FALLOC_FL_PUNCH_HOLE) and zeroed ranges (FALLOC_FL_ZERO_RANGE) all read as
// zeros. Discard and WriteZeroes of an absent chunk do nothing.
//
// # On-disk layout
//
//	<Dir>/
//	  pool/<chunk size>/<seq>              ready pool files: zeroed, preallocated, fsynced
//	  pool/<chunk size>/tmp-<seq>          a pool file being prepared (removed at Open)
//	  pool/<chunk size>/recycle/<seq>      files of deleted chunks, zeroed by the filler
//	  copysets/<group %016x>/
//	    info                               the copyset's chunk size (framed, see below)
//	    meta.0, meta.1                     SaveMeta's blob: two slots written in turn (below)
//	    meta                               SaveMeta's blob as older versions wrote it (framed;
//	                                       read while no slot holds a record, removed by the next save)
//	    meta.tmp                           older versions' SaveMeta in progress (removed at Open)
//	    chunks/<volume %016x>_<index %016x>  one file per chunk, exactly chunk-size long
//	    staging/                           a snapshot being received (removed at Open)
//	    staged.<raft index %016x>/         a received, fsynced snapshot awaiting install
//	    install                            the raft index of the last install begun (framed)
//	    chunks.old/                        the replaced chunks during InstallStaged
//	  copysets/<group>.tmp/                a copyset being created (removed at Open)
//	  copysets/<group>.removed/            a copyset being removed (removed at Open)
//
// <chunk size> is decimal bytes; <seq> is %016x from a per-store counter.
//
// Meta slots: record number seq (1, 2, ...) is written in place into
// meta.<seq%2> and fdatasynced; a record is magic u32 ("BMS2"), seq u64,
// payload length u32, crc32c of seq, length and payload u32, payload (the
// file may run on past it). LoadMeta takes the valid record with the highest
// seq: a save torn by a crash damages only its own slot, and the other holds
// the record before it. Both slots present and neither valid is ErrCorrupt.
//
// Framed files (info, the old meta, install) are: magic u32 ("BINF" for info,
// "BMTA" for meta, "BINS" for install), payload length u32, crc32c
// (Castagnoli) of the payload u32, payload;
// integers big-endian. They are replaced atomically: write name.tmp, fsync,
// rename over name, fsync the directory. A crash leaves the old or the new
// file; a file that fails the length or CRC check is reported as ErrCorrupt,
// never returned.
//
// # Chunk-file pool
//
// Taking a chunk file is a rename of a ready pool file into chunks/ (the
// directory fsync is left to Sync), so the first write to a chunk never waits
// for allocation while the pool has files. One filler goroutine per Store
// keeps Config.PreallocChunks ready files for every chunk size in use
// (fallocate to the chunk size, fsync, rename tmp-<seq> to <seq>, fsync the
// size directory). A pool file is only ever used for a copyset of its own
// chunk size. DeleteVolume renames the volume's chunk files into recycle/
// and fsyncs chunks/ and recycle/ before it returns (a deletion is durable at
// once: a crash never brings a deleted chunk back into chunks/); the filler punches them empty, preallocates them again, fsyncs them and
// makes them ready (up to twice the target; extra files are unlinked). With
// PreallocChunks = 0 there is no filler: chunk files are created and
// preallocated on first write and deleted chunks are unlinked. If the pool is
// empty a file is created on demand in the same way.
//
// A crash can undo the rename that took a pool file while data written to
// the chunk afterwards survives (if the file system did not order them). So
// Open checks every ready file with SEEK_DATA and sends any file that has
// data extents (or where the check is unsupported) to recycle/.
//
// INVARIANT: a ready pool file reads as zeros over exactly its size's bytes
// and is durable; files under recycle/ may hold old data and are never
// handed out before the filler zeroed them.
//
// # Snapshot stream (version 1)
//
// WriteSnapshot writes, all integers big-endian:
//
//	header  magic "BSNP" u32 | version u32 = 1 | chunk size u64 | group u64
//	then records, each starting with a type byte:
//	  'C'   volume u64 | index u64 | chunk size u64        a chunk begins
//	  'D'   offset u64 | length u32 | length bytes          data of the current chunk
//	  'E'   chunk count u64 | crc32c u32                    the end
//
// Data records of a chunk are ascending and do not overlap; length is 1 to
// 1 MiB. Ranges without a data record are zeros: holes found with SEEK_DATA /
// SEEK_HOLE are skipped, so sparse chunks stream small. The trailer CRC
// covers every byte of the stream before the CRC field. The stream is taken
// while writes continue; each chunk is copied as it is when read. That is
// enough because every operation is an idempotent overwrite and the follower
// replays the log from an index taken before the copy began (docs/design.md §5).
// testdata/snapshot-v1.golden freezes the format.
//
// ReceiveSnapshot(index, r) writes the chunks into staging/, validating every
// record (sizes, order, bounds, duplicates) and finally the chunk count and
// CRC. On any error staging/ is removed and the live chunks are untouched. On
// success each file and the directory are fsynced and staging/ is renamed to
// staged.<index, 16 hex digits>/ (replacing a staged snapshot of the same
// index only), then the copyset directory is fsynced. Snapshots of several
// indexes can be staged at once: a follower that gets a newer snapshot
// before raft installed the older one must install each with its own data.
// DropStaged(n) removes those up to n (the caller passes its applied index:
// raft never installs them).
//
// # Installing a snapshot, and crash recovery
//
// InstallStaged(index) uses staged.<index> and nothing else (ErrNoStaged
// when it is missing). It waits for in-flight writes, then:
//
//  0. write index to the install file (writeAtomic)
//  1. rename chunks → chunks.old
//  2. rename staged.<index> → chunks
//  3. fsync the copyset directory
//  4. remove chunks.old
//
// and removes the staged snapshots below index. Open repairs a crash inside
// this sequence before it loads the copyset:
//
//   - chunks.old and chunks both exist: step 2 happened; remove chunks.old.
//   - chunks.old and the staged snapshot the install file names exist,
//     chunks does not: crashed between 1 and 2; finish by renaming it →
//     chunks, fsync, remove chunks.old.
//   - only chunks.old exists: cannot happen with this order; roll back by
//     renaming it to chunks.
//   - staged.<index> exists alone: the install had not begun; it stays for a
//     later InstallStaged(index).
//   - staged/ (an earlier version's staged snapshot, its index unknown) is
//     removed.
//
// So after a restart the copyset holds exactly the old chunks or exactly the
// new ones. The caller records the snapshot's index with SaveMeta after
// InstallStaged returns; if it stopped in between, InstallStaged(index) finds
// nothing staged after the restart and Installed() == index tells it the data
// is in place.
//
// # Concurrency
//
// All Copyset methods are safe for concurrent use. Copyset.mu (RWMutex) guards
// the chunk map: WriteAt, Discard and WriteZeroes hold it shared across their
// syscall; ReadAt, ReadAtCached, Checksum and WriteSnapshot hold it only to
// find a chunk and pin its descriptor (ReadAtCached pins only a descriptor
// already open, and reads with RWF_NOWAIT: it never waits for the disk; when
// cachestat(2) finds the whole range cached, the read is a raw system call,
// see preadNoWait); chunk creation, DeleteVolume, InstallStaged and
// RemoveCopyset hold it exclusively. Chunk files are opened FADV_RANDOM and
// O_NOATIME. Sync never takes it: it works from the
// dirty set (dirtyMu) and pins descriptors through the fd cache.
//
// A chunk's rw (RWMutex) makes reading its file exclusive with changing it:
// ReadAt holds it shared around the pread, ReadAtCached only tries it (a
// write under way sends the read to ReadAt), WriteAt, Discard and
// WriteZeroes hold it alone around the pwrite or fallocate. Without it a
// read racing a write of the same block could return half of each (Linux
// does not make a buffered pread and pwrite of one page atomic).
//
// Open chunk files live in a per-Store LRU cache bounded by
// Config.MaxOpenFiles. A descriptor in use is pinned (reference count) and
// never closed under an IO; a chunk deleted or replaced while pinned is
// closed when its last user lets go.
//
// Lock order: Store.mu → Copyset.recvMu → Copyset.syncMu / snapMu → Copyset.mu →
// Copyset.dirtyMu → fdCache.mu; pool.mu and chunk.rw are leaves.
//
// Goroutines: the pool filler (one per Store, started by Open, stopped by
// Close) owns creation and recycling of pool files. Sync runs up to three
// short-lived helpers for parallel fdatasync. Nothing else runs in the
// background.
//
// # Errors
//
// OS errors wrap ErrNoSpace (ENOSPC, EDQUOT) or ErrIO, with the operation and
// file in the message. A replica that gets either while applying must stop
// (STYLE principle 4), not skip the entry.
package datastore
