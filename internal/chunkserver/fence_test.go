package chunkserver

import (
	"testing"

	"github.com/basalt-storage/basalt/pkg/api"
)

// TestHandlerFence: OpFence raises a volume's epoch in one copyset through a
// proposal, without any IO there; the old writer is then FENCED in that
// copyset and only there. Bad fences change nothing.
func TestHandlerFence(t *testing.T) {
	e := newHandlerEnv(t)
	c := e.dial()
	// Two offsets in different copysets.
	offA := uint64(0)
	offB := uint64(hChunk)
	for csOf(hVolume, offB) == csOf(hVolume, offA) {
		offB += hChunk
	}
	for _, off := range []uint64{offA, offB} {
		if r, _ := e.do(c, ioHdr(api.OpWrite, off, 4), []byte("old1")); r.Status != api.StatusOK {
			t.Fatalf("old writer's first write at %d: %v", off, r.Status)
		}
	}
	fence := func(cs uint32, epoch uint64) api.Header {
		return api.Header{Op: api.OpFence, Volume: hVolume, Epoch: epoch, Copyset: cs}
	}
	e.host.mu.Lock()
	before := e.host.proposed
	e.host.mu.Unlock()
	if r, _ := e.do(c, fence(csOf(hVolume, offB), hEpoch+1), nil); r.Status != api.StatusOK {
		t.Fatalf("fence: %v", r.Status)
	}
	e.host.mu.Lock()
	proposed := e.host.proposed - before
	e.host.mu.Unlock()
	if proposed != 1 {
		t.Fatalf("a fence made %d proposals, want 1 (it goes through the raft log)", proposed)
	}
	if r, _ := e.do(c, ioHdr(api.OpWrite, offB, 4), []byte("old2")); r.Status != api.StatusFenced {
		t.Fatalf("old writer's write in the fenced copyset: %v, want FENCED", r.Status)
	}
	if r, _ := e.do(c, ioHdr(api.OpWrite, offA, 4), []byte("old2")); r.Status != api.StatusOK {
		t.Fatalf("old writer's write in a copyset not fenced: %v, want OK", r.Status)
	}
	// Fencing again with the same epoch is a no-op that succeeds; an older
	// epoch is refused (a still newer writer took over).
	if r, _ := e.do(c, fence(csOf(hVolume, offB), hEpoch+1), nil); r.Status != api.StatusOK {
		t.Fatalf("repeated fence: %v", r.Status)
	}
	if r, _ := e.do(c, fence(csOf(hVolume, offB), hEpoch), nil); r.Status != api.StatusFenced {
		t.Fatalf("older fence: %v, want FENCED", r.Status)
	}
	// The new writer's data path works in the fenced copyset.
	w := ioHdr(api.OpWrite, offB, 4)
	w.Epoch = hEpoch + 1
	if r, _ := e.do(c, w, []byte("new!")); r.Status != api.StatusOK {
		t.Fatalf("new writer's write: %v", r.Status)
	}
	r, p := e.do(c, ioHdr(api.OpRead, offB, 4), nil)
	if r.Status != api.StatusFenced {
		t.Fatalf("old writer's read after the fence: %v %q", r.Status, p)
	}

	for _, tc := range []struct {
		name string
		h    api.Header
		body []byte
		want api.Status
	}{
		{"epoch 0", fence(0, 0), nil, api.StatusReadOnly},
		{"offset", api.Header{Op: api.OpFence, Volume: hVolume, Epoch: 9, Offset: 4096}, nil, api.StatusBadRequest},
		{"length", api.Header{Op: api.OpFence, Volume: hVolume, Epoch: 9, Length: 1}, nil, api.StatusBadRequest},
		{"payload", fence(0, 9), []byte{1}, api.StatusBadRequest},
		{"copyset out of the pool", fence(hCopysets, 9), nil, api.StatusBadRequest},
		{"unknown volume", api.Header{Op: api.OpFence, Volume: 999, Epoch: 9}, nil, api.StatusNoSuchVolume},
		{"deleted volume", api.Header{Op: api.OpFence, Volume: hDeleted, Epoch: 9}, nil, api.StatusNoSuchVolume},
	} {
		e.host.mu.Lock()
		before := e.host.proposed
		e.host.mu.Unlock()
		h := tc.h
		if tc.body != nil {
			h.Length = 0
		}
		if r, _ := e.do(c, h, tc.body); r.Status != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, r.Status, tc.want)
		}
		e.host.mu.Lock()
		if e.host.proposed != before {
			t.Errorf("%s: a refused fence was proposed", tc.name)
		}
		e.host.mu.Unlock()
	}
	// Off the leader: NOT_LEADER with the hint, as for IO.
	e.host.mu.Lock()
	e.host.notLead = 77
	e.host.mu.Unlock()
	if r, _ := e.do(c, fence(0, hEpoch+2), nil); r.Status != api.StatusNotLeader || r.Hint != 77 {
		t.Fatalf("fence off the leader: %v hint %d", r.Status, r.Hint)
	}
}

// TestLocalFence: the local fast path serves OpFence like a frame.
func TestLocalFence(t *testing.T) {
	e := newHandlerEnv(t)
	cs := &ChunkServer{}
	cs.local.Store(e.hd)
	got := make(chan api.Header, 1)
	cs.Go(api.Header{Op: api.OpFence, Volume: hVolume, Epoch: hEpoch, Copyset: 1}, nil, nil,
		func(h api.Header) { got <- h })
	if h := <-got; h.Status != api.StatusOK {
		t.Fatalf("local fence: %v", h.Status)
	}
	if ep := e.host.replicas[api.GroupID(hPool, 1)].sm.epochOf(hVolume); ep != hEpoch {
		t.Fatalf("epoch after the local fence: %d, want %d", ep, hEpoch)
	}
}
