package chunkserver

import (
	"slices"

	"github.com/basalt-storage/basalt/pkg/api"
)

// maxUnsettled bounds the request numbers a copyset remembers of one writer
// above its settled mark. A writer keeps about its queue depth unsettled; when
// one request stays unanswered while more than this many newer ones to the
// same copyset were applied, the oldest are forgotten (settled by the
// copyset): a retry of them is refused STALE_REQUEST, never applied.
const maxUnsettled = 4096

// seqWindow is what a copyset remembers of the numbered requests (write,
// trim, write-zeroes) of a volume's current writer, one epoch: a request
// is applied at most once, and never once the writer settled it. Without it a
// retry — a new raft entry, sent because the answer to the first attempt was
// lost — was applied again after newer writes to the same block had been
// acknowledged, and undid them.
//
// INVARIANT: applied is sorted, its numbers are at least settled, and it
// holds at most maxUnsettled of them.
type seqWindow struct {
	settled uint64   // every number below it is settled: refused if it comes again
	applied []uint64 // numbers at or above settled applied already
}

// admit decides a numbered command: true if it is to be applied now (its
// number is recorded); false with nil if it was applied before (a retry: the
// effect is there, the answer is OK), or with api.ErrStaleRequest if it was
// settled. Every replica decides alike: it runs in Apply, in log order.
func (w *seqWindow) admit(seq, settled uint64) (bool, error) {
	if settled > w.settled {
		w.settle(settled)
	}
	if seq < w.settled {
		return false, api.ErrStaleRequest
	}
	i, found := slices.BinarySearch(w.applied, seq)
	if found {
		return false, nil
	}
	w.applied = slices.Insert(w.applied, i, seq)
	if len(w.applied) > maxUnsettled {
		w.settle(w.applied[0] + 1)
	}
	return true, nil
}

// settle forgets the numbers below s.
func (w *seqWindow) settle(s uint64) {
	i, _ := slices.BinarySearch(w.applied, s)
	w.applied = append(w.applied[:0], w.applied[i:]...)
	w.settled = s
}
