package raftstore

import (
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/latency"
)

// histBounds are the upper bounds of the latency buckets, basalt's one
// scheme (internal/latency). The last bucket catches everything above.
var histBounds = latency.Bounds()

// Histogram is a lock-free latency histogram with fixed exponential buckets. Its
// zero value is not usable; the host creates its own.
type Histogram struct {
	count  atomic.Uint64
	sumNs  atomic.Uint64
	bucket []atomic.Uint64 // len(histBounds)+1
}

func newHistogram() *Histogram {
	return &Histogram{bucket: make([]atomic.Uint64, len(histBounds)+1)}
}

// Observe records one duration.
func (h *Histogram) Observe(d time.Duration) {
	if d < 0 {
		d = 0
	}
	i := 0
	for i < len(histBounds) && d > histBounds[i] {
		i++
	}
	h.bucket[i].Add(1)
	h.count.Add(1)
	h.sumNs.Add(uint64(d))
}

// HistogramSnapshot is a copy of a Histogram at one moment. Buckets[i] counts the
// observations <= Bounds[i] and > Bounds[i-1] (not cumulative); the last
// element counts those above every bound.
type HistogramSnapshot struct {
	Count   uint64
	Sum     time.Duration
	Bounds  []time.Duration
	Buckets []uint64
}

// Mean is the average observation, 0 when empty.
func (s HistogramSnapshot) Mean() time.Duration {
	if s.Count == 0 {
		return 0
	}
	return s.Sum / time.Duration(s.Count)
}

// Quantile estimates the q-quantile (0..1) as the upper bound of the bucket holding it.
func (s HistogramSnapshot) Quantile(q float64) time.Duration {
	if s.Count == 0 {
		return 0
	}
	rank := uint64(q*float64(s.Count) + 0.5)
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, n := range s.Buckets {
		seen += n
		if seen >= rank {
			if i < len(s.Bounds) {
				return s.Bounds[i]
			}
			break
		}
	}
	return s.Bounds[len(s.Bounds)-1]
}

func (h *Histogram) snapshot() HistogramSnapshot {
	s := HistogramSnapshot{
		Count:   h.count.Load(),
		Sum:     time.Duration(h.sumNs.Load()),
		Bounds:  histBounds,
		Buckets: make([]uint64, len(h.bucket)),
	}
	for i := range h.bucket {
		s.Buckets[i] = h.bucket[i].Load()
	}
	return s
}

// Stats is what the host measured since it was created. The chunkserver exports it
// to Prometheus through its own collector; the host registers nothing globally.
type Stats struct {
	ProposeCommit HistogramSnapshot // Propose call → its entry committed and handed to Apply (leader)
	Apply         HistogramSnapshot // one StateMachine.Apply call
	LogSave       HistogramSnapshot // one LogStore.Save call (group commit of a round)
	// ReadyRounds counts scheduling rounds (one LogStore.Save at most each);
	// ReadyGroups counts group Readies handled in them. ReadyGroups/ReadyRounds is the
	// average group-commit width.
	ReadyRounds, ReadyGroups                                            uint64
	Proposals, LeaseReads, ReadIndexReads                               uint64
	SnapshotsCreated, SnapshotsSent, SnapshotsReceived, SnapshotsFailed uint64
	// MessagesDropped counts raft messages from the network refused by the
	// guard (wrong type, sender or addressee, no term, past the log).
	MessagesDropped uint64
}

type stats struct {
	proposeCommit, apply, logSave                               *Histogram
	readyRounds, readyGroups, proposals, leaseReads, indexReads atomic.Uint64
	// msgsDropped counts raft messages from the network the guard refused.
	msgsDropped                                         atomic.Uint64
	snapsCreated, snapsSent, snapsReceived, snapsFailed atomic.Uint64
}

func newStats() *stats {
	return &stats{proposeCommit: newHistogram(), apply: newHistogram(), logSave: newHistogram()}
}

// Stats returns a copy of the host's counters and latency histograms.
func (h *Host) Stats() Stats {
	s := h.stats
	return Stats{
		ProposeCommit:     s.proposeCommit.snapshot(),
		Apply:             s.apply.snapshot(),
		LogSave:           s.logSave.snapshot(),
		ReadyRounds:       s.readyRounds.Load(),
		ReadyGroups:       s.readyGroups.Load(),
		Proposals:         s.proposals.Load(),
		LeaseReads:        s.leaseReads.Load(),
		ReadIndexReads:    s.indexReads.Load(),
		SnapshotsCreated:  s.snapsCreated.Load(),
		SnapshotsSent:     s.snapsSent.Load(),
		SnapshotsReceived: s.snapsReceived.Load(),
		SnapshotsFailed:   s.snapsFailed.Load(),
		MessagesDropped:   s.msgsDropped.Load(),
	}
}
