package proof

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/basalt-storage/basalt/internal/linearize"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/api"
)

const (
	linClients = 4
	linBlocks  = 8
	// linFaultsCI faults of linFaults run in one test-command run.
	linFaultsCI = 5
)

// linFaults are TestLinearizable's faults (see there).
var linFaults = []string{"kill", "pause", "takeover", "mds", "mdspause", "partition", "diskfull", "move", "powercut"}

// chooseFaults returns the faults of this run, in their order:
// BASALT_PROOF_FAULTS (all, or a comma-separated list, in its order; a fault
// may repeat), or a seeded choice
// of linFaultsCI. Without lazyfs, diskfull and powercut cannot run; with one
// MDS (no etcd installed), mds and mdspause cannot.
func chooseFaults(t *testing.T, rng *rand.Rand, lazy, standby bool) []string {
	t.Helper()
	var out []string
	for _, f := range linFaults {
		if (lazy || (f != "diskfull" && f != "powercut")) && (standby || !strings.HasPrefix(f, "mds")) {
			out = append(out, f)
		}
	}
	if !lazy {
		t.Logf("no lazyfs here: diskfull and powercut left out")
	}
	if !standby {
		t.Logf("no etcd installed (Debian package etcd-server; scripts/install-deps installs it): one MDS, mds and mdspause left out")
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	switch e := os.Getenv("BASALT_PROOF_FAULTS"); e {
	case "all":
	case "":
		out = out[:min(linFaultsCI, len(out))]
	default:
		var chosen []string
		for _, f := range strings.Split(e, ",") {
			if !slices.Contains(linFaults, f) {
				t.Fatalf("BASALT_PROOF_FAULTS: no fault %q (have %v)", f, linFaults)
			}
			if slices.Contains(out, f) {
				chosen = append(chosen, f)
			}
		}
		out = chosen
	}
	t.Logf("faults in order: %v", out)
	return out
}

// diskFull waits until the MDS hears chunkserver p (MDS id id) report a full
// disk, failing the test if p exits instead: a full disk must stop replicas,
// never the process.
func diskFull(t *testing.T, c *testcluster.Cluster, p *testcluster.Proc, id uint64) {
	t.Helper()
	start := time.Now()
	c.Eventually(90*time.Second, p.Name+" reporting a full disk", func(ctx context.Context) error {
		if code, exited := p.ExitCode(); exited {
			log := p.Log()
			t.Fatalf("%s exited (code %d) on a full disk; log tail:\n%s", p, code, log[max(0, len(log)-6000):])
		}
		st, err := c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		for _, cs := range st.Chunkservers {
			if cs.Id == id && cs.DiskState == api.DiskState_DISK_STATE_FULL {
				return nil
			}
		}
		return fmt.Errorf("%s does not report a full disk", p)
	})
	t.Logf("%s reports a full disk after %s", p, time.Since(start).Round(time.Millisecond))
}

// blockOffset places block b in chunk 2b (8 of the volume's 16 chunks, so
// most copysets hold one), at a different 4 KiB slot in each.
func blockOffset(b int) int64 {
	return int64(2*b)*chunkSize + int64(b%4)*linearize.BlockSize
}

// TestLinearizable runs concurrent clients writing and reading 8 blocks
// (porcupine's per-block register model, internal/linearize) while faults hit
// a cluster of three chunkservers, each on a lazyfs and behind a TCP proxy of
// the test, and two MDS (active and standby), in a seeded order (docs/reliability.md, "Proof: a
// linearizability checker"):
//
//	kill       kill -9 of a chunkserver, restarted 1–3 s later
//	pause      SIGSTOP of the busiest leader for 4 s
//	takeover   a second session opens the volume; the first is fenced
//	mds        MDS failover: kill -9 of the active MDS of two (on an external
//	           etcd); the standby takes over (the time until it answers is
//	           logged), the killed one is restarted 1–3 s later as the standby
//	mdspause   MDS failover from a hung MDS: SIGSTOP of the active MDS until
//	           the standby answers, continued 1–3 s later (it must step down)
//	partition  the busiest leader cut off its peers and clients (both ways,
//	           testcluster.Isolate) until it leads nothing, then healed
//	diskfull   one chunkserver's lazyfs fails every write with ENOSPC until
//	           the MDS hears "disk full"; then space is freed and it restarts
//	move       a fourth chunkserver joins; the scheduler moves copyset
//	           replicas onto it (two moves done before the next fault)
//	powercut   every chunkserver loses power at once (kill -9, lazyfs forgets
//	           what was not fsynced, restart)
//
// The test command runs a seeded choice of linFaultsCI of them; soak runs all
// (BASALT_PROOF_FAULTS=all, or a comma-separated list). Without FUSE, diskfull
// and powercut are left out, without etcd mds and mdspause (logged). The whole history must be linearizable.
// On failure, porcupine's HTML view and the cluster's directories are kept
// (the path is logged).
//
// Every client reads and writes every block, so writes to a block are
// concurrent with each other: a write retried after its leader died must not
// land again after newer ones (docs/reliability.md, "a retried write applied
// twice", which this found).
func TestLinearizable(t *testing.T) {
	s0 := seed(t)
	rng := rand.New(rand.NewSource(s0))
	opts := testcluster.Options{ChunkSize: chunkSize, Proxy: true, MDSFlags: []string{"--schedule-interval=1s"}}
	if _, err := exec.LookPath("etcd"); err == nil {
		// Two MDS on an external etcd, for the mds fault's failover.
		etcd := testcluster.StartEtcd(t, 1)
		opts.MDSCount, opts.EtcdEndpoints, opts.TLSDir = 2, etcd.Endpoints, etcd.TLSDir
	}
	c, fss := startOnLazyfs(t, opts)
	faults := chooseFaults(t, rng, fss != nil, len(c.MDSs) > 1)
	t.Cleanup(c.Heal)
	kept := false
	t.Cleanup(func() { // a fault that failed the test: keep what the cluster left
		if t.Failed() && !kept {
			keepArtifacts(t, c, nil)
		}
	})
	c.CreateVolume("lin", volSize)
	sess := newSession(t, c, "lin")
	rec := linearize.NewRecorder()
	var errs errCounts

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range linClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(s0 + int64(i) + 1))
			buf := make([]byte, linearize.BlockSize)
			for seq := uint64(1); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				v := sess.current()
				b := r.Intn(linBlocks)
				write := r.Intn(2) == 0
				var err error
				if write {
					val := uint64(i+1)<<40 | seq
					call := rec.Invoke(i, linearize.Input{Block: b, Write: true, Value: val})
					if _, err = v.WriteAt(linearize.Encode(val), blockOffset(b)); err == nil {
						call.Ok(0)
					} else {
						call.Fail(err)
					}
				} else {
					call := rec.Invoke(i, linearize.Input{Block: b})
					if _, err = v.ReadAt(buf, blockOffset(b)); err == nil {
						call.Ok(linearize.Decode(buf))
					} else {
						call.Fail(err)
					}
				}
				if err != nil {
					errs.add(err)
					if isFinal(v, err) {
						sess.failed(v)
					}
					time.Sleep(20 * time.Millisecond)
				}
				// A short pause keeps the history small enough to check.
				time.Sleep(time.Duration(r.Intn(3)) * time.Millisecond)
			}
		}()
	}
	stopped := false
	stopClients := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(stopClients)

	pace := func() { time.Sleep(time.Duration(1000+rng.Intn(2000)) * time.Millisecond) }
	pace()
	for _, f := range faults {
		start := time.Now()
		switch f {
		case "kill":
			p := c.CS[rng.Intn(len(c.CS))]
			t.Logf("FAULT kill -9 %s", p)
			c.Kill(p)
			pace()
			c.Start(p)
			c.WaitHealthy(90 * time.Second)
		case "pause":
			p := c.MostLeaders()
			t.Logf("FAULT SIGSTOP %s (leads %d copysets) for 4 s", p, c.Leaders()[p])
			c.Pause(p)
			time.Sleep(4 * time.Second)
			c.Resume(p)
			c.WaitHealthy(90 * time.Second)
		case "takeover":
			t.Logf("FAULT writer takeover: a second session opens the volume")
			sess.takeOver()
		case "mds":
			old := c.ActiveMDS()
			t.Logf("FAULT MDS failover: kill -9 the active MDS %s", old)
			c.Kill(old)
			p, took := c.AwaitFailover(old, start, 90*time.Second)
			elected := "?"
			if at, ok := c.LogTimeAfter(p, "MDS became active", start); ok {
				elected = at.Sub(start).Round(time.Millisecond).String()
			}
			// A figure, never asserted: about the election TTL (3 s).
			t.Logf("MDS FAILOVER: %s active %s after the kill, first call answered after %s",
				p, elected, took.Round(time.Millisecond))
			pace()
			c.Start(old)
			c.AwaitStandby(old, p, 90*time.Second)
			t.Logf("%s restarted, a standby of %s", old, p)
		case "mdspause":
			// A hung MDS, not a dead one: its connections stay open and
			// calls to it wait, so the others must stop waiting on it.
			old := c.ActiveMDS()
			t.Logf("FAULT MDS failover from a hung MDS: SIGSTOP the active MDS %s", old)
			c.Pause(old)
			p, took := c.AwaitFailover(old, start, 90*time.Second)
			t.Logf("MDS FAILOVER (hung): %s answered its first call %s after the SIGSTOP", p, took.Round(time.Millisecond))
			pace()
			c.Resume(old)
			c.AwaitStandby(old, p, 90*time.Second)
			t.Logf("%s continued, a standby of %s", old, p)
		case "partition":
			p := c.MostLeaders()
			t.Logf("FAULT partition: %s (leads %d copysets) cut off its peers and clients", p, c.Leaders()[p])
			in, out := c.Isolate(p)
			t.Logf("cut %d connections to %s and %d from it to its peers", in, p, out)
			// Proof that the cut is real: the others elect new leaders.
			c.Eventually(90*time.Second, p.Name+" leading nothing", func(context.Context) error {
				if n := c.Leaders()[p]; n > 0 {
					return fmt.Errorf("%s still leads %d copysets", p, n)
				}
				return nil
			})
			t.Logf("%s leads nothing after %s", p, time.Since(start).Round(time.Millisecond))
			pace()
			c.Heal()
			c.WaitHealthy(90 * time.Second)
		case "diskfull":
			i := rng.Intn(len(c.CS))
			p, id := c.CS[i], c.IDOf(c.CS[i])
			t.Logf("FAULT disk full: %s's file system fails every write with ENOSPC", p)
			fss.fs(i).SetFull(true)
			diskFull(t, c, p, id)
			t.Logf("%s's log: %d raft groups stopped by a disk error", p, c.CountLog(p, "group stopped by a disk error"))
			pace()
			fss.fs(i).SetFull(false)
			// Its stopped replicas come back with a restart (SIGTERM: a
			// clean stop must work on a full disk too).
			stopStart := time.Now()
			c.Stop(p)
			code, _ := p.ExitCode()
			t.Logf("space freed; %s stopped in %s (exit code %d), restarting it", p, time.Since(stopStart).Round(time.Millisecond), code)
			c.Start(p)
			c.WaitHealthy(90 * time.Second)
		case "move":
			t.Logf("FAULT membership moves: a fourth chunkserver joins")
			p := c.AddChunkserver()
			id := c.IDOf(p)
			c.Eventually(120*time.Second, "two copysets moved onto "+p.Name, func(context.Context) error {
				if n := c.Placement().Members[id]; n < 2 {
					return fmt.Errorf("%s is a member of %d copysets", p, n)
				}
				return nil
			})
			t.Logf("%s holds %d replicas after %s", p, c.Placement().Members[id], time.Since(start).Round(time.Millisecond))
		case "powercut":
			t.Logf("FAULT power cut of all %d chunkservers", len(c.CS))
			files, entries := fss.cut(t, c)
			t.Logf("the power cut took back unsynced data of %d files and %d directory changes", files, entries)
			c.WaitHealthy(90 * time.Second)
		}
		// Healed means IO flows again (the MDS may not have noticed a
		// chunkserver gone and back when WaitHealthy returns).
		w0, _, r0 := rec.Counts()
		c.Eventually(90*time.Second, "IO after "+f, func(context.Context) error {
			if w, _, r := rec.Counts(); w < w0+20 || r < r0+20 {
				return fmt.Errorf("%d writes and %d reads acknowledged since", w-w0, r-r0)
			}
			return nil
		})
		t.Logf("HEALED %s in %s", f, time.Since(start).Round(time.Millisecond))
		pace()
	}
	stopClients()
	// A last read of every block, by a client of its own.
	v := sess.current()
	if v.Err() != nil {
		sess.failed(v)
		v = sess.current()
	}
	buf := make([]byte, linearize.BlockSize)
	for b := range linBlocks {
		call := rec.Invoke(linClients, linearize.Input{Block: b})
		if _, err := v.ReadAt(buf, blockOffset(b)); err != nil {
			call.Fail(err)
			t.Errorf("final read of block %d: %v", b, err)
			continue
		}
		call.Ok(linearize.Decode(buf))
	}

	w, pending, reads := rec.Counts()
	t.Logf("history: %d acknowledged writes, %d writes of unknown outcome, %d reads; %d reopens, %d takeovers; errors:\n%s",
		w, pending, reads, sess.reopens, sess.takeover, errs.String())
	if w < 100 || reads < 100 {
		t.Errorf("too little IO completed to judge: %d writes, %d reads", w, reads)
	}
	retried := 0
	for _, p := range c.CS {
		retried += c.CountLog(p, "retried request not applied again")
	}
	t.Logf("retried requests a replica did not apply again (answered OK or STALE_REQUEST): %d", retried)
	start := time.Now()
	ops := rec.Operations()
	res, info := linearize.Check(ops, 5*time.Minute)
	t.Logf("porcupine: %s in %s", res, time.Since(start).Round(time.Millisecond))
	if res != porcupine.Ok {
		t.Errorf("the history is not linearizable (%s), seed %d:\n%s", res, s0, linearize.Explain(ops, 25, time.Minute))
		kept = true
		keepArtifacts(t, c, func(dir string) {
			p := filepath.Join(dir, "history.html")
			if err := linearize.Visualize(info, p); err != nil {
				t.Logf("visualize: %v", err)
			} else {
				t.Logf("porcupine's view of the history: %s", p)
			}
		})
		return
	}
	// After full disks, power cuts and moves: every copyset's replicas agree.
	c.CompareReplicas(90 * time.Second)
}
