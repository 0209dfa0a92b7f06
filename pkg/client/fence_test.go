package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// takeover makes the fake MDS hand out epoch 5: a writer that supersedes one.
func takeover(c *fakeCluster) {
	c.mds.mu.Lock()
	c.mds.epoch = 5
	c.mds.mu.Unlock()
}

// TestOpenFencesEveryCopyset: a takeover Open (epoch > 1) has fenced every
// copyset of the pool at its leader by the time it returns, following
// NOT_LEADER hints where the MDS's leader hint is stale.
func TestOpenFencesEveryCopyset(t *testing.T) {
	c := newFakeCluster(t)
	takeover(c)
	// Copyset 3's hint names a follower: the fence is redirected.
	c.mds.mu.Lock()
	c.mds.hints[3] = c.members[3][1]
	c.mds.mu.Unlock()
	v := c.open(t, nil)
	if v.Epoch() != 5 {
		t.Fatalf("epoch %d", v.Epoch())
	}
	c.mu.Lock()
	fenced := c.fenced
	frames := c.frames[api.OpFence]
	c.mu.Unlock()
	for cs := range uint32(tCS) {
		if got := fenced[cs]; len(got) != 1 || got[0] != 5 {
			t.Errorf("copyset %d: fences applied %v, want exactly one at epoch 5", cs, got)
		}
	}
	if frames < tCS {
		t.Errorf("%d fence frames for %d copysets", frames, tCS)
	}
	if bad := c.violations(); len(bad) > 0 {
		t.Fatalf("protocol violations: %v", bad)
	}
	// And IO works afterwards.
	if _, err := v.WriteAt([]byte("after"), 0); err != nil {
		t.Fatal(err)
	}
}

// TestOpenFirstWriterSendsNothing: the first writer of a volume (epoch 1)
// and a read-only open have nobody to fence: Open sends no frame at all.
func TestOpenFirstWriterSendsNothing(t *testing.T) {
	c := newFakeCluster(t)
	c.open(t, nil) // epoch 1
	takeover(c)
	c.open(t, func(cfg *Config) { cfg.ReadOnly = true })
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.frames); n != 0 {
		t.Fatalf("Open sent frames: %v", c.frames)
	}
}

// TestOpenFenceRefused: a fence that fails fails the Open, with an error that
// says so and names the copyset, and the new session is closed again. A
// FENCED answer (a still newer writer) is final; a copyset nobody answers for
// fails at the Open's deadline.
func TestOpenFenceRefused(t *testing.T) {
	t.Run("fenced", func(t *testing.T) {
		c := newFakeCluster(t)
		takeover(c)
		c.setHook(func(_ uint64, h api.Header) action {
			if h.Op == api.OpFence && h.Copyset == 2 {
				return fenced // a writer newer still reached copyset 2 first
			}
			return serve
		})
		_, err := Open(context.Background(), Config{Volume: "vol", MDSClient: c.mds, IOTimeout: time.Second, Logger: quietLog()})
		if !errors.Is(err, ErrFenceFailed) || !errors.Is(err, api.ErrFenced) {
			t.Fatalf("Open: %v, want ErrFenceFailed wrapping FENCED", err)
		}
		if !strings.Contains(err.Error(), "copyset 2") {
			t.Fatalf("error does not name the copyset: %v", err)
		}
		c.mds.mu.Lock()
		defer c.mds.mu.Unlock()
		if c.mds.closed != 1 {
			t.Fatalf("the failed open's session was closed %d times, want 1", c.mds.closed)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		c := newFakeCluster(t)
		takeover(c)
		c.setHook(func(_ uint64, h api.Header) action {
			if h.Op == api.OpFence && h.Copyset == 6 {
				return ignore
			}
			return serve
		})
		_, err := Open(context.Background(), Config{Volume: "vol", MDSClient: c.mds, Logger: quietLog(),
			IOTimeout: 50 * time.Millisecond, OpTimeout: 300 * time.Millisecond})
		if !errors.Is(err, ErrFenceFailed) || !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "copyset 6") {
			t.Fatalf("Open: %v, want ErrFenceFailed wrapping ErrTimeout for copyset 6", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		c := newFakeCluster(t)
		takeover(c)
		ctx, cancel := context.WithCancel(context.Background())
		c.setHook(func(_ uint64, h api.Header) action {
			if h.Op == api.OpFence {
				cancel()
				return ignore
			}
			return serve
		})
		_, err := Open(ctx, Config{Volume: "vol", MDSClient: c.mds, Logger: quietLog()})
		if !errors.Is(err, ErrFenceFailed) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Open: %v, want ErrFenceFailed wrapping context.Canceled", err)
		}
	})
}
