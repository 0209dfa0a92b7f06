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
