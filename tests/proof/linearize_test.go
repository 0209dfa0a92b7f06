package proof

import (
	"context"
	"math/rand"
	"os"
	"path/filepath"
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
)

// blockOffset places block b in chunk 2b (8 of the volume's 16 chunks, so
// most copysets hold one), at a different 4 KiB slot in each.
func blockOffset(b int) int64 {
	return int64(2*b)*chunkSize + int64(b%4)*linearize.BlockSize
}

// TestLinearizable runs concurrent clients writing and reading 8 blocks
// (porcupine's per-block register model, internal/linearize) while faults hit
// a three-chunkserver cluster, in a seeded order: kill -9 of a chunkserver,
// SIGSTOP of the busiest leader for 4 s, a writer takeover (a second session
// opens the volume; the first is fenced), kill -9 and restart of the MDS.
// The whole history must be linearizable. On failure, porcupine's HTML view
// and the cluster's directories are kept (the path is logged).
//
// Every client reads every block, but writes only the blocks it owns (b mod
// 4): a write in flight is never concurrent with another write to its block.
// A retried write can be applied twice today (docs/reliability.md, "A retried
// write applied twice"), which only a concurrent write to the same block can
// see; BASALT_PROOF_SHARED_WRITES=1 lets every client write every block and
// finds it.
func TestLinearizable(t *testing.T) {
	s0 := seed(t)
	shared := os.Getenv("BASALT_PROOF_SHARED_WRITES") != ""
	rng := rand.New(rand.NewSource(s0))
	c := testcluster.Start(t, testcluster.Options{ChunkSize: chunkSize})
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
				if write && !shared {
					b = i + linClients*r.Intn(linBlocks/linClients)
				}
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

	faults := []string{"kill", "pause", "takeover", "mds"}
	rng.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	t.Logf("faults in order: %v", faults)
	pace := func() { time.Sleep(time.Duration(1000+rng.Intn(2000)) * time.Millisecond) }
	pace()
	for _, f := range faults {
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
			t.Logf("FAULT kill -9 the MDS, restart it")
			c.Kill(c.MDS)
			pace()
			c.Start(c.MDS)
			c.Eventually(90*time.Second, "the MDS back", func(ctx context.Context) error {
				_, err := c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
				return err
			})
		}
		t.Logf("HEALED %s", f)
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
	start := time.Now()
	ops := rec.Operations()
	res, info := linearize.Check(ops, 5*time.Minute)
	t.Logf("porcupine: %s in %s", res, time.Since(start).Round(time.Millisecond))
	if res != porcupine.Ok {
		t.Errorf("the history is not linearizable (%s), seed %d:\n%s", res, s0, linearize.Explain(ops, 25, time.Minute))
		keepArtifacts(t, c, func(dir string) {
			p := filepath.Join(dir, "history.html")
			if err := linearize.Visualize(info, p); err != nil {
				t.Logf("visualize: %v", err)
			} else {
				t.Logf("porcupine's view of the history: %s", p)
			}
		})
	}
}
