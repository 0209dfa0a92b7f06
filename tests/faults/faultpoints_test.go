package faults

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/api"
)

// TestFaultPoints crashes a chunkserver at each named fault point
// (internal/faultpoint) in turn, on one cluster: the point is armed to fire
// on a given hit, a verified workload runs until it does (the process
// SIGKILLs itself there), the chunkserver is restarted, and then every
// copyset has its full voters and a leader again (the MDS's "healthy": every
// member online, the leader's configuration equal to the listed members),
// every acknowledged write of the case reads back and the replicas of every
// copyset agree.
//
//   - wal-before-sync, wal-after-sync, raft-before-send: on the chunkserver
//     leading the most copysets, mid-workload.
//   - wal-before-sync-hang, wal-before-sync-error: the same chunkserver's
//     WAL hangs in, or fails, an fdatasync (the process runs on). Every IO
//     in flight then is answered within 60 s and the workload flows: the
//     hung one hands its leaderships away (--wal-stall-timeout) and the
//     MDS hears its disk is failing, until the hang ends; the failed one's
//     replicas stop, the MDS hears its disk failed, and it is restarted.
//   - snapshot-install: a follower kept down until the others compacted
//     their logs past it is restarted armed, and crashes with half a
//     snapshot installed (the old chunks moved aside, the new ones not in
//     place).
//   - snapshot-send: the same follower kept down again; the others, armed,
//     crash 64 KiB into the first snapshot stream they send it.
//   - move-learner-added, then move-joint ("move"): a fourth chunkserver
//     joins and the balancer moves copysets onto it; the moving copyset's
//     leader crashes right after the new member was added as a learner, and
//     the leader that carries the move on crashes right after the joint
//     change (promote the learner, remove the old voter) applied. Every
//     move completes.
func TestFaultPoints(t *testing.T) {
	skipShort(t)
	began := time.Now()
	c := testcluster.Start(t, testcluster.Options{Copysets: 4, ChunkSize: chunkSize, FaultPoints: true,
		// No repair of a chunkserver kept down on purpose; a quick scheduler.
		MDSFlags: []string{"--schedule-interval=300ms", "--recovery-grace=10m", "--max-moves-per-chunkserver=1"},
		// Snapshots often, so that a follower kept down catches up through
		// one; no leadership hand-over at the clean stop of the cleanup.
		ChunkserverFlags: []string{"--snapshot-entries=64", "--catchup-entries=16", "--drain-timeout=-1s"}})
	t.Logf("cluster up in %s", time.Since(began).Round(time.Millisecond))

	// run is one case: a volume of its own and a verified workload on it;
	// fault injects the fault and returns once the crashed chunkservers run
	// again. Then the cluster must heal and the data check out.
	run := func(t *testing.T, seed int64, fault func(w *testcluster.Workload)) {
		start := time.Now()
		name := fmt.Sprintf("vol%d", seed)
		c.CreateVolume(name, 32<<20)
		v := c.Open(name, false)
		w := testcluster.StartWorkload(t, v, testcluster.WorkloadOptions{Writers: 4, Seed: seed})
		t.Cleanup(w.Stop)
		w.AwaitProgress(c, "the workload flowing")
		w.Mark("fault")
		fault(w)
		faulted := time.Now()
		c.WaitHealthy(120 * time.Second)
		fullVoters(t, c)
		w.Mark("healed")
		healed := time.Now()
		w.AwaitProgress(c, "the workload flowing after the heal")
		w.Stop()
		w.Verify(v)
		c.CompareReplicas(90 * time.Second)
		t.Logf("case took %s: fault injected and restarted %s, healthy %s later, checked %s later",
			time.Since(start).Round(time.Millisecond), faulted.Sub(start).Round(time.Millisecond),
			healed.Sub(faulted).Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	}
	// crash arms spec on procs, waits until one of them fired, disarms them
	// all and restarts every chunkserver that crashed.
	crash := func(t *testing.T, spec string, procs ...*testcluster.Proc) *testcluster.Proc {
		for _, p := range procs {
			c.ArmFaultPoints(p, spec)
		}
		fired := c.AwaitFaultPoint(90*time.Second, procs...)
		t.Logf("%s fired on %s", spec, fired)
		for _, p := range procs {
			c.ArmFaultPoints(p, "")
		}
		restartCrashed(t, c)
		return fired
	}
	// behind kills a follower and keeps it down until w wrote enough that
	// every copyset compacted its log past it (--snapshot-entries=64,
	// --catchup-entries=16): it can only catch up through a snapshot.
	behind := func(w *testcluster.Workload) *testcluster.Proc {
		x := c.FewestLeaders()
		c.Kill(x)
		// 1,000 IOs: about 800 writes, 200 per copyset (the volume's 8
		// chunks over 4 copysets), each an entry.
		for range 10 {
			w.AwaitProgress(c, "the workload flowing with a chunkserver down")
		}
		t.Logf("%s down, %d IOs acknowledged", x, w.Acked())
		return x
	}
	others := func(x *testcluster.Proc) []*testcluster.Proc {
		return slices.DeleteFunc(slices.Clone(c.CS), func(p *testcluster.Proc) bool { return p == x })
	}

	for i, point := range []string{"wal-before-sync", "wal-after-sync", "raft-before-send"} {
		t.Run(point, func(t *testing.T) {
			run(t, int64(i+1), func(*testcluster.Workload) {
				crash(t, point+"=crash@50", c.MostLeaders())
			})
		})
	}
	// fire arms spec on p and waits until it logged that the point fired (p
	// does not exit: the point hangs or fails).
	fire := func(t *testing.T, p *testcluster.Proc, spec string) {
		n := c.CountLog(p, "fault point fired")
		c.ArmFaultPoints(p, spec)
		c.Eventually(90*time.Second, spec+" firing on "+p.Name, func(context.Context) error {
			if c.CountLog(p, "fault point fired") <= n {
				return fmt.Errorf("%s has not fired yet", spec)
			}
			return nil
		})
		t.Logf("%s fired on %s", spec, p)
	}
	// ioGoesOn fails the test unless every IO in flight now is answered
	// within 60 s (the client's own deadline is 60 s) and the workload then
	// flows; it logs the stall (nothing asserted of it).
	ioGoesOn := func(t *testing.T, w *testcluster.Workload, what string) {
		since := time.Now()
		timeouts := w.Timeouts()
		c.Eventually(60*time.Second, "every IO in flight when "+what+" answered", func(context.Context) error {
			if o := w.OldestInFlight(); o >= time.Since(since) {
				return fmt.Errorf("an IO has been waiting %s", o.Round(time.Millisecond))
			}
			return nil
		})
		answered := time.Since(since)
		w.AwaitProgress(c, "the workload flowing after "+what)
		if n := w.Timeouts() - timeouts; n > 0 {
			t.Fatalf("%d IOs failed after waiting for an answer the client's whole deadline (%v)", n, w.LastErr())
		}
		f := w.Figures("")
		t.Logf("IO stall: every IO in flight when %s was seen answered %s later; since the fault was armed "+
			"the slowest IO took %s and no IO completed for %s at most",
			what, answered.Round(time.Millisecond), f.MaxLatency.Round(time.Millisecond), f.MaxGap.Round(time.Millisecond))
	}
	// diskFailing waits until the MDS lists p's disk as failing.
	diskFailing := func(p *testcluster.Proc) {
		id := c.IDOf(p)
		c.Eventually(60*time.Second, "the MDS seeing "+p.Name+"'s disk failing", func(context.Context) error {
			for _, cs := range c.Status().Chunkservers {
				if cs.Id == id && cs.DiskState != api.DiskState_DISK_STATE_IO_ERROR {
					return fmt.Errorf("%s's disk state %s", p, cs.DiskState)
				}
			}
			return nil
		})
	}
	// A disk that hangs: the WAL's fdatasync waits for ever, the process and
	// its sockets stay up. The stall watchdog (--wal-stall-timeout, 3 s)
	// hands its leaderships to the others and, 10 s later, reports its disk
	// as failing; IO goes on. Then the disk recovers.
	t.Run("wal-before-sync-hang", func(t *testing.T) {
		run(t, 7, func(w *testcluster.Workload) {
			x := c.MostLeaders()
			fire(t, x, "wal-before-sync=hang@50")
			ioGoesOn(t, w, "the WAL hung")
			c.Eventually(60*time.Second, x.Name+" leading no copyset", func(context.Context) error {
				if n := c.Leaders()[x]; n > 0 {
					return fmt.Errorf("%s leads %d copysets", x, n)
				}
				return nil
			})
			if c.CountLog(x, "WAL stalled") == 0 {
				t.Fatalf("%s did not log the stall", x)
			}
			diskFailing(x)
			c.ArmFaultPoints(x, "") // the disk answers again
			if _, exited := x.ExitCode(); exited {
				t.Fatalf("%s exited", x)
			}
		})
	})
	// A disk that fails an fdatasync: nothing of the failed batch is
	// acknowledged, the WAL takes no more writes and every replica of the
	// chunkserver stops (the process stays up and tells the MDS its disk
	// failed); the others elect leaders and IO goes on. The operator then
	// restarts it (the WAL is re-read from the disk).
	t.Run("wal-before-sync-error", func(t *testing.T) {
		run(t, 8, func(w *testcluster.Workload) {
			x := c.MostLeaders()
			fire(t, x, "wal-before-sync=error@50")
			ioGoesOn(t, w, "the WAL failed")
			if c.CountLog(x, "copyset replica stopped by a WAL error") == 0 {
				t.Fatalf("%s did not log its replicas stopping", x)
			}
			diskFailing(x)
			if _, exited := x.ExitCode(); exited {
				t.Fatalf("%s exited", x)
			}
			c.ArmFaultPoints(x, "")
			c.Kill(x)
			c.Start(x)
		})
	})
	t.Run("snapshot-install", func(t *testing.T) {
		run(t, 4, func(w *testcluster.Workload) {
			x := behind(w)
			c.ArmFaultPoints(x, "snapshot-install=crash")
			c.Start(x)
			c.AwaitFaultPoint(90*time.Second, x)
			c.ArmFaultPoints(x, "")
			c.Start(x)
		})
	})
	t.Run("snapshot-send", func(t *testing.T) {
		run(t, 5, func(w *testcluster.Workload) {
			x := behind(w)
			for _, p := range others(x) {
				c.ArmFaultPoints(p, "snapshot-send=crash")
			}
			c.Start(x)
			crash(t, "snapshot-send=crash", others(x)...)
		})
	})
	t.Run("move", func(t *testing.T) {
		run(t, 6, func(*testcluster.Workload) {
			old := slices.Clone(c.CS)
			for _, p := range old {
				c.ArmFaultPoints(p, "move-learner-added=crash")
			}
			c.AddChunkserver()
			first := c.AwaitFaultPoint(90*time.Second, old...)
			t.Logf("move-learner-added fired on %s", first)
			// The move goes on under a new leader, which must first be
			// elected (a second at least) and bring the learner up to date:
			// time enough to arm every chunkserver for the joint change.
			for _, p := range c.CS {
				c.ArmFaultPoints(p, "move-joint=crash")
			}
			restartCrashed(t, c)
			crash(t, "move-joint=crash", c.CS...)
			// Every move onto the new chunkserver completes: 12 replicas, 3 each.
			c.Eventually(180*time.Second, "copysets balanced onto the new chunkserver", func(context.Context) error {
				p := c.Placement()
				if lo, hi := testcluster.Spread(p.Members); hi != lo || p.Moves != 0 || p.Healthy != p.Total {
					return fmt.Errorf("copysets per chunkserver %v, %d moves in flight, %d/%d healthy", p.Members, p.Moves, p.Healthy, p.Total)
				}
				return nil
			})
		})
	})
	t.Logf("TestFaultPoints took %s", time.Since(began).Round(time.Millisecond))
}

// restartCrashed restarts every chunkserver whose process exited.
func restartCrashed(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	for _, p := range c.CS {
		if _, exited := p.ExitCode(); exited || p.PID() == 0 {
			c.Kill(p) // reaps it
			c.Start(p)
			t.Logf("%s restarted", p)
		}
	}
}

// fullVoters fails the test unless every copyset lists as many members as
// the pool's replica count, none of them moving.
func fullVoters(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.API.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: c.Pool.Id})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range r.Copysets {
		if len(cs.Members) != int(c.Pool.Replicas) || cs.Move != nil {
			t.Fatalf("copyset %d: members %v, move %v; want %d members and no move", cs.Id, cs.Members, cs.Move, c.Pool.Replicas)
		}
	}
}
