// Package api holds basalt's public wire definitions, everything a client in any
// language needs to talk to a basalt cluster:
//
//   - the control-plane gRPC service of the MDS (mds.proto, with the generated
//     code committed; regenerate with scripts/generate);
//   - the data-plane frame (Header, its Op and Flags) and the numeric status
//     codes of its replies (Status, and Error for Go callers);
//   - the routing rule that says which copyset holds a chunk (CopysetOf) and a
//     copyset's Raft group id (GroupID).
//
// The Go implementation of the data plane (pipelined connections, the server
// loop) is internal/transport; the client library is pkg/client.
//
// # Frame format
//
// A frame is a fixed 80-byte header followed by PayloadLen bytes of payload. All
// integers are big-endian:
//
//	offset size  field
//	 0     4     Magic       0x42534c54 ("BSLT")
//	 4     1     Version     2
//	 5     1     Op          1 read, 2 write, 3 trim, 4 write-zeroes, 5 flush, 6 ping,
//	                         7 checksum, 8 fence, 16 raft (one-way), 17 snapshot (peer traffic)
//	 6     2     Flags       bit 0 FUA, bit 15 reply
//	 8     8     ID          chosen by the sender of a request, echoed by its reply
//	16     4     Status      reply status (Status); 0 in requests
//	20     4     PayloadLen  bytes after the header, at most MaxPayload (64 MiB)
//	24     8     Volume      volume id
//	32     8     Epoch       writer epoch of the session (0 = read-only)
//	40     8     Offset      byte offset in the volume
//	48     4     Length      byte count of the IO
//	52     4     Copyset     copyset id within the volume's pool
//	56     8     Hint        NOT_LEADER: leader's chunkserver id; OpRaft: sender's id
//	64     8     Seq         write, trim, write-zeroes: the writer's request number in
//	                         the copyset, the same on every retry (0: not numbered)
//	72     8     Settled     with Seq: the writer sends no request below it again
//
// Seq and Settled make a retried request apply once: a copyset applies each
// number of a writer session (volume, epoch) at most once, answers a repeat
// OK without applying it, and refuses a number below the highest Settled it
// has seen with STALE_REQUEST (internal/chunkserver's doc.go, "Retried
// requests").
//
// Payloads: a write carries Length bytes of data; the reply to a read carries
// Length bytes; the other IO ops carry none. Peer traffic (OpRaft, OpSnapshot)
// has payloads and uses Volume, Offset and Length as internal/raftnet
// specifies. OpFence carries no payload and uses Volume, Epoch and Copyset:
// a new writer raises its volume's epoch in that copyset (its Open fences
// every copyset of the pool before it returns). OpAttach carries the session's
// capability for Volume (internal/capability's token) and is answered OK or
// DENIED; on an authenticated connection a chunkserver serves a volume's IO
// only under a valid capability attached to that connection, at an epoch no
// higher than the signed one. OpMapped reads like OpRead (on the leader, after
// its read barrier; a read-only session may) and its reply carries
// MappedBytes(Length) bytes: a bit per MapGranule of the range, set where the
// chunk file holds data (SEEK_DATA); Offset and Length are multiples of
// MapAlign. OpCompareAndWrite carries 2×Length bytes (Length ≤
// MaxCompareAndWrite): those to compare, then those to write; it needs the
// writer's epoch and capability like a write, is numbered like one (Seq), and
// is answered OK (written) or MISCOMPARE with Hint = the offset of the first
// differing byte within the range (nothing written): the copyset's leader
// compares and logs a plain write (internal/chunkserver's caw.go). A request
// for one IO never crosses a chunk boundary (the client splits; a
// compare-and-write is never split: the client refuses one that would be). A reply repeats its request's header with FlagReply set, Status (and
// Hint) filled in and its own PayloadLen. The encoding is frozen by
// testdata/*.golden (TestHeaderGolden): changing it is a new Version.
//
// Op is basalt's one operation enum: the block IO ops 1–5 are also what
// client.Volume.Submit and every front end's backend take (Submit takes
// OpMapped and OpCompareAndWrite too; a backend that can answers them as
// frontend.Mapper and frontend.CompareAndWriter).
//
// # Routing (docs/design.md §2)
//
// Chunk i of volume v lives in copyset (VolumeHash(v) + i) mod copysetCount of
// the volume's pool (CopysetOf). VolumeHash is FNV-1a 64 over the eight
// big-endian bytes of the volume id. The client computes the route, the
// chunkserver checks it (a frame whose Copyset does not match is refused), the
// MDS stores no per-chunk map.
//
// INVARIANT: VolumeHash and CopysetOf never change (TestRouteGolden); changing
// either would move every chunk of every volume.
//
// A copyset's Raft group id is pool<<32 | copyset (GroupID, SplitGroupID).
package api
