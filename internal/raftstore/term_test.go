package raftstore

import (
	"errors"
	"testing"
)

// TestProposeInTerm: a barrier tells the term it held in, a proposal in that
// term lands, and one made for a term the group has left is refused — even
// when the same node leads again in a later term (another leader may have
// written in between).
func TestProposeInTerm(t *testing.T) {
	c := newCluster(t, 21, 3, map[uint64][]uint64{1: {1, 2, 3}}, nil)
	defer c.stop()
	l := c.waitLeader(1)
	if err := c.proposeWait(l, 1, "x=0"); err != nil {
		t.Fatal(err)
	}
	barrier := func(id uint64) (uint64, error) {
		t.Helper()
		var term uint64
		var res error
		calls := 0
		c.hosts[id].ReadBarrierTerm(1, func(tm uint64, err error) { term, res = tm, err; calls++ })
		for i := 0; calls == 0; i++ {
			if i > 2000 {
				t.Fatal("barrier never answered")
			}
			c.step()
		}
		if calls != 1 {
			t.Fatalf("barrier answered %d times", calls)
		}
		return term, res
	}
	proposeIn := func(id, term uint64, data string) error {
		t.Helper()
		var res error
		calls := 0
		c.hosts[id].ProposeInTerm(1, propData(data), term, func(err error) { res = err; calls++ })
		for i := 0; calls == 0; i++ {
			if i > 2000 {
				t.Fatal("proposal never answered")
			}
			c.step()
		}
		return res
	}

	t1, err := barrier(l)
	if st, _ := c.hosts[l].Status(1); err != nil || t1 != st.Term {
		t.Fatalf("barrier on the leader: term %d, %v; want the leader's term %d", t1, err, st.Term)
	}
	// Warm: a second barrier goes through the lease (maybe the fast path);
	// it tells the same term.
	if t1b, err := barrier(l); err != nil || t1b != t1 {
		t.Fatalf("second barrier: term %d, %v; want %d", t1b, err, t1)
	}
	if err := proposeIn(l, t1, "x=1"); err != nil {
		t.Fatalf("proposal in the barrier's term: %v", err)
	}
	if v, _ := c.sms[l][1].get("x"); v != "1" {
		t.Fatalf("x=%q after the proposal in term", v)
	}

	// A follower's barrier fails, with no term.
	f := c.groups[1][0]
	if f == l {
		f = c.groups[1][1]
	}
	if tm, err := barrier(f); !errors.Is(err, ErrNotLeader) || tm != 0 {
		t.Fatalf("follower barrier: term %d, %v; want 0 and NOT_LEADER", tm, err)
	}

	// Leadership goes to f and comes back to l: l leads again, in a later term.
	for _, to := range []uint64{f, l} {
		from := c.leader(1)
		c.hosts[from].TransferLeader(1, to)
		for i := 0; c.leader(1) != to; i++ {
			if i > 2000 {
				t.Fatalf("leadership never moved to %d", to)
			}
			c.step()
		}
	}
	st, _ := c.hosts[l].Status(1)
	if st.Term <= t1 {
		t.Fatalf("term %d after two transfers, want above %d", st.Term, t1)
	}
	var nl *NotLeaderError
	if err := proposeIn(l, t1, "x=stale"); !errors.As(err, &nl) {
		t.Fatalf("proposal for term %d in term %d: %v, want NOT_LEADER", t1, st.Term, err)
	}
	c.run(20)
	if v, _ := c.sms[l][1].get("x"); v != "1" {
		t.Fatalf("x=%q: the proposal for a term left behind was applied", v)
	}
	t3, err := barrier(l)
	if err != nil || t3 != st.Term {
		t.Fatalf("barrier after the transfers: term %d, %v; want %d", t3, err, st.Term)
	}
	if err := proposeIn(l, t3, "x=3"); err != nil {
		t.Fatalf("proposal in the new term: %v", err)
	}
	c.waitConverged(500)
	if v, _ := c.sms[l][1].get("x"); v != "3" {
		t.Fatalf("x=%q, want 3", v)
	}
}
