// Package scrub compares the replicas of copysets: `basalt check` runs it
// once over a whole cluster after an incident, and a chunkserver runs a
// Scrubber that slowly and repeatedly does the same for the copysets it leads.
//
// # What is compared
//
// Every replica of a copyset answers OpChecksum (internal/chunkserver doc.go)
// with the crc32c of each of its chunks, sorted, leaving out chunks that read
// as all zeros. Two replicas agree on a chunk when both list it with the same
// CRC or neither lists it; a chunk listed by one and not another differs
// ("zeros" in reports). For a difference, Difference.Differ names the members
// whose content no strict majority shares — with three replicas and one bad
// disk that is the bad one; with two, or three different contents, it is every
// member, because there is nothing to break the tie.
//
// # Why differences are re-checked: writes in flight
//
// Replicas legitimately differ for a moment. A write commits when a majority
// has it in its log; the leader applies it and answers, followers apply it
// when they learn of the commit, a few milliseconds later, and a follower that
// was restarted or slow may trail by more. OpChecksum carries no applied index
// and is not a snapshot: a replica checksums its chunks one after another
// while applies go on, so on a busy copyset two replicas read the same chunk
// at different moments. Comparing one round would raise false alarms on every
// busy volume. So Checker.Check does:
//
//  1. Round 0: ask every member at once; the chunks present anywhere are the
//     chunks compared; collect those that differ.
//  2. Re-checks (Config.Rechecks, default 4, after 250 ms, 500 ms, 1 s, 2 s):
//     ask again and judge only the chunks that still differed. A chunk whose
//     replicas agree once is cleared for good: it was a write in flight.
//     Chunks that agreed in round 0 are never re-judged, so a write landing
//     during the re-checks cannot create a new alarm.
//  3. A chunk that differed in every round is a Mismatch only if every
//     replica's CRC was the same in the last two rounds: the chunk was quiet
//     for seconds and its replicas still disagree, which no in-flight write
//     explains. If some CRC changed between the last two rounds the chunk is
//     being written, and it is reported as Unsettled — not judged, not an
//     alarm; the background scrub looks at it again next pass, `basalt check`
//     counts it as not checked (re-run when the volume is quiet). A chunk
//     that is written without pause is never judged this way; the
//     applied-index change below would judge it.
//  4. A replica that cannot be asked (ErrUnreachable) is reported and left
//     out; if one drops out during the re-checks, what was pending is
//     Unsettled (fewer replicas cannot judge it).
//
// The residual false alarm is a follower that stays seconds behind on a chunk
// that is no longer written. The Scrubber avoids it by scrubbing only copysets
// whose voters' logs are within MaxFollowerLag entries of the commit index and
// that have no learner (LeaderTargets); `basalt check` is meant to be run on a
// healthy cluster and names both CRCs, so a lagging replica is easy to re-check.
// The opposite error — missing a real difference — needs the corrupted chunk
// to agree with the others in some round, which a chunk that differs on disk
// only does if a write overwrote the damaged range (and then it is repaired).
//
// # What OpChecksum would need (chunkserver changes, proposed, not made here)
//
// Two limits of today's op, and the change that removes each:
//
//   - Exactness. The reply could carry the replica's applied index when its
//     scan began and when it ended (reply Header.Hint and Header.Offset, unused
//     in an OK reply of this op). A round then counts as evidence only when all
//     replicas report begin == end == the same index: nothing was applied while
//     any of them read, so all CRCs describe the same log position and any
//     difference is real. A replica whose end is below another's begin is
//     trailing: ask it again, never report it. (Alternatively, CockroachDB's
//     way: propose a checksum command through Raft so every replica computes
//     it at the same log position — exact, but it needs a state-machine
//     command and blocks that copyset's apply while the chunks are read.)
//   - Cost and burstiness. A request reads the whole copyset at full disk
//     speed; the token bucket only spaces requests out, so the average is
//     bounded but a large copyset is read in one burst, and a re-check of one
//     chunk re-reads everything. Two request modes would fix it: list only
//     (a flag bit: the chunk keys from a readdir, no reads) and a subset
//     (payload uint32 n, n × (uint64 volume, uint64 index): checksum exactly
//     these). The checker would list every member, walk the union of keys in
//     batches of at most the bucket's burst, and re-check a differing chunk
//     with a request for that chunk alone — milliseconds, so it rarely
//     straddles an apply either.
//
// # Rate limiting
//
// A replica reads every chunk file of the copyset to answer OpChecksum, so a
// check costs about chunks × chunk size bytes of disk reads on every member.
// Limiter is a token bucket in bytes per second of that chunk data, summed
// over every replica asked. The true cost is known only from the reply, so
// the bucket may go into debt: before a round the Checker takes an estimate
// (the chunk count listed last time, at least one chunk, × chunk size ×
// members), afterwards it charges the difference, and the next Wait pays the
// debt first. A re-check round costs a whole copyset again, so a persistent
// mismatch makes its copyset cost 1+Rechecks times more — bounded by the same
// bucket.
//
// For the background scrub the bytes are summed over the members, not only
// the leader's disk: each chunkserver leads about a third of the copysets it
// holds and is a follower in the rest, so with leaders balanced every disk
// reads about BytesPerSec for scrubbing (default 16 MiB/s), whoever asks.
//
// # Background scrub
//
// A Scrubber walks its targets one copyset at a time in (pool, copyset)
// order, pausing Interval (default 5 s) after each, and starts a pass at most
// every PassInterval (default 1 h). It re-reads its target list before each
// copyset, so leadership moving during a pass is followed. Mismatches are
// logged at Warn with pool, copyset, group, volume and chunk ids and every
// replica's CRC; Stats holds cumulative counts for metrics.
//
// # Wire
//
// The reply is decoded here (DecodeChecksums), the one decoder of the format
// the chunkserver's doc.go specifies.
//
// # Goroutines
//
// Checker.Check runs on its caller's goroutine and starts one goroutine per
// member for each round. Scrubber.Run owns its walk. A Dialer keeps one
// transport.Conn per address in a transport.ConnCache.
package scrub
