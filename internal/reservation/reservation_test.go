package reservation

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

var (
	i1 = Nexus{Initiator: "iqn.a,i,0x01", TargetPort: 1}
	i2 = Nexus{Initiator: "iqn.b,i,0x02", TargetPort: 1}
	i3 = Nexus{Initiator: "iqn.c,i,0x03", TargetPort: 1}
	// i1 through another target port (another access node).
	i1b = Nexus{Initiator: "iqn.a,i,0x01", TargetPort: 2}
)

type step struct {
	from Nexus
	a    Action
	code Code // 0: success
}

func reg(k uint64) Action { return Action{ServiceAction: RegisterAndIgnore, SAKey: k} }

// run applies steps in order, failing on an unexpected outcome.
func run(t *testing.T, steps ...step) *State {
	t.Helper()
	var s *State
	for i, st := range steps {
		n, err := Apply(s, st.from, st.a)
		switch {
		case st.code == 0 && err != nil:
			t.Fatalf("step %d (%+v from %s): %v", i, st.a, st.from.Initiator, err)
		case st.code != 0 && (err == nil || AsError(err).Code != st.code):
			t.Fatalf("step %d (%+v from %s): got %v, want code %d", i, st.a, st.from.Initiator, err, st.code)
		}
		if err == nil {
			s = n
		}
	}
	if s == nil {
		s = &State{}
	}
	return s
}

func keys(s *State) []uint64 {
	var k []uint64
	for _, r := range s.Registrations {
		k = append(k, r.Key)
	}
	return k
}

func TestRegister(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		keys  []uint64
		gen   uint32
	}{
		{"register", []step{{i1, Action{ServiceAction: Register, SAKey: 7}, 0}}, []uint64{7}, 1},
		{"register with a key while unregistered", []step{{i1, Action{ServiceAction: Register, Key: 3, SAKey: 7}, CodeConflict}}, nil, 0},
		{"register zero while unregistered: no-op", []step{{i1, Action{ServiceAction: Register}, 0}}, nil, 0},
		{"change key", []step{{i1, reg(7), 0}, {i1, Action{ServiceAction: Register, Key: 7, SAKey: 8}, 0}}, []uint64{8}, 2},
		{"change key with the wrong key", []step{{i1, reg(7), 0}, {i1, Action{ServiceAction: Register, Key: 6, SAKey: 8}, CodeConflict}}, []uint64{7}, 1},
		{"ignore existing key", []step{{i1, reg(7), 0}, {i1, Action{ServiceAction: RegisterAndIgnore, Key: 99, SAKey: 8}, 0}}, []uint64{8}, 2},
		{"unregister", []step{{i1, reg(7), 0}, {i2, reg(9), 0}, {i1, Action{ServiceAction: Register, Key: 7}, 0}}, []uint64{9}, 3},
		{"two nexuses one key", []step{{i1, reg(7), 0}, {i2, reg(7), 0}}, []uint64{7, 7}, 2},
		{"same initiator, other target port", []step{{i1, reg(7), 0}, {i1b, reg(8), 0}}, []uint64{7, 8}, 2},
		{"spec_i_pt refused", []step{{i1, Action{ServiceAction: RegisterAndIgnore, SAKey: 1, SpecIPT: true}, CodeInvalidParam}}, nil, 0},
		{"register and move refused", []step{{i1, reg(7), 0}, {i1, Action{ServiceAction: RegisterAndMove, Key: 7}, CodeInvalidCDB}}, []uint64{7}, 1},
		{"bad service action", []step{{i1, Action{ServiceAction: 0x1f}, CodeInvalidCDB}}, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := run(t, tc.steps...)
			if got := keys(s); !slices.Equal(got, tc.keys) {
				t.Errorf("keys %v, want %v", got, tc.keys)
			}
			if s.Generation != tc.gen {
				t.Errorf("generation %d, want %d", s.Generation, tc.gen)
			}
		})
	}
}

func TestAllTargetPorts(t *testing.T) {
	s := run(t, step{i1, Action{ServiceAction: RegisterAndIgnore, SAKey: 5, AllTargetPort: true}, 0})
	if s.Registration(i1b) == nil || s.Registration(i1) == nil {
		t.Fatal("an ALL_TG_PT registration does not cover both target ports")
	}
	s2, err := Apply(s, i1b, Action{ServiceAction: Reserve, Key: 5, Type: WriteExclusive})
	if err != nil {
		t.Fatal(err)
	}
	if !s2.Holds(i1) || !s2.Holds(i1b) || s2.Holds(i2) {
		t.Error("holder through an ALL_TG_PT registration")
	}
}

func TestReserveRelease(t *testing.T) {
	for _, typ := range []Type{WriteExclusive, ExclusiveAccess, WriteExclusiveRegistrantsOnly,
		ExclusiveAccessRegistrantsOnly, WriteExclusiveAllRegistrants, ExclusiveAccessAllRegistrants} {
		s := run(t, step{i1, reg(1), 0}, step{i2, reg(2), 0},
			step{i1, Action{ServiceAction: Reserve, Key: 1, Type: typ}, 0},
			// again by the holder with the same type: no-op
			step{i1, Action{ServiceAction: Reserve, Key: 1, Type: typ}, 0},
			// the wrong key
			step{i1, Action{ServiceAction: Reserve, Key: 2, Type: typ}, CodeConflict},
		)
		if !s.Reserved || s.Type != typ || s.Generation != 2 {
			t.Fatalf("type %d: %+v", typ, s)
		}
		want := uint64(1)
		if typ.AllRegistrants() {
			want = 0
		}
		if s.HolderKey() != want {
			t.Errorf("type %d: holder key %d, want %d", typ, s.HolderKey(), want)
		}
		// Another registrant reserving: a conflict unless all-registrants
		// with the same type.
		_, err := Apply(s, i2, Action{ServiceAction: Reserve, Key: 2, Type: typ})
		if typ.AllRegistrants() != (err == nil) {
			t.Errorf("type %d: reserve by another registrant: %v", typ, err)
		}
		// Another type by the holder: conflict.
		other := WriteExclusive
		if typ == WriteExclusive {
			other = ExclusiveAccess
		}
		if _, err := Apply(s, i1, Action{ServiceAction: Reserve, Key: 1, Type: other}); AsError(err) == nil || AsError(err).Code != CodeConflict {
			t.Errorf("type %d: reserve of another type: %v", typ, err)
		}
		// Release with the wrong type: invalid release.
		if _, err := Apply(s, i1, Action{ServiceAction: Release, Key: 1, Type: other}); AsError(err) == nil || AsError(err).Code != CodeInvalidRelease {
			t.Errorf("type %d: release of another type: %v", typ, err)
		}
		// Release by an unregistered nexus: conflict.
		if _, err := Apply(s, i3, Action{ServiceAction: Release, Type: typ}); !errors.Is(err, ErrConflict) {
			t.Errorf("type %d: release by an unregistered nexus: %v", typ, err)
		}
		// Release by a registered non-holder: GOOD, nothing changes.
		if !typ.AllRegistrants() {
			n, err := Apply(s, i2, Action{ServiceAction: Release, Key: 2, Type: typ})
			if err != nil || n != s {
				t.Errorf("type %d: release by a non-holder: %v, changed %v", typ, err, n != s)
			}
		}
		r, err := Apply(s, i1, Action{ServiceAction: Release, Key: 1, Type: typ})
		if err != nil || r.Reserved || r.Generation != s.Generation {
			t.Fatalf("type %d: release: %v %+v", typ, err, r)
		}
		// RESERVATIONS RELEASED for the other registrant of the
		// registrants-only and all-registrants types only.
		got := r.AttentionsFor(i2, s.Seq)
		if typ.registrantsType() != slices.Equal(got, []byte{ReservationsReleased}) {
			t.Errorf("type %d: attentions for i2 after release: %v", typ, got)
		}
		if got := r.AttentionsFor(i1, s.Seq); len(got) != 0 {
			t.Errorf("type %d: the releaser got attentions %v", typ, got)
		}
	}
}

func TestReserveInvalid(t *testing.T) {
	run(t, step{i1, reg(1), 0},
		step{i1, Action{ServiceAction: Reserve, Key: 1, Type: 2}, CodeInvalidCDB},
		step{i1, Action{ServiceAction: Reserve, Key: 1, Type: 0}, CodeInvalidCDB},
		step{i2, Action{ServiceAction: Reserve, Type: WriteExclusive}, CodeConflict},
		step{i1, Action{ServiceAction: Reserve, Key: 1, Type: 1, AllTargetPort: true}, CodeInvalidParam},
	)
}

func TestUnregisterHolderReleases(t *testing.T) {
	s := run(t, step{i1, reg(1), 0}, step{i2, reg(2), 0},
		step{i1, Action{ServiceAction: Reserve, Key: 1, Type: WriteExclusiveRegistrantsOnly}, 0})
	before := s.Seq
	s = run2(t, s, step{i1, Action{ServiceAction: Register, Key: 1}, 0})
	if s.Reserved {
		t.Error("the holder unregistered but the reservation stays")
	}
	if got := s.AttentionsFor(i2, before); !slices.Equal(got, []byte{ReservationsReleased}) {
		t.Errorf("attentions %v", got)
	}
	// All registrants: the reservation stays until the last one goes.
	s = run(t, step{i1, reg(1), 0}, step{i2, reg(2), 0},
		step{i1, Action{ServiceAction: Reserve, Key: 1, Type: ExclusiveAccessAllRegistrants}, 0},
		step{i1, Action{ServiceAction: Register, Key: 1}, 0})
	if !s.Reserved || !s.Holds(i2) {
		t.Error("all-registrants reservation lost when one registrant left")
	}
	s = run2(t, s, step{i2, Action{ServiceAction: Register, Key: 2}, 0})
	if s.Reserved {
		t.Error("all-registrants reservation stays with no registrant")
	}
}

func run2(t *testing.T, s *State, steps ...step) *State {
	t.Helper()
	for i, st := range steps {
		n, err := Apply(s, st.from, st.a)
		if (err == nil) != (st.code == 0) || (err != nil && AsError(err).Code != st.code) {
			t.Fatalf("step %d: %v, want code %d", i, err, st.code)
		}
		if err == nil {
			s = n
		}
	}
	return s
}

func TestClear(t *testing.T) {
	s := run(t, step{i1, reg(1), 0}, step{i2, reg(2), 0}, step{i3, reg(3), 0},
		step{i2, Action{ServiceAction: Reserve, Key: 2, Type: ExclusiveAccess}, 0})
	before := s.Seq
	run2(t, s, step{i1, Action{ServiceAction: Clear, Key: 9}, CodeConflict})
	run2(t, s, step{Nexus{Initiator: "x"}, Action{ServiceAction: Clear}, CodeConflict})
	c := run2(t, s, step{i1, Action{ServiceAction: Clear, Key: 1}, 0})
	if c.Reserved || len(c.Registrations) != 0 || c.Generation != s.Generation+1 {
		t.Fatalf("after CLEAR: %+v", c)
	}
	for _, n := range []Nexus{i2, i3} {
		if got := c.AttentionsFor(n, before); !slices.Equal(got, []byte{ReservationsPreempted}) {
			t.Errorf("%s: attentions %v", n.Initiator, got)
		}
	}
	if got := c.AttentionsFor(i1, before); len(got) != 0 {
		t.Errorf("the clearer got %v", got)
	}
}

func TestPreempt(t *testing.T) {
	base := []step{{i1, reg(1), 0}, {i2, reg(2), 0}, {i3, reg(3), 0}}
	t.Run("no reservation removes registrations", func(t *testing.T) {
		s := run(t, base...)
		p := run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 1, Type: ExclusiveAccess}, 0})
		if !slices.Equal(keys(p), []uint64{2, 3}) || p.Generation != s.Generation+1 || p.Reserved {
			t.Fatalf("%+v", p)
		}
		if got := p.AttentionsFor(i1, s.Seq); !slices.Equal(got, []byte{RegistrationsPreempted}) {
			t.Errorf("attentions %v", got)
		}
		run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 42}, CodeConflict})
		run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 0}, CodeInvalidParam})
		run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 1, SAKey: 1}, CodeConflict})
	})
	t.Run("preempt the holder", func(t *testing.T) {
		s := run(t, append(base, step{i1, Action{ServiceAction: Reserve, Key: 1, Type: WriteExclusive}, 0})...)
		p := run2(t, s, step{i2, Action{ServiceAction: PreemptAndAbort, Key: 2, SAKey: 1, Type: ExclusiveAccess}, 0})
		if !p.Reserved || p.Type != ExclusiveAccess || !p.Holds(i2) || p.HolderKey() != 2 || p.Registration(i1) != nil {
			t.Fatalf("%+v", p)
		}
		if got := p.AttentionsFor(i1, s.Seq); !slices.Equal(got, []byte{RegistrationsPreempted}) {
			t.Errorf("i1: %v", got)
		}
		if got := p.AttentionsFor(i3, s.Seq); !slices.Equal(got, []byte{ReservationsReleased}) {
			t.Errorf("i3 (the type changed): %v", got)
		}
		run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 1, Type: 4}, CodeInvalidCDB})
	})
	t.Run("preempt a non-holder key", func(t *testing.T) {
		s := run(t, append(base, step{i1, Action{ServiceAction: Reserve, Key: 1, Type: WriteExclusive}, 0})...)
		p := run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 3}, 0})
		if !p.Holds(i1) || p.Registration(i3) != nil {
			t.Fatalf("%+v", p)
		}
		run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 0}, CodeInvalidParam})
	})
	t.Run("all registrants, key zero", func(t *testing.T) {
		s := run(t, append(base, step{i1, Action{ServiceAction: Reserve, Key: 1, Type: WriteExclusiveAllRegistrants}, 0})...)
		p := run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 0, Type: WriteExclusive}, 0})
		if !slices.Equal(keys(p), []uint64{2}) || p.Type != WriteExclusive || !p.Holds(i2) {
			t.Fatalf("%+v", p)
		}
	})
	t.Run("all registrants, a key", func(t *testing.T) {
		s := run(t, append(base, step{i1, Action{ServiceAction: Reserve, Key: 1, Type: ExclusiveAccessAllRegistrants}, 0})...)
		p := run2(t, s, step{i2, Action{ServiceAction: Preempt, Key: 2, SAKey: 3}, 0})
		if !slices.Equal(keys(p), []uint64{1, 2}) || p.Type != ExclusiveAccessAllRegistrants {
			t.Fatalf("%+v", p)
		}
	})
}

func TestConflicts(t *testing.T) {
	// holder i1, registered i2, unregistered i3.
	tests := []struct {
		typ                  Type
		regRead, regWrite    bool // i2 allowed
		unregRead, unregWrit bool // i3 allowed
	}{
		{WriteExclusive, true, false, true, false},
		{ExclusiveAccess, false, false, false, false},
		{WriteExclusiveRegistrantsOnly, true, true, true, false},
		{ExclusiveAccessRegistrantsOnly, true, true, false, false},
		{WriteExclusiveAllRegistrants, true, true, true, false},
		{ExclusiveAccessAllRegistrants, true, true, false, false},
	}
	for _, tc := range tests {
		s := run(t, step{i1, reg(1), 0}, step{i2, reg(2), 0},
			step{i1, Action{ServiceAction: Reserve, Key: 1, Type: tc.typ}, 0})
		check := func(n Nexus, a Access, allowed bool) {
			if s.Conflicts(n, a) == allowed {
				t.Errorf("type %d, %s, access %d: conflict %v", tc.typ, n.Initiator, a, !allowed)
			}
		}
		check(i1, AccessRead, true)
		check(i1, AccessWrite, true)
		check(i1b, AccessWrite, false) // another target port: another, unregistered nexus
		check(i2, AccessRead, tc.regRead)
		check(i2, AccessWrite, tc.regWrite)
		check(i3, AccessRead, tc.unregRead)
		check(i3, AccessWrite, tc.unregWrit)
		check(i3, AccessNone, true)
	}
	var none *State
	if none.Conflicts(i1, AccessWrite) || (&State{}).Conflicts(i1, AccessWrite) {
		t.Error("no reservation conflicts")
	}
}

func TestAttentionsBounded(t *testing.T) {
	s := run(t, step{i1, reg(1), 0})
	for k := uint64(2); k < 200; k++ {
		s = run2(t, s, step{i2, reg(k), 0}, step{i1, Action{ServiceAction: Preempt, Key: 1, SAKey: k}, 0})
	}
	if len(s.Attentions) > MaxAttentions {
		t.Fatalf("%d attentions kept", len(s.Attentions))
	}
}

func TestMaxRegistrations(t *testing.T) {
	var s *State
	for i := range MaxRegistrations {
		var err error
		if s, err = Apply(s, Nexus{Initiator: string(rune('a' + i))}, reg(1)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Apply(s, i1, reg(1)); AsError(err) == nil || AsError(err).Code != CodeNoResources {
		t.Fatalf("registration %d: %v", MaxRegistrations+1, err)
	}
}

func TestCached(t *testing.T) {
	ctx := context.Background()
	mem := NewMemStore()
	a := NewCached(mem, 50*time.Millisecond)
	b := NewCached(mem, 50*time.Millisecond)
	if s, err := b.Read(ctx, "v"); err != nil || s.Reserved {
		t.Fatal(s, err)
	}
	if _, err := a.Apply(ctx, "v", i1, reg(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(ctx, "v", i1, Action{ServiceAction: Reserve, Key: 1, Type: ExclusiveAccess}); err != nil {
		t.Fatal(err)
	}
	// a's Apply returned: b's copy (read before it) has expired.
	s, err := b.Read(ctx, "v")
	if err != nil || !s.Reserved || !s.Conflicts(i2, AccessRead) {
		t.Fatalf("b sees %+v, %v", s, err)
	}
	if _, err := a.Apply(ctx, "v", i2, Action{ServiceAction: Reserve, Type: ExclusiveAccess}); !errors.Is(err, ErrConflict) {
		t.Fatalf("reserve by an unregistered nexus: %v", err)
	}
}

// Cached.Apply waits out the TTL even when its context ends first: the
// change is made, and another node's copy from before it must have expired
// when it returns.
func TestCachedApplyOutwaitsContext(t *testing.T) {
	mem := NewMemStore()
	const ttl = 300 * time.Millisecond
	a, b := NewCached(mem, ttl), NewCached(mem, ttl)
	if _, err := a.Apply(context.Background(), "v", i1, reg(1)); err != nil {
		t.Fatal(err)
	}
	if s, err := b.Read(context.Background(), "v"); err != nil || s.Reserved {
		t.Fatal(s, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := a.Apply(ctx, "v", i1, Action{ServiceAction: Reserve, Key: 1, Type: ExclusiveAccess}); err != nil {
		t.Fatal(err)
	}
	if s, err := b.Read(context.Background(), "v"); err != nil || !s.Reserved {
		t.Fatalf("b's copy after a's Apply returned: reserved %v (%v): the copy from before it was still used", s.Reserved, err)
	}
}

func TestSPC2(t *testing.T) {
	rsv := Action{ServiceAction: ReserveSPC2}
	rel := Action{ServiceAction: ReleaseSPC2}
	reset := Action{ServiceAction: ResetSPC2}
	prRes := func(k uint64, ty Type) Action { return Action{ServiceAction: Reserve, Key: k, Type: ty} }
	tests := []struct {
		name   string
		steps  []step
		holder *Nexus // the SPC-2 holder after the steps
	}{
		{"reserve", []step{{i1, rsv, 0}}, &i1},
		{"reserve twice", []step{{i1, rsv, 0}, {i1, rsv, 0}}, &i1},
		{"other reserves", []step{{i1, rsv, 0}, {i2, rsv, CodeConflict}}, &i1},
		{"other target port is another nexus", []step{{i1, rsv, 0}, {i1b, rsv, CodeConflict}}, &i1},
		{"release", []step{{i1, rsv, 0}, {i1, rel, 0}, {i2, rsv, 0}}, &i2},
		{"release by other does nothing", []step{{i1, rsv, 0}, {i2, rel, 0}}, &i1},
		{"release unreserved", []step{{i1, rel, 0}}, nil},
		{"reset", []step{{i1, rsv, 0}, {i2, reset, 0}, {i2, rsv, 0}}, &i2},
		{"PR OUT from other conflicts", []step{{i1, rsv, 0}, {i2, reg(5), CodeConflict}}, &i1},
		{"PR OUT from holder", []step{{i1, rsv, 0}, {i1, reg(5), 0}}, &i1},
		{"registered: reserve conflicts", []step{{i1, reg(1), 0}, {i1, rsv, CodeConflict}, {i2, rsv, CodeConflict}}, nil},
		{"PR holder: reserve and release do nothing", []step{{i1, reg(1), 0}, {i1, prRes(1, WriteExclusive), 0},
			{i1, rsv, 0}, {i1, rel, 0}, {i2, rsv, CodeConflict}, {i2, rel, CodeConflict}}, nil},
		{"registrant under registrants only", []step{{i1, reg(1), 0}, {i2, reg(2), 0},
			{i1, prRes(1, WriteExclusiveRegistrantsOnly), 0}, {i2, rsv, 0}, {i2, rel, 0}, {i3, rsv, CodeConflict}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := run(t, tt.steps...)
			if !equalNexus(s.SPC2, tt.holder) {
				t.Fatalf("SPC-2 holder %v, want %v", s.SPC2, tt.holder)
			}
			if s.SPC2 != nil && s.Reserved {
				t.Fatal("an SPC-2 and a persistent reservation at once")
			}
		})
	}
}

func equalNexus(a, b *Nexus) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func TestSPC2Conflicts(t *testing.T) {
	s := &State{SPC2: &i1}
	for _, a := range []Access{AccessNone, AccessRead, AccessWrite} {
		if s.Conflicts(i1, a) {
			t.Errorf("holder conflicts (access %d)", a)
		}
		if !s.Conflicts(i2, a) || !s.Conflicts(i1b, a) {
			t.Errorf("another nexus does not conflict (access %d)", a)
		}
	}
	if s.Conflicts(i2, AccessExempt) {
		t.Error("an exempt command conflicts")
	}
	p := StateFromProto(s.Proto())
	if !equalNexus(p.SPC2, s.SPC2) {
		t.Fatalf("proto round trip: %v", p.SPC2)
	}
}

// PREEMPT AND ABORT marks the preempted nexuses' attentions Abort, which
// AbortedFor reports (an access node then aborts their commands) and the
// MDS's message keeps; PREEMPT does not.
func TestPreemptAndAbortAborts(t *testing.T) {
	s := run(t, step{i1, reg(1), 0}, step{i2, reg(2), 0}, step{i3, reg(3), 0},
		step{i1, Action{ServiceAction: Reserve, Key: 1, Type: WriteExclusiveRegistrantsOnly}, 0})
	p := run2(t, s, step{i1, Action{ServiceAction: Preempt, Key: 1, SAKey: 2, Type: WriteExclusiveRegistrantsOnly}, 0})
	if p.AbortedFor(i2, s.Seq) {
		t.Error("PREEMPT aborts the preempted nexus's commands")
	}
	pa := run2(t, s, step{i1, Action{ServiceAction: PreemptAndAbort, Key: 1, SAKey: 2, Type: WriteExclusiveRegistrantsOnly}, 0})
	for _, st := range []*State{pa, StateFromProto(pa.Proto())} {
		if !st.AbortedFor(i2, s.Seq) || st.AbortedFor(i2, pa.Seq) {
			t.Errorf("i2 after PREEMPT AND ABORT: aborted since %d: %v, since %d: %v; want true, false",
				s.Seq, st.AbortedFor(i2, s.Seq), pa.Seq, st.AbortedFor(i2, pa.Seq))
		}
		if st.AbortedFor(i1, s.Seq) || st.AbortedFor(i3, s.Seq) || st.AbortedFor(i1b, s.Seq) {
			t.Error("PREEMPT AND ABORT aborts a nexus it did not preempt")
		}
		if got := st.AttentionsFor(i2, s.Seq); !slices.Equal(got, []byte{RegistrationsPreempted}) {
			t.Errorf("i2's attentions %v", got)
		}
	}
}
