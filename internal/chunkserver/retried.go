package chunkserver

import (
	"slices"
	"sort"

	"github.com/basalt-storage/basalt/pkg/api"
)

// maxSeqRanges bounds the ranges of applied numbers a copyset keeps per writer
// above its settled mark. Numbers applied one after another form one range,
// so the count grows only with gaps: numbers still outstanding at the writer
// (about its queue depth) or given up without being applied. When more than
// this many gaps are open at once, the oldest range is settled by the copyset:
// a retry of a number at or below it is refused STALE_REQUEST, never applied.
const maxSeqRanges = 4096

// seqRange is the numbers lo..hi, both included.
type seqRange struct{ lo, hi uint64 }

// seqWindow is what a copyset remembers of the numbered requests (write,
// trim, write-zeroes) of a volume's current writer, one epoch: a request
// is applied at most once, and never once the writer settled it. Without it a
// retry — a new raft entry, sent because the answer to the first attempt was
// lost — was applied again after newer writes to the same block had been
// acknowledged, and undid them.
//
// INVARIANT: applied is sorted, its ranges are disjoint and not adjacent
// (one ends at least two below the next's start), every number in them is at
// least settled, and there are at most maxSeqRanges of them.
type seqWindow struct {
	settled uint64     // every number below it is settled: refused if it comes again
	applied []seqRange // numbers at or above settled applied already
}

// admit decides a numbered command (seq > 0): true if it is to be applied
// now (its number is recorded); false with nil if it was applied before (a
// retry: the effect is there, the answer is OK), or with api.ErrStaleRequest
// if it was settled. Every replica decides alike: it runs in Apply, in log
// order.
func (w *seqWindow) admit(seq, settled uint64) (bool, error) {
	if settled > w.settled {
		w.settle(settled)
	}
	if seq < w.settled {
		return false, api.ErrStaleRequest
	}
	i := sort.Search(len(w.applied), func(i int) bool { return w.applied[i].hi >= seq })
	if i < len(w.applied) && w.applied[i].lo <= seq {
		return false, nil
	}
	left := i > 0 && w.applied[i-1].hi == seq-1
	right := i < len(w.applied) && w.applied[i].lo == seq+1
	switch {
	case left && right:
		w.applied[i-1].hi = w.applied[i].hi
		w.applied = slices.Delete(w.applied, i, i+1)
	case left:
		w.applied[i-1].hi = seq
	case right:
		w.applied[i].lo = seq
	default:
		w.applied = slices.Insert(w.applied, i, seqRange{seq, seq})
	}
	if len(w.applied) > maxSeqRanges {
		w.settle(w.applied[0].hi + 1)
	}
	return true, nil
}

// has reports whether seq, at or above settled, was applied.
func (w *seqWindow) has(seq uint64) bool {
	i := sort.Search(len(w.applied), func(i int) bool { return w.applied[i].hi >= seq })
	return i < len(w.applied) && w.applied[i].lo <= seq
}

// settle forgets the numbers below s.
func (w *seqWindow) settle(s uint64) {
	i := sort.Search(len(w.applied), func(i int) bool { return w.applied[i].hi >= s })
	w.applied = append(w.applied[:0], w.applied[i:]...)
	if len(w.applied) > 0 && w.applied[0].lo < s {
		w.applied[0].lo = s
	}
	w.settled = s
}
