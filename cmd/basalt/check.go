package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/scrub"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

func checkCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Compare the replicas of every copyset (per-chunk checksums)",
		Long: `Compare the replicas of every copyset of every pool (or of --pool): each member
checksums its chunks, differing chunks are re-checked for a few seconds (writes in
flight reach followers a moment later), and what still differs is reported.

Exits non-zero when replicas differ or something could not be checked (a replica
unreachable, or a chunk that kept changing while it was re-checked: run again when
the volume is quiet). Every member reads all of its chunk data; --rate bounds that.`,
		Args: cobra.NoArgs,
	}
	af := addAdminFlags(cmd)
	pool := cmd.Flags().String("pool", "", "check only this pool (default: every pool)")
	rate := cmd.Flags().String("rate", "256MiB", "chunk data checksummed per second, summed over all replicas; 0 = unlimited")
	parallel := cmd.Flags().Int("parallel", 4, "copysets checked at once")
	rechecks := cmd.Flags().Int("rechecks", scrub.DefaultRechecks, "re-checks of a differing chunk before it is reported (0 = none)")
	timeout := cmd.Flags().Duration("timeout", scrub.DefaultTimeout, "one replica's answer for one copyset (it reads every chunk of it)")
	cmd.RunE = func(*cobra.Command, []string) error {
		if *af.output != "table" && *af.output != "json" {
			return fmt.Errorf("--output must be table or json, not %q", *af.output)
		}
		var bps uint64
		if strings.TrimSpace(*rate) != "0" {
			var err error
			if bps, err = parseBytes(*rate); err != nil {
				return fmt.Errorf("--rate: %w", err)
			}
		}
		if *parallel < 1 {
			return fmt.Errorf("--parallel must be at least 1")
		}
		rc := *rechecks
		if rc == 0 {
			rc = -1 // scrub.Config: < 0 is none
		}
		c, err := af.dial()
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := signalContext()
		defer cancel()
		opts := checkOptions{pool: *pool, rate: int64(bps), parallel: *parallel, rechecks: rc, timeout: *timeout}
		if id, err := af.tls.load(); err != nil {
			return err
		} else if id != nil {
			opts.sec = transport.Security{Mode: transport.ModeAuthenticated, ClientTLS: id.ClientTLS(identity.RoleChunkserver)}
		}
		res, err := runCheck(ctx, c, opts)
		if err != nil {
			return err
		}
		if err := printResult(os.Stdout, *af.output, res); err != nil {
			return err
		}
		return res.err()
	}
	return cmd
}

type checkOptions struct {
	pool     string
	rate     int64
	parallel int
	rechecks int
	timeout  time.Duration
	sec      transport.Security // how to connect to chunkservers (the admin's identity)
}

// checkResult is what `basalt check` prints.
type checkResult struct {
	Pools       []poolCheck     `json:"pools"`
	Differences []chunkDiff     `json:"differences"`
	Unsettled   []chunkDiff     `json:"unsettled"`
	Unreachable []unreachable   `json:"unreachable"`
	Copysets    []*scrub.Report `json:"copysets"`
}

// poolCheck sums up one pool.
type poolCheck struct {
	ID       uint32 `json:"id"`
	Name     string `json:"name"`
	Copysets int    `json:"copysets"`
	// Checked: copysets whose every replica answered and every chunk was judged.
	Checked     int `json:"checked"`
	Chunks      int `json:"chunks_compared"`
	Differences int `json:"differences"`
	Unsettled   int `json:"unsettled"`
	// Unreachable: distinct chunkservers that could not be asked for some copyset.
	Unreachable int `json:"unreachable_members"`
}

// chunkDiff is a scrub.Difference with the names an operator knows.
type chunkDiff struct {
	scrub.Difference
	PoolName   string `json:"pool_name"`
	VolumeName string `json:"volume_name,omitempty"`
	Offset     uint64 `json:"offset"` // of the chunk in the volume
}

// unreachable is one chunkserver that could not be asked, over all copysets.
type unreachable struct {
	Member   uint64   `json:"member"`
	Addr     string   `json:"addr"`
	Copysets []string `json:"copysets"` // "pool/copyset"
	Err      string   `json:"error"`    // the first error
}

func (r *checkResult) err() error {
	var diff, unsettled, copysets int
	for _, p := range r.Pools {
		diff += p.Differences
		unsettled += p.Unsettled
		copysets += p.Copysets - p.Checked
	}
	switch {
	case diff > 0:
		return fmt.Errorf("%w: %d chunk(s)", scrub.ErrReplicasDiffer, diff)
	case copysets > 0 || unsettled > 0:
		return fmt.Errorf("%w: %d copyset(s) not fully checked", scrub.ErrIncomplete, copysets)
	}
	return nil
}

// runCheck compares every copyset of the chosen pools.
func runCheck(ctx context.Context, c api.MDSClient, o checkOptions) (*checkResult, error) {
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pr, err := c.ListPools(mctx, &api.ListPoolsRequest{})
	if err != nil {
		return nil, err
	}
	var pools []*api.Pool
	for _, p := range pr.Pools {
		if o.pool == "" || p.Name == o.pool {
			pools = append(pools, p)
		}
	}
	if o.pool != "" && len(pools) == 0 {
		return nil, fmt.Errorf("no pool named %q", o.pool)
	}
	slices.SortFunc(pools, func(a, b *api.Pool) int { return cmp.Compare(a.Id, b.Id) })
	volumes := map[uint64]string{}
	if vr, err := c.ListVolumes(mctx, &api.ListVolumesRequest{}); err == nil {
		for _, v := range vr.Volumes {
			volumes[v.Id] = v.Name
		}
	}

	type job struct {
		pool   int
		target scrub.Target
	}
	var jobs []job
	res := &checkResult{Differences: []chunkDiff{}, Unsettled: []chunkDiff{}, Unreachable: []unreachable{}}
	for i, p := range pools {
		cr, err := c.GetCopysets(mctx, &api.GetCopysetsRequest{PoolId: p.Id})
		if err != nil {
			return nil, fmt.Errorf("copysets of pool %s: %w", p.Name, err)
		}
		addrs := map[uint64]string{}
		for _, cs := range cr.Chunkservers {
			addrs[cs.Id] = cs.Addr
		}
		res.Pools = append(res.Pools, poolCheck{ID: p.Id, Name: p.Name, Copysets: len(cr.Copysets)})
		for _, cs := range cr.Copysets {
			t := scrub.Target{Pool: p.Id, Copyset: cs.Id, ChunkSize: p.ChunkSize}
			for _, m := range cs.Members {
				t.Members = append(t.Members, scrub.Member{ID: m, Addr: addrs[m]})
			}
			jobs = append(jobs, job{i, t})
		}
	}

	var lim *scrub.Limiter
	if o.rate > 0 {
		lim = scrub.NewLimiter(o.rate, 0)
	}
	chk := scrub.NewChecker(scrub.Config{Limiter: lim, Rechecks: o.rechecks, Timeout: o.timeout, Security: o.sec})
	defer chk.Close()
	reports := make([]*scrub.Report, len(jobs))
	var (
		wg   sync.WaitGroup
		next = make(chan int)
	)
	for range min(o.parallel, max(len(jobs), 1)) {
		wg.Go(func() {
			for i := range next {
				rep := chk.Check(ctx, jobs[i].target)
				reports[i] = &rep
			}
		})
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("check interrupted: %w", err)
	}

	byMember := map[uint64]*unreachable{}
	for i, rep := range reports {
		pc := &res.Pools[jobs[i].pool]
		p := pools[jobs[i].pool]
		res.Copysets = append(res.Copysets, rep)
		if !errors.Is(rep.Err(), scrub.ErrIncomplete) {
			pc.Checked++
		}
		pc.Chunks += rep.Chunks
		pc.Differences += len(rep.Mismatches)
		pc.Unsettled += len(rep.Unsettled)
		named := func(d scrub.Difference) chunkDiff {
			return chunkDiff{Difference: d, PoolName: p.Name, VolumeName: volumes[d.Volume], Offset: d.Index * p.ChunkSize}
		}
		for _, d := range rep.Mismatches {
			res.Differences = append(res.Differences, named(d))
		}
		for _, d := range rep.Unsettled {
			res.Unsettled = append(res.Unsettled, named(d))
		}
		for _, u := range rep.Unreachable {
			x := byMember[u.Member]
			if x == nil {
				x = &unreachable{Member: u.Member, Addr: u.Addr, Err: u.Err}
				byMember[u.Member] = x
			}
			x.Copysets = append(x.Copysets, fmt.Sprintf("%s/%d", p.Name, rep.Copyset))
		}
	}
	for i := range res.Pools {
		seen := map[uint64]bool{}
		for j, rep := range reports {
			if jobs[j].pool != i {
				continue
			}
			for _, u := range rep.Unreachable {
				seen[u.Member] = true
			}
		}
		res.Pools[i].Unreachable = len(seen)
	}
	for _, u := range byMember {
		res.Unreachable = append(res.Unreachable, *u)
	}
	slices.SortFunc(res.Unreachable, func(a, b unreachable) int { return cmp.Compare(a.Member, b.Member) })
	return res, nil
}

func printResult(w io.Writer, format string, r *checkResult) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	r.table(tw)
	return tw.Flush()
}

func (r *checkResult) table(w io.Writer) {
	fmt.Fprintln(w, "POOL\tCOPYSETS\tCHECKED\tCHUNKS COMPARED\tDIFFERENCES\tUNSETTLED\tUNREACHABLE MEMBERS")
	for _, p := range r.Pools {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Name, p.Copysets, p.Checked, p.Chunks, p.Differences, p.Unsettled, p.Unreachable)
	}
	diffTable := func(title string, ds []chunkDiff) {
		if len(ds) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s\n", title)
		fmt.Fprintln(w, "POOL\tCOPYSET\tVOLUME\tCHUNK\tOFFSET\tDIFFERING\tCRC32C BY MEMBER")
		for _, d := range ds {
			vol := fmt.Sprint(d.Volume)
			if d.VolumeName != "" {
				vol = fmt.Sprintf("%s (%d)", d.VolumeName, d.Volume)
			}
			crcs := make([]string, len(d.Replicas))
			for i, rc := range d.Replicas {
				crcs[i] = scrub.FormatReplica(rc)
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\t%s\t%s\n", d.PoolName, d.Copyset, vol, d.Index, d.Offset,
				joinIDs(d.Differ), strings.Join(crcs, " "))
		}
	}
	diffTable("replicas differ:", r.Differences)
	diffTable("kept changing while re-checked (not judged; run again when quiet):", r.Unsettled)
	if len(r.Unreachable) > 0 {
		fmt.Fprintf(w, "\ncould not be asked:\n")
		fmt.Fprintln(w, "MEMBER\tADDRESS\tCOPYSETS\tERROR")
		for _, u := range r.Unreachable {
			cs := strings.Join(u.Copysets, ",")
			if n := len(u.Copysets); n > 4 {
				cs = fmt.Sprintf("%d: %s,…", n, strings.Join(u.Copysets[:3], ","))
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", u.Member, u.Addr, cs, u.Err)
		}
	}
	if err := r.err(); err == nil {
		fmt.Fprintln(w, "\nall replicas agree")
	}
}

func joinIDs(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, ",")
}
