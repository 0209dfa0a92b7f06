package wal

import "time"

// Stats are the WAL's counters since Open. They are plain values for the
// host to export (the WAL registers no metrics itself).
type Stats struct {
	Saves            uint64        // Save, CreateSnapshot and RemoveGroup calls made durable
	Syncs            uint64        // batches written, one fdatasync each
	UnsyncedWrites   uint64        // batches of NoSync updates only, written without fdatasync
	Entries          uint64        // entries appended
	Bytes            uint64        // record bytes written (checkpoints excluded)
	MaxBatchSaves    int           // the most calls that shared one fdatasync
	SyncTime         time.Duration // total time in fdatasync (SyncDelay included)
	MaxSyncTime      time.Duration // the slowest fdatasync
	Rollovers        uint64        // segments created after Open
	PreparedSegments uint64        // of those, made from a file prepared in the background
	RecycledSegments uint64        // spare files made from a removed segment's file (no zero-fill)
	SegmentsRemoved  uint64        // segments deleted after compaction
	Segments         int           // segment files now
	CachedBytes      int           // entry data held in the per-group caches now
}

// MeanBatchSaves is the average number of calls that shared one fdatasync.
func (s Stats) MeanBatchSaves() float64 {
	if s.Syncs == 0 {
		return 0
	}
	return float64(s.Saves) / float64(s.Syncs)
}

// MeanSyncTime is the average fdatasync latency.
func (s Stats) MeanSyncTime() time.Duration {
	if s.Syncs == 0 {
		return 0
	}
	return s.SyncTime / time.Duration(s.Syncs)
}

// Stats returns a snapshot of the counters.
func (w *WAL) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.stats
	st.Segments = len(w.segs)
	for _, g := range w.groups {
		st.CachedBytes += g.cacheBytes
	}
	return st
}
