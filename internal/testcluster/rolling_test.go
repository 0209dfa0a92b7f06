package testcluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRollingRestart (issue 15, hazard 7): under a verified workload, each
// chunkserver in turn is stopped with SIGTERM and started again, waiting for
// the cluster to be healthy in between. A stopping chunkserver hands every
// leadership away first: each must log still_leading=0, and no IO may fail.
// Elections and transfers are counted from the logs and reported, not asserted.
func TestRollingRestart(t *testing.T) {
	c := Start(t, Options{})
	c.CreateVolume("rolling", 64<<20)
	v := c.Open("rolling", false)
	w := StartWorkload(t, v, WorkloadOptions{Seed: 15})
	t.Cleanup(w.Stop)
	w.AwaitProgress(c, "the workload to start")
	elections := func() (e, tr int) {
		for _, p := range c.CS {
			e += c.CountLog(p, "via=election")
			tr += c.CountLog(p, "via=transfer")
		}
		return e, tr
	}
	e0, tr0 := elections()
	w.Mark("fault")
	for _, p := range c.CS {
		drained := c.CountLog(p, "still_leading=0")
		led := c.Leaders()[p]
		t0 := time.Now()
		c.Stop(p)
		stopped := time.Since(t0)
		if c.CountLog(p, "still_leading=0") == drained {
			t.Errorf("%s (leading %d copysets) stopped without logging still_leading=0: %q",
				p.Name, led, lastLines(p.LogPath, "still_leading", 3))
		}
		t.Logf("%s: led %d copysets, stopped in %v; %q", p.Name, led, stopped.Round(time.Millisecond),
			lastLines(p.LogPath, "still_leading", 1))
		serving := c.CountLog(p, "chunkserver serving")
		c.Start(p)
		// Back means: this incarnation serves (the MDS's view of the old one may
		// not have timed out yet), every copyset is healthy, and the balancer
		// gave it leaderships again — which raft completes only once it caught
		// up — so the next stop has leaders to hand over and peers to take them.
		c.Eventually(120*time.Second, p.Name+" serving again", func(context.Context) error {
			if c.CountLog(p, "chunkserver serving") == serving {
				return fmt.Errorf("%s not serving yet", p.Name)
			}
			return nil
		})
		c.WaitHealthy(120 * time.Second)
		c.Eventually(120*time.Second, p.Name+" leading again", func(context.Context) error {
			if n := c.Leaders()[p]; n == 0 {
				return fmt.Errorf("%s leads no copyset yet", p.Name)
			}
			return nil
		})
		w.AwaitProgress(c, p.Name+" back and IO flowing")
	}
	w.Mark("healed")
	w.AwaitProgress(c, "IO after the last restart")
	w.Stop()
	e1, tr1 := elections()
	f := w.Figures("rolling restart")
	t.Logf("rolling restart of %d chunkservers: %d elections, %d leader transfers (from the logs); %v",
		len(c.CS), e1-e0, tr1-tr0, f)
	if n := w.failed.Load(); n != 0 {
		t.Errorf("%d IOs failed during the rolling restart: %v", n, w.Errors())
	}
	w.Verify(v)
	c.CompareReplicas(60 * time.Second)
}

// lastLines returns the last n lines of the file at path that contain s.
func lastLines(path, s string, n int) []string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out[max(0, len(out)-n):]
}
