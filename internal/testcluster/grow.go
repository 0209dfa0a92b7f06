package testcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

// AddChunkserver starts one more chunkserver, named cs<N+1> in zone<N+1> on
// host<N+1>, with the flags the others were started with plus extra (behind
// a proxy of its own with Options.Proxy, after Options.PrepareChunkserver), waits
// until the MDS sees it online and returns it. Not for clusters in network
// namespaces.
func (c *Cluster) AddChunkserver(extra ...string) *Proc {
	c.t.Helper()
	if len(c.CS) == 0 || c.CS[0].NetNS != "" {
		c.t.Fatal("testcluster: AddChunkserver needs a cluster on loopback with a chunkserver to copy")
	}
	n := len(c.CS) + 1
	name := fmt.Sprintf("cs%d", n)
	dir := filepath.Join(c.Dir, name)
	addr := testutil.FreeAddr(c.t)
	p := &Proc{Name: name}
	advertise := addr
	if c.proxies != nil {
		advertise = c.proxies.listen(c.t, p, addr)
	}
	repl := map[string]string{
		"--data": dir, "--listen": addr, "--advertise": advertise, "--zone": fmt.Sprintf("zone%d", n), "--server": fmt.Sprintf("host%d", n),
		"--fault-slow-disk-file": filepath.Join(c.Dir, name+".slow"),
		"--tls-cert":             c.Issue(identity.RoleChunkserver, strconv.Itoa(n)),
	}
	args := slices.Clone(c.CS[0].Args)
	for i := 0; i+1 < len(args); i++ {
		if v, ok := repl[args[i]]; ok {
			args[i+1] = v
			i++
		}
	}
	args = append(args, extra...)
	np := c.newProc(name, dir, args...)
	p.Args, p.DataDir, p.LogPath, p.Addr = np.Args, np.DataDir, np.LogPath, advertise
	if c.prepare != nil {
		c.prepare(len(c.CS), dir)
	}
	c.CS = append(c.CS, p)
	c.Start(p)
	c.Eventually(30*time.Second, name+" online", func(ctx context.Context) error {
		r, err := c.API.ListChunkServers(ctx, &api.ListChunkServersRequest{})
		if err != nil {
			return err
		}
		for _, cs := range r.Chunkservers {
			if cs.Addr == advertise && cs.Online {
				return nil
			}
		}
		return fmt.Errorf("%s (%s) not online", name, advertise)
	})
	return p
}

// Placement is a snapshot of where the pool's copysets are, from ClusterStatus.
type Placement struct {
	Members map[uint64]int // copysets each chunkserver id is a member of
	Leaders map[uint64]int // copysets each chunkserver id leads
	// Moves: member moves in flight; MovesTo counts them per receiving
	// chunkserver, MovesLed per leader of the moving copyset.
	Moves             int
	MovesTo, MovesLed map[uint64]int
	Healthy, Total    int
}

// Placement returns where the copysets are now, over the online chunkservers.
func (c *Cluster) Placement() Placement {
	c.t.Helper()
	st := c.Status()
	p := Placement{Members: map[uint64]int{}, Leaders: map[uint64]int{}, MovesTo: map[uint64]int{},
		MovesLed: map[uint64]int{}, Healthy: int(st.CopysetsHealthy), Total: len(st.Copysets)}
	for _, cs := range st.Chunkservers {
		if cs.Online {
			p.Members[cs.Id], p.Leaders[cs.Id] = 0, 0
		}
	}
	for _, cs := range st.Copysets {
		for _, m := range cs.Members {
			p.Members[m]++
		}
		if cs.LeaderHint != 0 {
			p.Leaders[cs.LeaderHint]++
		}
		if cs.Move != nil {
			p.Moves++
			p.MovesTo[cs.Move.To]++
			if cs.LeaderHint != 0 && cs.LeaderHint != cs.Move.To {
				p.MovesLed[cs.LeaderHint]++
			}
		}
	}
	return p
}

// Spread returns the smallest and largest count in m.
func Spread(m map[uint64]int) (lo, hi int) {
	lo, hi = 1<<30, 0
	for _, n := range m {
		lo, hi = min(lo, n), max(hi, n)
	}
	return lo, hi
}
