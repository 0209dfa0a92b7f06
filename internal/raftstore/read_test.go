package raftstore

import (
	"errors"
	"testing"
)

func TestReadBarrier(t *testing.T) {
	c := newCluster(t, 11, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	c.net.maxDelay = 1
	l := c.waitLeader(1)
	if err := c.proposeWait(l, 1, "x=old"); err != nil {
		t.Fatal(err)
	}

	// A follower refuses, pointing at the leader.
	f := c.groups[1][0]
	if f == l {
		f = c.groups[1][1]
	}
	var ferr error
	c.hosts[f].ReadBarrier(1, func(err error) { ferr = err })
	c.step()
	var nl *NotLeaderError
	if !errors.As(ferr, &nl) || nl.Leader != l {
		t.Fatalf("follower read: %v, want NOT_LEADER hint %d", ferr, l)
	}

	// The first read confirms leadership with a quorum (ReadIndex) and starts the lease.
	calls := 0
	c.hosts[l].ReadBarrier(1, func(err error) {
		calls++
		if err != nil {
			t.Errorf("leader read: %v", err)
		}
	})
	for i := 0; calls == 0 && i < 50; i++ {
		c.step()
	}
	if calls != 1 {
		t.Fatalf("leader read answered %d times", calls)
	}
	if v, _ := c.sms[l][1].get("x"); v != "old" {
		t.Fatalf("leader state x=%q after the barrier", v)
	}

	// With the lease valid, a read needs no network round trip: cut the leader off
	// and the barrier still passes within the host's own round.
	c.net.partition([]uint64{l})
	before := c.hosts[l].Stats().LeaseReads
	var lerr error
	lcalls := 0
	c.hosts[l].ReadBarrier(1, func(err error) { lerr = err; lcalls++ })
	c.hosts[l].ProcessReady()
	if lcalls != 1 || lerr != nil {
		t.Fatalf("lease read: %d calls, err %v; want one nil answer without the network", lcalls, lerr)
	}
	if c.hosts[l].Stats().LeaseReads != before+1 {
		t.Fatalf("lease read not counted as one")
	}

	// Keep reading on the isolated old leader while the majority elects a new one
	// and writes. No read may succeed there after the new write was acknowledged:
	// the lease must have run out first.
	// Also, a follower refuses votes for ElectionTicks-1 ticks after the last
	// heartbeat it got (before the partition), so no read may succeed on the old
	// leader once that many ticks passed since the partition.
	newAcked := false
	stale, late := 0, 0
	old := l
	var oldErr error
	cutTick := c.net.now / c.tickEvery
	for i := 0; i < 400; i++ {
		issued := c.net.now / c.tickEvery
		c.hosts[old].ReadBarrier(1, func(err error) {
			if err == nil && newAcked {
				stale++
			}
			if err == nil && issued >= cutTick+9 {
				late++
			}
			if err != nil {
				oldErr = err
			}
		})
		if !newAcked {
			for _, id := range c.groups[1] {
				if id == old {
					continue
				}
				if st, _ := c.hosts[id].Status(1); st.IsLeader {
					c.hosts[id].Propose(1, propData("x=new"), func(err error) {
						if err == nil {
							newAcked = true
						}
					})
				}
			}
		}
		c.step()
		if newAcked && oldErr != nil {
			break
		}
	}
	if !newAcked {
		t.Fatal("the majority never acknowledged a write")
	}
	if late != 0 {
		t.Fatalf("%d reads on the isolated old leader succeeded after its lease must have ended", late)
	}
	if stale != 0 {
		t.Fatalf("%d reads on the isolated old leader succeeded after a newer write was acknowledged", stale)
	}
	if !errors.Is(oldErr, ErrNotLeader) {
		t.Fatalf("old leader reads: %v, want NOT_LEADER", oldErr)
	}

	// Healed, the old leader follows and reads the new value only via the new leader.
	c.net.heal()
	c.waitConverged(500)
	if v, _ := c.sms[old][1].get("x"); v != "new" {
		t.Fatalf("old leader x=%q after healing", v)
	}
}

// TestLeaseRenewal: a leader that keeps serving reads renews its lease in the
// background, so after the first ReadIndex every read is a local lease read.
func TestLeaseRenewal(t *testing.T) {
	c := newCluster(t, 13, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	l := c.waitLeader(1)
	if err := c.proposeWait(l, 1, "x=1"); err != nil {
		t.Fatal(err)
	}
	ok := 0
	var warm Stats
	for i := range 200 { // 100 ticks: ten election timeouts
		if i == 10 {
			warm = c.hosts[l].Stats() // the first ReadIndex has confirmed the lease
		}
		c.hosts[l].ReadBarrier(1, func(err error) {
			if err != nil {
				t.Errorf("read: %v", err)
			}
			ok++
		})
		c.step()
	}
	s := c.hosts[l].Stats()
	if ok != 200 || s.ReadIndexReads != warm.ReadIndexReads || s.LeaseReads-warm.LeaseReads != 190 {
		t.Fatalf("%d reads ok; after warm-up %d ReadIndex, %d lease reads; want 200, 0, 190",
			ok, s.ReadIndexReads-warm.ReadIndexReads, s.LeaseReads-warm.LeaseReads)
	}
}
