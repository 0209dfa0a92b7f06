package raftnet

import (
	"context"

	"golang.org/x/time/rate"
)

// DefaultSnapshotRate bounds a chunkserver's snapshot traffic — bytes of
// InstallSnapshot streams sent plus received — so that rebuilding and
// rebalancing copysets leaves the disk and the network to foreground IO.
const DefaultSnapshotRate = 64 << 20 // bytes per second

// newSnapshotLimiter returns the token bucket shared by every snapshot
// stream of this chunkserver, in and out: bytesPerSec, with a burst of one
// data frame. bytesPerSec < 0 means no limit (nil).
func newSnapshotLimiter(bytesPerSec int64) *rate.Limiter {
	if bytesPerSec < 0 {
		return nil
	}
	if bytesPerSec == 0 {
		bytesPerSec = DefaultSnapshotRate
	}
	return rate.NewLimiter(rate.Limit(bytesPerSec), snapFrameSize)
}

// waitSnapshot blocks until n more bytes of snapshot traffic fit the
// limit l (nil: at once), or ctx ends.
func waitSnapshot(ctx context.Context, l *rate.Limiter, n int) error {
	if l == nil {
		return nil
	}
	for n > 0 {
		k := min(n, l.Burst())
		if err := l.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
