package chunkserver

import (
	"context"
	"time"
)

// A disk whose writes hang (a stuck device, a dying controller, a lost
// path) stalls the shared WAL's fdatasync while the process, its sockets
// and its raft heartbeats stay up: the followers of a copyset led here hear
// their leader and never campaign, and no write it leads is answered (the
// leader applies an entry only once its own append is durable), so IO
// waits for ever. The watchdog notices a WAL stalled for WALStallTimeout and
// hands every leadership to a peer (handOff, as a planned stop does); while
// the stall lasts it refuses leaderships handed to it (its votes and
// appends wait for the same disk; PreVote and CheckQuorum keep it from
// being elected while its peers hear a leader) and asks again every
// stallRetry for leaderships it still holds or gained. A stall that lasts
// stallRetry more is no load spike: the disk is reported failing to the MDS
// (disk state IO_ERROR: no leaderships or new replicas for this chunkserver,
// its replicas repaired onto others if there are any). Once the WAL
// completes its writes again, all that ends.

// DefaultWALStallTimeout is Config.WALStallTimeout's default.
const DefaultWALStallTimeout = 3 * time.Second

// stallRetry is the pause between two hand-offs of one leadership while the
// WAL stays stalled (and between two reminders in the log), and how long a
// stall lasts past the timeout before the MDS hears of it.
const stallRetry = 10 * time.Second

// stallPoll is the longest pause between two looks at the WAL.
const stallPoll = 250 * time.Millisecond

// watchStall runs the WAL stall watchdog until ctx is done.
func (c *ChunkServer) watchStall(ctx context.Context) {
	timeout := c.cfg.WALStallTimeout
	if timeout == 0 {
		timeout = DefaultWALStallTimeout
	}
	if timeout < 0 {
		return
	}
	t := time.NewTicker(max(min(stallPoll, timeout/2), time.Millisecond))
	defer t.Stop()
	var (
		began    time.Time // when the stall began (zero: none)
		reminded time.Time // when the last "still stalled" was logged
		h        *handOffs
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d := c.wal.Stalled()
		if d < timeout {
			if !began.IsZero() {
				c.walStalled.Store(false)
				c.host.SetDraining(false)
				c.log.Warn("WAL writes complete again after a stall; this chunkserver takes leaderships again",
					"stalled_for", time.Since(began).Round(time.Millisecond))
				began = time.Time{}
			}
			continue
		}
		if began.IsZero() {
			began, reminded, h = time.Now().Add(-d), time.Now(), newHandOffs(stallRetry)
			c.host.SetDraining(true)
			led, _ := c.handOff(h)
			c.log.Error("WAL stalled: the disk has not completed a write or fdatasync for longer than --wal-stall-timeout; "+
				"handing every leadership to a peer. Check the disk of this chunkserver's data directory "+
				"(kernel log, device health, latency)",
				"stalled_for", d.Round(time.Millisecond), "timeout", timeout, "leading", led, "data_dir", c.cfg.DataDir)
			continue
		}
		led, _ := c.handOff(h)
		if time.Since(reminded) >= stallRetry {
			reminded = time.Now()
			c.walStalled.Store(true)
			c.log.Error("WAL still stalled; reporting the disk as failing to the MDS (its replicas move to other "+
				"chunkservers if there are any): check the disk of this chunkserver's data directory",
				"stalled_for", time.Since(began).Round(time.Millisecond), "still_leading", led, "data_dir", c.cfg.DataDir)
		}
	}
}
