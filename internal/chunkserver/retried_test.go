package chunkserver

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/basalt-storage/basalt/pkg/api"
)

// numberedWrite is a write of one repeated byte as the client numbers it.
func numberedWrite(epoch, off, seq, settled uint64, b byte) []byte {
	return encodeCommand(command{Op: cmdWrite, Volume: 7, Epoch: epoch, Offset: off, Length: 4,
		Seq: seq, Settled: settled, Data: bytes.Repeat([]byte{b}, 4)})
}

// TestApplyRetriedWriteOnce: a retried write (same number) that reaches the
// log after a newer write to the same block is not applied again — without
// the request windows it was, and undid the newer acknowledged write (found
// by tests/proof's linearizability checker, seed 86306739). A late copy of a
// request the writer settled is refused; a new writer numbers afresh.
func TestApplyRetriedWriteOnce(t *testing.T) {
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	i := uint64(0)
	apply := func(b []byte) error { i++; return sm.Apply(i, b) }
	block := func() string { return string(readBack(t, st, 7, 8, 4)) }

	if err := apply(numberedWrite(1, 8, 1, 1, 'a')); err != nil {
		t.Fatal(err)
	}
	// The answer to request 1 was lost: still unsettled when 2 is sent.
	if err := apply(numberedWrite(1, 8, 2, 1, 'b')); err != nil {
		t.Fatal(err)
	}
	if err := apply(numberedWrite(1, 8, 1, 1, 'a')); err != nil {
		t.Fatalf("retry of an applied write: %v, want OK", err)
	}
	if got := block(); got != "bbbb" {
		t.Fatalf("block reads %q after the retry of request 1, want the newer bbbb", got)
	}
	// Both settled; a late copy of 1 (an attempt the writer gave up on) is
	// refused and changes nothing, and so is a request never applied.
	if err := apply(numberedWrite(1, 8, 3, 3, 'c')); err != nil {
		t.Fatal(err)
	}
	for _, late := range [][]byte{numberedWrite(1, 8, 1, 1, 'a'), numberedWrite(1, 8, 2, 2, 'z')} {
		if err := apply(late); !errors.Is(err, api.ErrStaleRequest) {
			t.Fatalf("late settled request: %v, want STALE_REQUEST", err)
		}
	}
	if got := block(); got != "cccc" {
		t.Fatalf("block reads %q, want cccc", got)
	}
	// Trims are numbered alike.
	trim := encodeCommand(command{Op: cmdTrim, Volume: 7, Epoch: 1, Offset: 8, Length: 4, Seq: 4, Settled: 4})
	if err := apply(trim); err != nil {
		t.Fatal(err)
	}
	if err := apply(numberedWrite(1, 8, 5, 4, 'd')); err != nil {
		t.Fatal(err)
	}
	if err := apply(trim); err != nil || block() != "dddd" {
		t.Fatalf("retried trim: %v, block %q, want dddd", err, block())
	}
	// A new writer (epoch 2) numbers from 1 again.
	if err := apply(numberedWrite(2, 8, 1, 1, 'e')); err != nil || block() != "eeee" {
		t.Fatalf("new writer's request 1: %v, block %q", err, block())
	}
	// Unnumbered commands (version 1, written before numbering) always apply.
	if err := apply(encodeCommand(command{Op: cmdWrite, Volume: 7, Epoch: 2, Offset: 8, Length: 4, Data: []byte("ffff")})); err != nil || block() != "ffff" {
		t.Fatalf("unnumbered write: %v, block %q", err, block())
	}
}

// TestRetriedWindowSurvivesRestartAndSnapshot: the windows are part of the
// replicated state, so a replica that recovers from its meta record, or
// installs a snapshot, decides a retry as the leader did.
func TestRetriedWindowSurvivesRestartAndSnapshot(t *testing.T) {
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	_ = sm.Apply(1, numberedWrite(1, 8, 1, 1, 'a'))
	_ = sm.Apply(2, numberedWrite(1, 8, 2, 1, 'b'))
	state := sm.Capture()
	if err := sm.Persist(2, state); err != nil {
		t.Fatal(err)
	}
	restarted := newStateMachine(1, testChunk, st, nil)
	if _, _, err := restarted.Recover(); err != nil {
		t.Fatal(err)
	}
	var snap bytes.Buffer
	if err := sm.WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	fst := newMemStore(testChunk)
	follower := newStateMachine(1, testChunk, fst, nil)
	if err := follower.ReceiveSnapshot(2, &snap); err != nil {
		t.Fatal(err)
	}
	if err := follower.InstallSnapshot(2, state); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]struct {
		sm *stateMachine
		st *memStore
	}{"recovered": {restarted, st}, "installed": {follower, fst}} {
		if err := r.sm.Apply(3, numberedWrite(1, 8, 1, 1, 'a')); err != nil {
			t.Fatalf("%s: retry: %v", name, err)
		}
		if got := readBack(t, r.st, 7, 8, 4); string(got) != "bbbb" {
			t.Fatalf("%s replica applied the retry again: block %q, want bbbb", name, got)
		}
	}
}

// TestRetriedWindowBounded: numbers applied one after another are one range,
// so a request left unanswered while 100,000 newer ones were applied is still
// applied when it comes (not refused), and the window stays one range beside
// it. Only gaps cost: with more than maxSeqRanges of them open the oldest
// range is settled by the copyset, and a retry in it is refused
// (STALE_REQUEST: the writer reports an error), never applied late.
func TestRetriedWindowBounded(t *testing.T) {
	st := newMemStore(testChunk)
	sm := newStateMachine(1, testChunk, st, nil)
	i := uint64(0)
	apply := func(seq, settled uint64, off uint64) error {
		i++
		return sm.Apply(i, numberedWrite(1, off, seq, settled, 'x'))
	}
	for seq := uint64(2); seq <= 100_001; seq++ { // number 1 is outstanding
		if err := apply(seq, 1, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if got := sm.windows[7].applied; len(got) != 1 || got[0] != (seqRange{2, 100_001}) {
		t.Fatalf("window %v, want one range 2..100001", got)
	}
	if err := apply(1, 1, 8); err != nil {
		t.Fatalf("the outstanding request 1: %v, want applied", err)
	}
	if err := apply(100_001, 1, 8); err != nil || readBack(t, st, 7, 8, 1)[0] != 'x' {
		t.Fatalf("retry of 100001: %v", err)
	}
	// Gaps: every other number from here on stays unanswered.
	first := uint64(200_000)
	for k := uint64(0); k <= maxSeqRanges; k++ {
		if err := apply(first+2*k, 100_002, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(sm.windows[7].applied); n != maxSeqRanges {
		t.Fatalf("window holds %d ranges, want the bound %d", n, maxSeqRanges)
	}
	if err := apply(first, 100_002, 4096); !errors.Is(err, api.ErrStaleRequest) {
		t.Fatalf("retry in the range the copyset settled: %v, want STALE_REQUEST", err)
	}
	if err := apply(first+2, 100_002, 4096); err != nil {
		t.Fatalf("retry of a remembered number: %v, want OK", err)
	}
}

// TestClusterRetriedWriteAcrossLeaderChange is the linearizability checker's
// failure on three real chunkservers: request 1 was applied but its answer
// lost; request 2 to the same block was acknowledged; the leader dies; the
// writer retries request 1 at the new leader, a new raft entry after request
// 2. The block must still hold request 2's data on every replica.
func TestClusterRetriedWriteAcrossLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	tc := newTestCluster(t, clusterPool(2), []*api.Volume{{Id: ctVolume, Size: ctVolSize, PoolId: 1}}, nil)
	cs := api.CopysetOf(ctVolume, 0, tc.pool.GetCopysetCount())
	write := func(seq, settled uint64, data string) api.Status {
		t.Helper()
		r, err := tc.do(api.Header{Op: api.OpWrite, Volume: ctVolume, Epoch: 1, Offset: 4096,
			Length: uint32(len(data)), Copyset: cs, Seq: seq, Settled: settled}, []byte(data), nil)
		if err != nil {
			t.Fatalf("write %d: %v", seq, err)
		}
		return r.Status
	}
	if st := write(1, 1, "first-"); st != api.StatusOK {
		t.Fatal(st)
	}
	if st := write(2, 1, "second"); st != api.StatusOK {
		t.Fatal(st)
	}
	tc.mu.Lock()
	leader := tc.leader[cs]
	tc.mu.Unlock()
	stopped := -1
	for i, n := range tc.nodes {
		if n.cs.ID() == leader {
			tc.stop(i)
			stopped = i
		}
	}
	if st := write(1, 1, "first-"); st != api.StatusOK {
		t.Fatalf("retry at the new leader: %v, want OK", st)
	}
	if got := tc.read(ctVolume, 4096, 6); string(got) != "second" {
		t.Fatalf("block reads %q after the retry of request 1, want the acknowledged %q", got, "second")
	}
	// The writer settles both; a copy of request 1 still in flight is refused.
	if st := write(3, 3, "third-"); st != api.StatusOK {
		t.Fatal(st)
	}
	if st := write(1, 1, "first-"); st != api.StatusStaleRequest {
		t.Fatalf("late copy of a settled request: %v, want STALE_REQUEST", st)
	}
	if got := tc.read(ctVolume, 4096, 6); string(got) != "third-" {
		t.Fatalf("block reads %q, want third-", got)
	}
	tc.start(stopped) // it catches up and decides as the others did
	tc.converged()
}

// TestSeqWindowAgainstModel drives a window with random numbers and settled
// marks and checks every decision against a plain set of applied numbers.
func TestSeqWindowAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var w seqWindow
	applied := map[uint64]bool{}
	settled := uint64(0)
	for step := range 200_000 {
		if rng.IntN(50) == 0 {
			settled += uint64(rng.IntN(8))
		}
		seq := settled + uint64(rng.IntN(64)) - 4 // sometimes below settled
		if seq == 0 || seq > 1<<62 {
			continue
		}
		apply, err := w.admit(seq, settled)
		switch {
		case seq < settled:
			if apply || !errors.Is(err, api.ErrStaleRequest) {
				t.Fatalf("step %d: settled number %d (settled %d): %v %v", step, seq, settled, apply, err)
			}
		case applied[seq]:
			if apply || err != nil {
				t.Fatalf("step %d: applied number %d again: %v %v", step, seq, apply, err)
			}
		default:
			if !apply || err != nil {
				t.Fatalf("step %d: new number %d refused: %v", step, seq, err)
			}
			applied[seq] = true
		}
		for k, r := range w.applied {
			if r.lo > r.hi || r.lo < w.settled || k > 0 && r.lo <= w.applied[k-1].hi+1 {
				t.Fatalf("step %d: window breaks its invariant: %v (settled %d)", step, w.applied, w.settled)
			}
		}
	}
}

// FuzzDecodeEpochs: a malformed epoch table (its bytes come from a meta
// record or a leader's snapshot) is an error, never a panic, and what decodes
// encodes back to a table that decodes alike.
func FuzzDecodeEpochs(f *testing.F) {
	f.Add(encodeEpochs(map[uint64]uint64{9: 2, 3: 1}, map[uint64]*seqWindow{9: {settled: 5, applied: []seqRange{{5, 5}, {7, 9}}}}))
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, w, err := decodeEpochs(b)
		if err != nil {
			return
		}
		e2, w2, err := decodeEpochs(encodeEpochs(e, w))
		if err != nil || len(e2) != len(e) || len(w2) != len(w) {
			t.Fatalf("re-encoded table: %v %v %v", e2, w2, err)
		}
	})
}
