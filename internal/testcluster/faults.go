package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// Status returns the MDS's ClusterStatus (failing the test when no MDS answers
// within 30 s).
func (c *Cluster) Status() *api.ClusterStatusResponse {
	c.t.Helper()
	var r *api.ClusterStatusResponse
	c.Eventually(30*time.Second, "cluster status", func(ctx context.Context) error {
		var err error
		r, err = c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		return err
	})
	return r
}

// ProcOf returns the chunkserver process with the MDS id id (by its address).
func (c *Cluster) ProcOf(id uint64) *Proc {
	c.t.Helper()
	for _, cs := range c.Status().Chunkservers {
		if cs.Id != id {
			continue
		}
		for _, p := range c.CS {
			if p.Addr == cs.Addr {
				return p
			}
		}
	}
	c.t.Fatalf("no chunkserver process has id %d", id)
	return nil
}

// IDOf returns the MDS id of chunkserver process p.
func (c *Cluster) IDOf(p *Proc) uint64 {
	c.t.Helper()
	for _, cs := range c.Status().Chunkservers {
		if cs.Addr == p.Addr {
			return cs.Id
		}
	}
	c.t.Fatalf("%s (%s) is not registered", p.Name, p.Addr)
	return 0
}

// Leaders returns, per chunkserver process, how many copysets it leads now, as
// the MDS knows from heartbeats.
func (c *Cluster) Leaders() map[*Proc]int {
	c.t.Helper()
	st := c.Status()
	out := map[*Proc]int{}
	for _, p := range c.CS {
		out[p] = 0
	}
	for _, cs := range st.Chunkservers {
		for _, p := range c.CS {
			if p.Addr == cs.Addr {
				out[p] = int(st.LeadersPerChunkserver[cs.Id])
			}
		}
	}
	return out
}

// MostLeaders returns the running chunkserver that leads the most copysets, and
// FewestLeaders the one that leads the fewest.
func (c *Cluster) MostLeaders() *Proc   { return c.pickByLeaders(func(a, b int) bool { return a > b }) }
func (c *Cluster) FewestLeaders() *Proc { return c.pickByLeaders(func(a, b int) bool { return a < b }) }

func (c *Cluster) pickByLeaders(better func(a, b int) bool) *Proc {
	var best *Proc
	n := 0
	for _, p := range c.CS { // c.CS order: deterministic on ties
		l := c.Leaders()[p]
		if p.PID() != 0 && (best == nil || better(l, n)) {
			best, n = p, l
		}
	}
	return best
}

// CopysetsLedBy returns the copyset ids the chunkserver with MDS id id leads,
// according to the MDS.
func (c *Cluster) CopysetsLedBy(id uint64) map[uint32]bool {
	out := map[uint32]bool{}
	for _, cs := range c.Status().Copysets {
		if cs.LeaderHint == id {
			out[cs.Id] = true
		}
	}
	return out
}

// SetSlowDisk makes every WAL fdatasync of p take d longer (0 ends it). The
// cluster must have been started with Options.SlowDiskKnob.
func (c *Cluster) SetSlowDisk(p *Proc, d time.Duration) {
	c.t.Helper()
	path := filepath.Join(c.Dir, p.Name+".slow")
	if err := os.WriteFile(path, []byte(d.String()), 0o644); err != nil {
		c.t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the chunkserver polls the file every 100 ms
}

// Log returns the text of p's log.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// String names the process.
func (p *Proc) String() string { return fmt.Sprintf("%s(%s)", p.Name, p.Addr) }

// ArmFaultPoints arms p's fault points with spec (internal/faultpoint's
// syntax, e.g. "wal-after-sync=crash@20"; "" disarms) and, while p runs,
// waits until it says so in its log (or exits: an armed point crashed it
// first). The cluster must have been started with
// Options.FaultPoints. The spec stays armed across a restart of p until it
// is changed: disarm a point that crashed p before starting p again.
func (c *Cluster) ArmFaultPoints(p *Proc, spec string) {
	c.t.Helper()
	path := filepath.Join(c.Dir, p.Name+".faults")
	if old, _ := os.ReadFile(path); string(old) == spec {
		return
	}
	n := c.CountLog(p, "fault points armed")
	p.firedBefore = c.CountLog(p, "fault point fired")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(spec), 0o644); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		c.t.Fatal(err)
	}
	exited := p.Exited()
	if exited == nil {
		return
	}
	c.Eventually(60*time.Second, p.Name+" arming its fault points", func(context.Context) error {
		select {
		case <-exited:
			return nil // it reads the file when it starts again
		default:
		}
		if c.CountLog(p, "fault points armed") <= n {
			return fmt.Errorf("%s has not logged the spec %q yet", p.Name, spec)
		}
		return nil
	})
}

// AwaitFaultPoint waits until one of procs fired a fault point that crashed
// it (it logged "fault point fired" and exited), reaps it and returns it.
func (c *Cluster) AwaitFaultPoint(timeout time.Duration, procs ...*Proc) *Proc {
	c.t.Helper()
	var fired *Proc
	c.Eventually(timeout, "a fault point crashing a chunkserver", func(context.Context) error {
		for _, p := range procs {
			if ch := p.Exited(); ch != nil {
				select {
				case <-ch:
					if c.CountLog(p, "fault point fired") <= p.firedBefore {
						c.t.Fatalf("%s exited without firing a fault point", p.Name)
					}
					fired = p
					return nil
				default:
				}
			}
		}
		return fmt.Errorf("none of %v fired yet", procs)
	})
	c.Kill(fired) // forgets the reaped process, so that Start may run it again
	return fired
}
