package chunkserver

import (
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// compareAndWrite serves OpCompareAndWrite (validated) on the copyset's
// leader: the write happens only if [Offset, Offset+Length) holds the
// request's compare bytes, atomically with respect to every other IO of the
// volume, whichever access node sends it. The leader decides; the log gets
// a plain write:
//
//  1. Gate: the range is held exclusively in the replica's write gate
//     (gate.go): the writes this node has in flight over it finish first,
//     and overlapping writes (and compare-and-writes) arriving meanwhile
//     wait until this one is done.
//  2. Read barrier with its term (raftstore.Host.ReadBarrierTerm): this node
//     leads in term T and applied every entry committed before. A leader's
//     barrier implies it committed an entry of T, so every entry of an
//     earlier term that will ever commit is applied already; the entries
//     of T are this node's, and the gate holds back the overlapping ones.
//  3. The retried-request table: a retry (same Seq) of a compare-and-write
//     whose write was applied is answered OK, not compared again (its own
//     write would miscompare it). Checked after 1 and 2, so a first attempt
//     still in flight here has finished and one committed elsewhere is
//     applied.
//  4. Read the range from the chunk file and compare. Different: nothing is
//     proposed; the answer is MISCOMPARE, Hint the offset of the first
//     differing byte.
//  5. Equal: propose the write part as a plain cmdWrite (same Seq) through
//     raftstore.Host.ProposeInTerm(T): refused NOT_LEADER if the group left
//     T — leadership moved, and perhaps came back, and another leader's
//     entries may sit between the read and this write. The client retries;
//     the retry compares again (or finds its write applied, 3).
//
// Why not compare when applying, on every replica: a replica that restarts
// replays entries whose later effects are already in its chunk files (apply
// does not fsync; the log is replayed from the last snapshot), so a
// replayed compare could decide differently than the first time and the
// replicas would diverge. A plain write replays to the same bytes.
//
// The gate covers only this node's proposals: those of other leaders are
// excluded by the term (5), and a follower proposes nothing. Reads do not
// take the gate: a read sees the write wholly applied or not, as for a
// plain write.
func (hd *handler) compareAndWrite(rw transport.ReplyWriter, h api.Header, r *replica, payload []byte, start time.Time) {
	// The payload is not ours after return: keep both halves.
	payload = slices.Clone(payload)
	cmp, data := payload[:h.Length], payload[h.Length:]
	id, w := r.gate.enter(gateSpan{h.Volume, h.Offset, h.Offset + uint64(h.Length)}, true)
	run := func() {
		hd.host.ReadBarrierTerm(r.group, func(term uint64, err error) {
			if err != nil {
				r.gate.leave(id)
				hd.replyErr(rw, h, err, start)
				return
			}
			// Reading the chunk file may wait for the disk: off the raft
			// worker the barrier answers on.
			go hd.compareNow(rw, h, r, cmp, data, id, term, start)
		})
	}
	if w != nil {
		r.gate.then(w, run)
		return
	}
	run()
}

// compareNow is steps 3 to 5 of compareAndWrite, with the range held in the
// gate as entry id and the barrier granted in term.
func (hd *handler) compareNow(rw transport.ReplyWriter, h api.Header, r *replica, cmp, data []byte, id, term uint64, start time.Time) {
	applied, err := r.sm.numbered(h.Volume, h.Epoch, h.Seq)
	if err != nil || applied {
		r.gate.leave(id)
		if applied {
			hd.log.Info("retried compare-and-write not compared again: its write was applied", "copyset", r.group,
				"volume", h.Volume, "epoch", h.Epoch, "seq", h.Seq, "offset", h.Offset)
		}
		hd.replyErr(rw, h, err, start)
		return
	}
	cur := make([]byte, h.Length)
	cid := chunkID{Volume: h.Volume, Index: h.Offset / uint64(r.chunkSize)}
	if err := r.store.ReadAt(cid, cur, int64(h.Offset%uint64(r.chunkSize))); err != nil {
		r.gate.leave(id)
		hd.log.Warn("compare-and-write: read failed", "copyset", r.group, "volume", h.Volume, "offset", h.Offset, "err", err)
		hd.replyErr(rw, h, err, start)
		return
	}
	if i := firstDiff(cur, cmp); i >= 0 {
		r.gate.leave(id)
		hd.reply(rw, h, api.StatusMiscompare, uint64(i))
		return
	}
	c := command{Op: cmdWrite, Volume: h.Volume, Epoch: h.Epoch, Offset: h.Offset, Length: h.Length,
		Seq: h.Seq, Settled: h.Settled, Data: data}
	proposeInTerm(hd.host, r.group, c, term, func(err error) {
		r.gate.leave(id)
		hd.replyErr(rw, h, err, start)
	})
}

// firstDiff is the index of the first byte where a and b (equal lengths)
// differ, or -1.
func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
