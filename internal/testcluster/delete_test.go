package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
)

// chunkFiles lists p's chunk files of volume vol, in every copyset it holds
// (the datastore layout, internal/datastore/doc.go).
func chunkFiles(p *Proc, vol uint64) []string {
	m, _ := filepath.Glob(filepath.Join(p.DataDir, "data", "copysets", "*", "chunks", fmt.Sprintf("%016x_*", vol)))
	return m
}

// writeEveryChunk writes a 4 KiB block at the start of every chunk of a
// volume of size bytes (chunks of 4 MiB, the cluster's default).
func writeEveryChunk(t *testing.T, v *client.Volume, size int64, fill byte) {
	t.Helper()
	buf := bytes.Repeat([]byte{fill}, 4096)
	for off := int64(0); off < size; off += 4 << 20 {
		if _, err := v.WriteAt(buf, off); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
}

// waitChunkFiles waits until p holds exactly n chunk files of vol.
func (c *Cluster) waitChunkFiles(p *Proc, vol uint64, n int, timeout time.Duration) {
	c.t.Helper()
	c.Eventually(timeout, fmt.Sprintf("%s to hold %d chunk files of volume %d", p.Name, n, vol), func(context.Context) error {
		if got := len(chunkFiles(p, vol)); got != n {
			return fmt.Errorf("%d chunk files", got)
		}
		return nil
	})
}

// deleteVolume deletes a volume, retrying while its last session is still
// being closed.
func (c *Cluster) deleteVolume(name string) {
	c.t.Helper()
	c.Eventually(60*time.Second, "volume "+name+" deleted", func(ctx context.Context) error {
		_, err := c.API.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: name})
		return err
	})
}

// testDeleteWhileDown writes every chunk of a volume, stops cs3, deletes the
// volume, and restarts cs3 with extra flags. It returns the volume.
func testDeleteWhileDown(t *testing.T, c *Cluster, restartFlags []string) *api.Volume {
	const size = 64 << 20 // 16 chunks over the 8 copysets
	vol := c.CreateVolume("doomed", size)
	v := c.Open("doomed", false)
	writeEveryChunk(t, v, size, 0xd0)
	cs3 := c.CS[2]
	c.waitChunkFiles(cs3, vol.Id, size/(4<<20), 60*time.Second)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	c.Stop(cs3)
	c.deleteVolume("doomed")
	for _, p := range c.CS[:2] {
		c.waitChunkFiles(p, vol.Id, 0, 60*time.Second)
	}
	args := cs3.Args
	cs3.Args = append(slices.Clone(args), restartFlags...)
	c.Start(cs3)
	cs3.Args = args
	return vol
}

// A chunkserver that was down while a volume was deleted deletes its chunks
// once it is back (hazard 4 of issue 15): the delete is a raft entry it
// receives from the leaders like any other.
func TestDeleteVolumeWhileChunkserverDown(t *testing.T) {
	c := Start(t, Options{})
	vol := testDeleteWhileDown(t, c, nil)
	c.waitChunkFiles(c.CS[2], vol.Id, 0, 90*time.Second)
	c.checkNothingResurrected(vol.Id)
}

// The same, with cs3 crashing (SIGKILL, by a fault knob) right after it
// applied its first delete entry: after the restart the volume's chunks are
// still gone, and replaying the log recreates none of them for good.
func TestDeleteVolumeWhileChunkserverDownThenCrash(t *testing.T) {
	c := Start(t, Options{})
	vol := testDeleteWhileDown(t, c, []string{"--fault-crash-after-delete"})
	cs3 := c.CS[2]
	select {
	case <-cs3.Exited():
	case <-time.After(90 * time.Second):
		t.Fatal("cs3 did not crash in 90 s after its restart with --fault-crash-after-delete")
	}
	if c.CountLog(cs3, "fault knob: crashing after a delete-volume entry") == 0 {
		t.Fatalf("cs3 exited, but not by the crash knob")
	}
	c.Kill(cs3) // reap
	c.Start(cs3)
	c.WaitHealthy(90 * time.Second)
	c.waitChunkFiles(cs3, vol.Id, 0, 90*time.Second)
	c.checkNothingResurrected(vol.Id)
}

// checkNothingResurrected writes every chunk of a new volume and waits until
// every chunkserver applied those writes (so it applied everything logged
// before them too); the deleted volume vol must still have no chunk file
// anywhere, and the MDS must not know it.
func (c *Cluster) checkNothingResurrected(vol uint64) {
	c.t.Helper()
	const size = 64 << 20
	after := c.CreateVolume("after", size)
	v := c.Open("after", false)
	writeEveryChunk(c.t.(*testing.T), v, size, 0xaf)
	for _, p := range c.CS {
		c.waitChunkFiles(p, after.Id, size/(4<<20), 90*time.Second)
	}
	for _, p := range c.CS {
		if got := chunkFiles(p, vol); len(got) > 0 {
			c.t.Fatalf("%s holds %d chunk files of deleted volume %d again, e.g. %s", p.Name, len(got), vol, got[0])
		}
	}
}

// Thousands of volumes created at once each take IO at once (hazard 5 of
// issue 15): no chunkserver refuses a brand-new volume as unknown. Reports
// creates per second; asserts no timing.
func TestManyNewVolumes(t *testing.T) {
	c := Start(t, Options{ChunkSize: 1 << 20}) // one chunk per volume: 2,000 of 4 MiB would fill 24 GB of disk
	const (
		volumes = 2000
		workers = 32
		size    = 16 << 20
	)
	var (
		next      atomic.Int64
		createDur atomic.Int64 // summed over workers
		closeErrs atomic.Int64
		otherErrs atomic.Int64 // IO errors other than NO_SUCH_VOLUME
		mu        sync.Mutex
		errs      []string
		nerrs     int
		wg        sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		nerrs++
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // 2,000 opens and closes
	clientTLS, dataTLS := c.TLS(identity.RoleClient, "test"), c.DataTLS(identity.RoleClient, "test")
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= volumes {
					return
				}
				name := fmt.Sprintf("many-%04d", i)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				t0 := time.Now()
				_, err := c.API.CreateVolume(ctx, &api.CreateVolumeRequest{Name: name, Size: size})
				createDur.Add(int64(time.Since(t0)))
				if err != nil {
					cancel()
					fail("create %s: %v", name, err)
					continue
				}
				v, err := client.Open(ctx, client.Config{MDS: []string{c.MDSAddr}, MDSTLS: clientTLS, DataTLS: dataTLS, Volume: name, ClientName: name, Logger: quiet})
				if err != nil {
					cancel()
					if errors.Is(err, client.ErrLeaseExpired) {
						// The same cause as the IO errors below, in Open's
						// fencing: an MDS too loaded to renew the lease
						// (a retried OpenVolume made it a takeover).
						otherErrs.Add(1)
						t.Logf("open %s: %v (not under test)", name, err)
						continue
					}
					fail("open %s: %v", name, err)
					continue
				}
				buf := bytes.Repeat([]byte{byte(i)}, 4096)
				off := int64(i%4) << 22 // a chunk of a different copyset per volume
				// Under test: no IO is refused as unknown, and what was
				// written reads back. Other errors (a session lease that a
				// loaded MDS did not renew in time) are counted, not failed.
				ioErr := func(what string, err error) {
					if errors.Is(err, api.ErrNoSuchVolume) {
						fail("%s %s: %v", what, name, err)
						return
					}
					otherErrs.Add(1)
					t.Logf("%s %s: %v (not under test)", what, name, err)
				}
				if _, err := v.WriteAt(buf, off); err != nil {
					ioErr("write", err)
				} else {
					got := make([]byte, 4096)
					if _, err := v.ReadAt(got, off); err != nil {
						ioErr("read", err)
					} else if !bytes.Equal(got, buf) {
						fail("read %s: wrong data", name)
					}
				}
				if err := v.Close(); err != nil {
					// Not under test: a session whose close timed out
					// (CloseSession has the 2 s IO timeout; the MDS is
					// busy) lapses with its lease.
					closeErrs.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	for _, e := range errs {
		t.Error(e)
	}
	if nerrs > len(errs) {
		t.Errorf("... %d failures in all", nerrs)
	}
	perCreate := time.Duration(createDur.Load() / volumes)
	t.Logf("%d volumes created, opened, written and read by %d workers in %v: %.0f volumes/s; mean CreateVolume %v (%.0f creates/s at %d concurrent); %d session closes timed out, %d other IO errors",
		volumes, workers, wall.Round(time.Millisecond), float64(volumes)/wall.Seconds(),
		perCreate.Round(time.Microsecond), float64(workers)/perCreate.Seconds(), workers, closeErrs.Load(), otherErrs.Load())
}
