package chunkserver

import (
	"time"

	"github.com/basalt-storage/basalt/internal/raftstore"
)

// A planned stop (SIGTERM: a rolling restart, an upgrade) hands leaderships
// away before the process goes, so that no copyset waits an election timeout
// for a new leader: a raft leadership transfer to a caught-up follower takes
// one round trip and the client follows the NOT_LEADER hint at once.

// drainRetry is how long a transfer is given before it is asked again,
// perhaps to another peer (raft aborts a transfer after an election timeout).
const drainRetry = 1500 * time.Millisecond

// drainPoll is the pause between two looks at which copysets are still led.
const drainPoll = 20 * time.Millisecond

// drainLeaders transfers the leadership of every copyset this chunkserver leads
// to a caught-up peer and waits until it leads none, or DrainTimeout passed;
// it logs how many it still leads (still_leading). IO keeps being served
// meanwhile: a request to a copyset no longer led here gets NOT_LEADER with the
// new leader as hint. Copysets with no other voter cannot move and are not
// waited for. It runs on Run's goroutine after the heartbeat loop ended, so no
// MDS request to transfer or reconfigure interferes; the host refuses
// leaderships handed to it meanwhile (raftstore.Host.SetDraining).
func (c *ChunkServer) drainLeaders() {
	timeout := c.cfg.DrainTimeout
	if timeout == 0 {
		timeout = DefaultDrainTimeout
	}
	if timeout < 0 || c.host == nil {
		return
	}
	c.host.SetDraining(true)
	start := time.Now()
	deadline := start.Add(timeout)
	h := newHandOffs(drainRetry)
	led, alone := 0, 0
	for first := true; ; first = false {
		led, alone = c.handOff(h)
		if first {
			c.log.Info("stopping: handing leaderships to peers", "leading", led, "timeout", timeout)
		}
		if led == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(drainPoll)
	}
	c.log.Info("stopping: leaderships handed over", "still_leading", led, "single_replica", alone,
		"took", time.Since(start).Round(time.Millisecond))
}

// handOffs is the state of one hand-off of every leadership (a planned stop,
// a stalled WAL) over its passes (handOff).
type handOffs struct {
	retry time.Duration        // the least time between two transfers of one copyset
	asked map[uint64]time.Time // copyset → when its transfer was last asked
	given map[uint64]int       // peer → leaderships handed to it (to spread them)
}

func newHandOffs(retry time.Duration) *handOffs {
	return &handOffs{retry: retry, asked: make(map[uint64]time.Time), given: make(map[uint64]int)}
}

// handOff is one pass of a hand-off: it asks every copyset this chunkserver
// leads to transfer its leadership to a caught-up peer (transferTarget),
// unless that was asked less than h.retry ago (raft aborts a transfer after
// an election timeout; the next pass asks again, perhaps another peer). It
// returns how many copysets it leads that have another voter (led) and how
// many have none and cannot move (alone).
func (c *ChunkServer) handOff(h *handOffs) (led, alone int) {
	for _, g := range c.host.Groups() {
		if !g.IsLeader {
			continue
		}
		if len(g.Voters) <= 1 {
			alone++ // nowhere to go
			continue
		}
		led++
		if at, ok := h.asked[g.ID]; ok && time.Since(at) < h.retry {
			continue
		}
		to := transferTarget(g, c.ID(), h.given)
		if to == 0 {
			continue // no peer alive now; ask again on the next pass
		}
		h.asked[g.ID] = time.Now()
		h.given[to]++
		c.host.TransferLeader(g.ID, to)
	}
	return led, alone
}

// transferTarget picks the peer to hand g's leadership to: among the voters
// (not self) the leader heard from lately, the one furthest along the log —
// caught up, when any is — and, among equals, the one given the fewest
// leaderships so far. 0: there is none.
func transferTarget(g raftstore.GroupStatus, self uint64, given map[uint64]int) uint64 {
	var best, bestMatch uint64
	for _, id := range g.Voters {
		if id == self || !g.Active[id] {
			continue
		}
		m := g.Progress[id]
		if best == 0 || m > bestMatch || (m == bestMatch && given[id] < given[best]) {
			best, bestMatch = id, m
		}
	}
	return best
}
