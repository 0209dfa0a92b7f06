// Package client is basalt's volume client library: it opens a volume at the MDS
// and sends its IO straight to the chunkservers that lead the volume's copysets
// (docs/design.md §3–§4, §6). Front ends (NBD, iSCSI, NVMe/TCP) use Submit; Go programs can
// use ReadAt/WriteAt/Flush/Trim/WriteZeroes/CompareAndWrite.
//
// # Session
//
// Open calls OpenVolume: the answer carries the volume (id, size), its pool (chunk
// size, copyset count), the session id, the writer epoch (0 for read-only opens),
// the lease, and the pool's copysets and chunkserver addresses. A renewer goroutine
// calls RenewSession every lease/3; each success extends the lease to (time the
// renewal was sent + lease). If renewals fail for a whole lease, the lease lapses:
// every IO, in flight or new, fails with ErrLeaseExpired and the volume never issues
// IO again (a newer writer may own the volume by now; reopen it). The MDS answering
// a renewal with FailedPrecondition (superseded by a newer writer) or any chunkserver
// answering FENCED stops the volume the same way, with api.ErrFenced; NotFound (the
// MDS forgot the session) stops it with ErrLeaseExpired.
//
// # Splitting and routing
//
// An IO [off, off+length) is checked against the volume size (past the end:
// api.ErrOutOfRange, nothing sent) and cut at chunk boundaries (and at 16 MiB when
// chunks are larger). Piece k covers chunk i = off/chunkSize and goes to copyset
// api.CopysetOf(volume, i, copysetCount) as one frame: Volume, Epoch, Offset
// (volume byte offset), Length, Copyset; write data is the payload (sent from the
// caller's buffer, no copy) and read replies land straight in the caller's buffer.
// Pieces go out in parallel; the IO completes when every piece did, with the first
// error of any piece.
//
// Each copyset has a cached leader: first the MDS's leader hint, then whoever last
// answered OK. Each chunkserver has one connection shared by all IO, dialed on
// first use by a short-lived dialer goroutine and redialed after it died (the
// transport's connection cache, keyed by chunkserver id).
//
// # Retries
//
// One attempt is one frame to one chunkserver, bounded by Config.IOTimeout (2 s by
// default, plus the piece's size at 16 MiB/s, so a paused leader stalls small IO
// for at most about that long before the next member is asked); an IO
// as a whole is bounded by Config.OpTimeout (default 60 s), after which it fails
// with ErrTimeout wrapping the last error seen.
//
//	NOT_LEADER with a hint    retry at the hint at once (at most 8 hops in a row)
//	NOT_LEADER without hint,  next member at once
//	NO_SUCH_COPYSET
//	conn error, timeout       next member after ~5 ms
//	every member failed       refresh copysets from the MDS (GetCopysets, at most one
//	                          call per 200 ms), then a new round after a backoff
//	                          doubling from 20 ms to 1 s
//	BUSY                      same member after exponential backoff with jitter
//	                          (1 ms doubling to 500 ms, uniform in [d/2, d])
//	FENCED                    final, and the volume stops
//	NO_SPACE, IO_ERROR        that member's disk is in trouble: next member after ~5 ms;
//	                          final (returned as *api.Error) once a majority of the
//	                          members answered one of them in a round (the copyset
//	                          cannot commit: its leader, if any, has no quorum)
//	OUT_OF_RANGE              like BUSY: the client checked the range, so the chunkserver
//	                          has not heard of a grow yet (it learns at its next heartbeat)
//	NO_SUCH_VOLUME, READ_ONLY, BAD_REQUEST, STALE_REQUEST
//	                          final: returned as *api.Error (errors.Is works)
//
// A retry is a new raft entry at the copyset, so a write whose first attempt
// landed (its answer lost) would be applied twice — after any newer write to
// the same block that was acknowledged in between, undoing it. So every
// write, trim and write-zeroes piece has a number in its copyset
// (Header.Seq, seq.go), the same on every attempt, and each attempt says
// which numbers are settled (Header.Settled: the lowest still outstanding).
// The copyset applies a number once, answers a repeat OK, and refuses a
// settled one (STALE_REQUEST), so an attempt given up on cannot land later
// either (internal/chunkserver's doc.go, "Retried requests").
//
// # Flush
//
// Every acknowledged write is already durable (docs/design.md §11), so Flush sends nothing:
// it completes once every write, trim and write-zeroes submitted before it
// completed (whatever their result).
//
// # Local fast path
//
// Config.Local (docs/design.md §7) is set by a front end that runs inside a chunkserver:
// an attempt whose target is Local.LocalID() is handed to Local.Go in process —
// the same request header, the same statuses and retries as over a connection,
// but no socket, no frame, no IOTimeout timer, and a read lands straight in the
// caller's buffer. Attempts to other chunkservers go over connections as usual.
//
// # Metrics
//
// Config.Metrics (NewMetrics, one per process) records basalt_client_io_seconds
// (Submit → done) and basalt_client_attempt_seconds (one attempt) per op, IO,
// bytes and errors per volume and op, retries by reason and local attempts.
//
// # Goroutines and callbacks
//
// There is no goroutine per IO. Completions and retries run on the transport's
// connection goroutines, on timers (backoff, IOTimeout) and on the dialer and
// refresher goroutines; Submit's done runs on one of them (or, for an IO refused
// before sending, before Submit returns). done must be short and must not call
// Close. Long-lived goroutines: the lease renewer (owns nothing but the lease
// deadline, an atomic) and the transport's two per connection.
//
// INVARIANT: a piece has at most one attempt outstanding; its retry state is handed
// from callback to callback, never shared. Each attempt has its own transport.Call,
// so a late IOTimeout timer can only abort a call that already finished (a no-op).
// INVARIANT: Close waits until no IO is in flight; after stop() no attempt is
// started, and closing the connections fails the attempts already sent.
package client
