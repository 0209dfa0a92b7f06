package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

const (
	volSize   = 64 << 20 // 16 chunks of 4 MiB over 8 copysets
	chunkSize = 4 << 20
	warmUp    = 3 * time.Second // the "before" phase
	cooldown  = 3 * time.Second // the "after" phase
)

// fc is one fault case: a cluster, a volume and a workload on it.
type fc struct {
	t *testing.T
	c *testcluster.Cluster
	v *client.Volume
	w *testcluster.Workload
}

func start(t *testing.T, opts testcluster.Options) *fc { return startSized(t, opts, volSize) }

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("fault-injection case with real processes: -short")
	}
}

func startSized(t *testing.T, opts testcluster.Options, size uint64) *fc {
	skipShort(t)
	opts.ChunkSize = chunkSize
	c := testcluster.Start(t, opts)
	// BASALT_FAULTS_IO_TIMEOUT sets the client's per-attempt timeout (default
	// client.DefaultIOTimeout), to see how it bounds the stall of a hung leader.
	if s := os.Getenv("BASALT_FAULTS_IO_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("BASALT_FAULTS_IO_TIMEOUT: %v", err)
		}
		c.IOTimeout = d
	}
	c.CreateVolume("vol", size)
	return &fc{t: t, c: c, v: c.Open("vol", false)}
}

// run starts the workload and lets it run for the "before" phase.
func (f *fc) run(wopts testcluster.WorkloadOptions) {
	f.w = testcluster.StartWorkload(f.t, f.v, wopts)
	f.t.Cleanup(f.w.Stop) // a failing test still stops its writers before the cluster goes
	time.Sleep(warmUp)
}

// fault marks the fault's moment.
func (f *fc) fault(format string, args ...any) {
	f.w.Mark("fault")
	f.t.Logf("FAULT: "+format, args...)
}

// healed marks the moment the cluster is whole again.
func (f *fc) healed() {
	f.w.Mark("healed")
	f.t.Logf("HEALED")
}

// progress fails the test unless the workload completes another IO within d
// (a liveness bound, generous on purpose).
func (f *fc) progress(d time.Duration, what string) {
	f.t.Helper()
	n := f.w.Acked()
	deadline := time.Now().Add(d)
	for f.w.Acked() <= n+10 {
		if time.Now().After(deadline) {
			f.t.Fatalf("no IO completed within %s %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reopenIfLapsed reopens the volume when the workload's session lease lapsed
// (the client stops issuing IO by itself then, docs/design.md §6), as an application
// would, and says whether it did.
func (f *fc) reopenIfLapsed() bool {
	if !errors.Is(f.w.LastErr(), client.ErrLeaseExpired) {
		return false
	}
	f.v = f.c.Open("vol", false)
	f.w.Reopen(f.v)
	return true
}

// finish runs the "after" phase, stops the workload, checks every acknowledged
// write and the replicas, and reports the figures.
func (f *fc) finish(note string) testcluster.Figures {
	f.t.Helper()
	time.Sleep(cooldown)
	f.w.Stop()
	fig := f.w.Figures(f.t.Name())
	fig.Note = note
	fig.Report(f.t)
	f.w.Verify(f.v)
	f.c.CompareReplicas(90 * time.Second)
	if os.Getenv("BASALT_FAULTS_DUMP") != "" {
		f.c.DumpLogs()
	}
	return fig
}

// chunksNotLedBy returns the chunks of the volume whose copysets p does not lead.
func (f *fc) chunksNotLedBy(p *testcluster.Proc) []int64 {
	led := f.c.CopysetsLedBy(f.c.IDOf(p))
	var out []int64
	for i := int64(0); i < volSize/chunkSize; i++ {
		if !led[api.CopysetOf(f.v.ID(), uint64(i), f.c.Pool.CopysetCount)] {
			out = append(out, i)
		}
	}
	return out
}

// 1. kill -9 a follower: IO must not stall. The workload touches only chunks
// whose copysets the victim does not lead (with three chunkservers every one is
// a member of every copyset, and each usually leads some).
func TestKillFollower(t *testing.T) {
	// No balancing: the leader balancer would hand the victim, which leads the
	// fewest copysets, leaderships during the warm-up.
	f := start(t, testcluster.Options{MDSFlags: []string{"--balance=false"}})
	victim := f.c.FewestLeaders()
	n := f.c.Leaders()[victim]
	chunks := f.chunksNotLedBy(victim)
	if len(chunks) == 0 {
		t.Fatalf("%s leads every copyset", victim)
	}
	f.run(testcluster.WorkloadOptions{ChunkSize: chunkSize, Chunks: chunks, Seed: 1})
	f.c.Kill(victim)
	f.fault("kill -9 %s, a follower of the %d chunks in use", victim, len(chunks))
	f.progress(10*time.Second, "after a follower died")
	time.Sleep(5 * time.Second)
	f.c.Start(victim)
	f.c.WaitHealthy(60 * time.Second)
	f.healed()
	f.finish(fmt.Sprintf("victim led %d of 8 copysets; the workload used the %d chunks of the others", n, len(chunks)))
}

// 2. kill -9 the chunkserver that leads the most copysets.
func TestKillLeader(t *testing.T) {
	f := start(t, testcluster.Options{})
	f.run(testcluster.WorkloadOptions{Seed: 2})
	victim := f.c.MostLeaders() // chosen now: the balancer moves leaders
	n := f.c.Leaders()[victim]
	f.c.Kill(victim)
	f.fault("kill -9 %s, leader of %d copysets", victim, n)
	f.progress(20*time.Second, "after a leader died")
	time.Sleep(5 * time.Second)
	f.c.Start(victim)
	f.c.WaitHealthy(60 * time.Second)
	f.healed()
	f.finish(fmt.Sprintf("victim led %d of 8 copysets", n))
}

// 3. SIGSTOP the busiest leader for 10 s, then SIGCONT: a gray failure (its
// sockets stay open, nothing is refused).
func TestPauseLeader(t *testing.T) {
	f := start(t, testcluster.Options{})
	f.run(testcluster.WorkloadOptions{Seed: 3})
	victim := f.c.MostLeaders() // chosen now: the balancer moves leaders
	n := f.c.Leaders()[victim]
	f.c.Pause(victim)
	f.fault("SIGSTOP %s, leader of %d copysets, for 10 s", victim, n)
	f.progress(20*time.Second, "while a leader is paused")
	time.Sleep(10 * time.Second)
	f.c.Resume(victim)
	t.Logf("SIGCONT %s", victim)
	f.c.WaitHealthy(60 * time.Second)
	f.healed()
	f.finish(fmt.Sprintf("victim led %d of 8 copysets; paused 10 s", n))
}

// 4. Partition the busiest leader from its followers (it still reaches the MDS
// and the client). With CheckQuorum it steps down; the others elect a leader.
func TestPartitionLeader(t *testing.T) {
	skipShort(t)
	net := testcluster.InNetns(t, testcluster.NetNodes(1, 3)...)
	if net == nil {
		return
	}
	f := start(t, testcluster.Options{Net: net})
	f.run(testcluster.WorkloadOptions{Seed: 4})
	victim := f.c.MostLeaders() // chosen now: the balancer moves leaders
	n := f.c.Leaders()[victim]
	for _, p := range f.c.CS {
		if p != victim {
			net.Partition(t, victim.Name, p.Name)
		}
	}
	f.fault("%s, leader of %d copysets, cut off from the other chunkservers for 10 s", victim, n)
	f.progress(20*time.Second, "while a leader is partitioned from its followers")
	time.Sleep(10 * time.Second)
	net.Heal(t)
	f.c.WaitHealthy(60 * time.Second)
	f.healed()
	f.finish(fmt.Sprintf("victim led %d of 8 copysets; partitioned 10 s", n))
}

// 5. Partition the client from the busiest leader (the leader still reaches its
// followers and the MDS, so nothing elects a new leader).
func TestPartitionClient(t *testing.T) {
	skipShort(t)
	net := testcluster.InNetns(t, testcluster.NetNodes(1, 3)...)
	if net == nil {
		return
	}
	f := start(t, testcluster.Options{Net: net})
	f.run(testcluster.WorkloadOptions{Seed: 5})
	victim := f.c.MostLeaders() // chosen now: the balancer moves leaders
	n := f.c.Leaders()[victim]
	net.Partition(t, "ctl", victim.Name)
	f.fault("client cut off from %s, leader of %d copysets, for 10 s", victim, n)
	time.Sleep(10 * time.Second)
	stalled := f.w.Acked()
	net.Heal(t)
	f.progress(30*time.Second, "after the client's partition healed")
	f.c.WaitHealthy(60 * time.Second)
	f.healed()
	f.finish(fmt.Sprintf("victim led %d of 8 copysets; partitioned 10 s; %d IOs acknowledged by the end of the partition",
		n, stalled))
}

// 6. Power loss: kill -9 every process at once, restart them all.
func TestPowerLoss(t *testing.T) {
	f := start(t, testcluster.Options{})
	f.run(testcluster.WorkloadOptions{Seed: 6})
	procs := append([]*testcluster.Proc{f.c.MDS}, f.c.CS...)
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); f.c.Kill(p) }()
	}
	wg.Wait()
	f.fault("kill -9 the MDS and every chunkserver at once")
	time.Sleep(time.Second)
	for _, p := range procs {
		f.c.Start(p)
	}
	f.c.WaitHealthy(60 * time.Second)
	note := "all processes down for 1 s"
	if f.reopenIfLapsed() {
		note += "; the client's 6 s session lease lapsed while the MDS restarted, the volume was reopened"
	}
	f.progress(60*time.Second, "after every process restarted")
	f.healed()
	f.finish(note)
}

// 7. A slow disk: every WAL fdatasync of the busiest leader takes 50 ms longer
// for 10 s.
func TestSlowDisk(t *testing.T) {
	f := start(t, testcluster.Options{SlowDiskKnob: true})
	f.run(testcluster.WorkloadOptions{Seed: 7})
	victim := f.c.MostLeaders() // chosen now: the balancer moves leaders
	n := f.c.Leaders()[victim]
	f.c.SetSlowDisk(victim, 50*time.Millisecond)
	f.fault("+50 ms on every WAL fdatasync of %s, leader of %d copysets, for 10 s", victim, n)
	f.progress(20*time.Second, "with a slow disk")
	time.Sleep(10 * time.Second)
	f.c.SetSlowDisk(victim, 0)
	f.healed()
	after := f.c.Leaders()[victim]
	f.finish(fmt.Sprintf("victim led %d of 8 copysets before, %d after the slow phase", n, after))
}

// 8. A full disk: one of four chunkservers has its data directory on a 140 MiB
// tmpfs, which the workload fills. Its replicas stop; it must say so in its
// status ("disk full"), the MDS must move its copysets to the others, and the
// client must not see the trouble. Healing: the tmpfs grows, the chunkserver
// restarts.
func TestFullDisk(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	var fullDir string
	f := start(t, testcluster.Options{
		Chunkservers:     4,
		MDSFlags:         []string{"--schedule-interval=1s"},
		ChunkserverFlags: []string{"--snapshot-entries=500"},
		PrepareChunkserver: func(i int, dir string) {
			if i != 0 {
				return
			}
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=140m", "basalt-full", dir).CombinedOutput(); err != nil {
				t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
			}
			fullDir = dir
			t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
		}})
	victim := f.c.CS[0]
	id := f.c.IDOf(victim)
	f.run(testcluster.WorkloadOptions{Seed: 8, MaxBlocks: 16})
	f.fault("%s's data directory is a 140 MiB tmpfs; writing until it is full", victim)
	faultAt := time.Now()
	// Wait until the MDS moved every copyset off the full chunkserver, noting
	// whether it ever reported its disk trouble.
	var state api.DiskState
	var df string
	reported, moved := false, false
	var movedAfter time.Duration
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && !moved; time.Sleep(500 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := f.c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		cancel()
		if err != nil {
			continue
		}
		for _, cs := range st.Chunkservers {
			if cs.Id == id {
				state = cs.DiskState
				reported = reported || state == api.DiskState_DISK_STATE_FULL || state == api.DiskState_DISK_STATE_IO_ERROR
			}
		}
		on := 0
		for _, cs := range st.Copysets {
			if containsID(cs.Members, id) {
				on++
			}
		}
		if on == 0 && st.CopysetsHealthy == uint32(len(st.Copysets)) {
			moved = true
			movedAfter = time.Since(faultAt)
		}
	}
	out, _ := exec.Command("df", "-h", "--output=used,avail", fullDir).Output()
	df = strings.Join(strings.Fields(string(out)), " ")
	errsFull := f.w.Errors()
	if !reported {
		t.Errorf("%s never reported its full disk: its disk state stayed %v (df: %s)", victim, state, df)
	}
	if !moved {
		t.Errorf("the MDS did not move the copysets off the full %s within 60 s (df: %s)", victim, df)
	} else {
		t.Logf("every copyset moved off %s, %s after the fault (its disk state: %v; df: %s)", victim, movedAfter.Round(100*time.Millisecond), state, df)
	}
	f.progress(20*time.Second, "with one replica's disk full")
	if out, err := exec.Command("mount", "-o", "remount,size=1g", fullDir).CombinedOutput(); err != nil {
		t.Fatalf("grow the tmpfs: %v: %s", err, out)
	}
	f.c.Stop(victim)
	f.c.Start(victim)
	f.c.WaitHealthy(90 * time.Second)
	f.healed()
	f.finish(fmt.Sprintf("the full replica's disk state: %v; copysets moved off it: %v (%s); client errors while full: %v; healed by growing the tmpfs and restarting it",
		state, moved, movedAfter.Round(100*time.Millisecond), errsFull))
}

// 8b. Every replica's disk fills up (three 160 MiB tmpfs): the client must get
// an error, not a hang (no IO waits 10 s for an answer), and after the disks grow and the chunkservers restart,
// every acknowledged write is there.
func TestFullDiskEverywhere(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	var dirs []string
	f := start(t, testcluster.Options{
		ChunkserverFlags: []string{"--snapshot-entries=500"},
		PrepareChunkserver: func(i int, dir string) {
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=160m", "basalt-full", dir).CombinedOutput(); err != nil {
				t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
			}
			dirs = append(dirs, dir)
			t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
		}})
	f.run(testcluster.WorkloadOptions{Seed: 11, MaxBlocks: 16})
	f.fault("every chunkserver's data directory is a 160 MiB tmpfs; writing until they are full")
	// Full: the first IO failed (give up after 90 s); then 5 s to see how IO fails.
	deadline := time.Now().Add(90 * time.Second)
	for f.w.LastErr() == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	before := f.w.Acked()
	time.Sleep(15 * time.Second)
	t.Logf("in the 15 s after the first failure, %d IOs completed", f.w.Acked()-before)
	if old := f.w.OldestInFlight(); old > 10*time.Second {
		t.Errorf("an IO has waited %s for an answer with every disk full: a hang, not an error", old.Round(100*time.Millisecond))
	}
	errsFull := f.w.Errors()
	t.Logf("disks full: the client saw %v, %d of them timeouts", errsFull, f.w.Timeouts())
	if f.w.Timeouts() > 0 {
		t.Errorf("%d IOs hung until the client's deadline instead of failing with an error", f.w.Timeouts())
	}
	if len(errsFull) == 0 {
		t.Errorf("no IO failed in 90 s of writing onto three 160 MiB disks")
	}
	for _, d := range dirs {
		if out, err := exec.Command("mount", "-o", "remount,size=1g", d).CombinedOutput(); err != nil {
			t.Fatalf("grow the tmpfs: %v: %s", err, out)
		}
	}
	for _, p := range f.c.CS {
		f.c.Stop(p)
		f.c.Start(p)
	}
	f.c.WaitHealthy(90 * time.Second)
	f.healed()
	f.finish(fmt.Sprintf("client errors while full: %v; healed by growing the tmpfs and restarting every chunkserver", errsFull))
}

// 9. kill -9 the active MDS of three, on an external three-member etcd: a
// standby takes over and IO never waits for it.
func TestKillActiveMDS(t *testing.T) {
	skipShort(t)
	etcd := testcluster.StartEtcd(t, 3)
	f := start(t, testcluster.Options{MDSCount: 3, EtcdEndpoints: etcd.Endpoints, TLSDir: etcd.TLSDir})
	victim := f.c.ActiveMDS()
	f.run(testcluster.WorkloadOptions{Seed: 9})
	killed := time.Now()
	f.c.Kill(victim)
	f.fault("kill -9 the active MDS %s", victim)
	active, takeover := f.c.AwaitFailover(victim, killed, 60*time.Second)
	t.Logf("%s took over after %s", active, takeover.Round(time.Millisecond))
	// The new active MDS serves the control plane: a new volume opens, and the
	// workload's session lease (6 s) is renewed past its end.
	f.c.CreateVolume("after-failover", 16<<20)
	v2 := f.c.Open("after-failover", false)
	if _, err := v2.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("write through a session opened after the failover: %v", err)
	}
	time.Sleep(8 * time.Second) // past the workload's 6 s session lease
	note := fmt.Sprintf("standby active after %s", takeover.Round(time.Millisecond))
	if f.reopenIfLapsed() {
		t.Errorf("IO stopped: the workload's session lease (6 s) lapsed during the MDS failover (standby active after %s); "+
			"last error %v", takeover.Round(time.Millisecond), f.w.LastErr())
		note += "; FAILED: the client's session lease lapsed, IO stopped until the volume was reopened"
	}
	f.progress(10*time.Second, "after the MDS failover")
	f.c.Start(victim)
	f.c.AwaitStandby(victim, active, 60*time.Second)
	f.c.WaitHealthy(60 * time.Second)
	f.healed()
	f.finish(note)
}

// 10. A chunkserver lost for good (kill -9, directory deleted) with a spare:
// after --recovery-grace its copysets are rebuilt on the others.
func TestLostChunkserver(t *testing.T) {
	const size = 256 << 20 // enough data for a rebuild rate
	f := startSized(t, testcluster.Options{Chunkservers: 4,
		MDSFlags: []string{"--recovery-grace=3s", "--schedule-interval=1s"}}, size)
	f.run(testcluster.WorkloadOptions{Seed: 10, Prefill: true})
	victim := f.c.MostLeaders()
	id := f.c.IDOf(victim)
	lost := 0
	for _, cs := range f.c.Status().Copysets {
		for _, m := range cs.Members {
			if m == id {
				lost++
			}
		}
	}
	var chunks int64
	for i := uint64(0); i < size/chunkSize; i++ {
		cs := api.CopysetOf(f.v.ID(), i, f.c.Pool.CopysetCount)
		for _, c := range f.c.Status().Copysets {
			if c.Id == cs && containsID(c.Members, id) {
				chunks++
			}
		}
	}
	f.c.Kill(victim)
	if err := os.RemoveAll(victim.DataDir); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	f.fault("kill -9 %s (member of %d copysets, holding %d written chunks) and delete its directory", victim, lost, chunks)
	f.progress(20*time.Second, "after a chunkserver was lost")
	f.c.Eventually(240*time.Second, "every copyset rebuilt without the lost chunkserver", func(ctx context.Context) error {
		st, err := f.c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		left := 0
		for _, cs := range st.Copysets {
			if containsID(cs.Members, id) {
				left++
			}
		}
		if left > 0 || st.CopysetsHealthy != uint32(len(st.Copysets)) {
			return fmt.Errorf("%d copysets still list chunkserver %d; %d/%d healthy", left, id, st.CopysetsHealthy, len(st.Copysets))
		}
		return nil
	})
	rebuild := time.Since(killed)
	f.healed()
	mib := float64(chunks*chunkSize) / (1 << 20)
	t.Logf("REBUILD: %d copysets (%.0f MiB of chunks) re-replicated %s after the loss (grace 3 s): %.1f MiB/s overall",
		lost, mib, rebuild.Round(time.Millisecond), mib/rebuild.Seconds())
	f.finish(fmt.Sprintf("rebuilt %d copysets, %.0f MiB, in %s incl. 3 s grace: %.1f MiB/s (%.1f MiB/s after the grace)",
		lost, mib, rebuild.Round(100*time.Millisecond), mib/rebuild.Seconds(), mib/(rebuild-3*time.Second).Seconds()))
}

func containsID(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
