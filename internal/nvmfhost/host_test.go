package nvmfhost

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/internal/nvmftshark"
)

// startTarget serves an 8 MiB volume "vol" on a free loopback port.
func startTarget(t *testing.T) (addr string, disk *frontendtest.Disk) {
	t.Helper()
	disk = frontendtest.NewDisk(8 << 20)
	disk.BlockSizes.Minimum = 512
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: frontendtest.Disks{"vol": disk}, Logger: quiet})
	s, err := nvmf.NewServer(nvmf.Config{Exports: ex, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close(); ex.Close() })
	return ln.Addr().String(), disk
}

// exercise connects a host with two I/O queues and runs writes (in the
// capsule, by R2T, larger than MDTS) and reads with many commands in flight
// on each queue, checking every byte read against what was written.
func exercise(t *testing.T, addr string, disk *frontendtest.Disk, o Options) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o.Queues, o.QueueSize = 2, 32
	h, err := Connect(ctx, addr, nvmf.VolumeNQNPrefix+"vol", o)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.Size() != disk.Info().Size || h.BlockSize != 512 || len(h.IO) != 2 || h.MaxTransfer == 0 || h.InCapsule < 4096 {
		t.Fatalf("host: size %d block %d queues %d MDTS %d in-capsule %d", h.Size(), h.BlockSize, len(h.IO), h.MaxTransfer, h.InCapsule)
	}
	// Sizes: 4 KiB (in the capsule unless NoInCapsule), 64 KiB (R2T), and
	// 2*MDTS+4 KiB (split into three commands).
	sizes := []int{4 << 10, 64 << 10, 2*h.MaxTransfer + 4<<10}
	rng := rand.New(rand.NewPCG(1, 2))
	type io struct {
		off  int64
		data []byte
	}
	var ios []io
	slot := int64(1 << 20) // each IO its own 1 MiB slot: concurrent IOs never overlap
	for i := range 8 {
		b := make([]byte, sizes[i%len(sizes)])
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		ios = append(ios, io{off: int64(i) * slot, data: b})
	}
	run := func(do func(q int, x io) error) {
		var wg sync.WaitGroup
		errs := make(chan error, len(ios))
		for i, x := range ios {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- do(i%2, x) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	run(func(q int, x io) error { return h.WriteAt(q, x.data, x.off) })
	for _, x := range ios {
		if !bytes.Equal(disk.Bytes(int(x.off), len(x.data)), x.data) {
			t.Fatalf("write of %d bytes at %d: the volume differs", len(x.data), x.off)
		}
	}
	// Rounds of concurrent reads: the target's read buffers are pooled, and
	// one given back before its data was written would show here as
	// another read's bytes.
	for range 20 {
		run(func(q int, x io) error {
			got := make([]byte, len(x.data))
			if err := h.ReadAt(q, got, x.off); err != nil {
				return err
			}
			if !bytes.Equal(got, x.data) {
				return fmt.Errorf("read of %d bytes at %d differs", len(x.data), x.off)
			}
			return nil
		})
	}
	// Out of range: the controller's status, the queue still works.
	if err := h.ReadAt(0, make([]byte, 4096), h.Size()); err == nil {
		t.Fatal("read past the end succeeded")
	}
	if err := h.ReadAt(0, make([]byte, 4096), 0); err != nil {
		t.Fatalf("read after a failed one: %v", err)
	}
}

// TestHostAgainstTarget drives basalt's target with the host, with and
// without digests and with every write by R2T; with tshark installed it also
// captures the traffic and checks that tshark's NVMe/TCP dissector decodes
// every PDU without a malformed packet or error (issue 17's judge).
func TestHostAgainstTarget(t *testing.T) {
	addr, disk := startTarget(t)
	cap := nvmftshark.Start(t, addr)
	sessions := []Options{{}, {HeaderDigest: true, DataDigest: true}, {NoInCapsule: true, DataDigest: true}}
	for _, o := range sessions {
		t.Run(fmt.Sprintf("hdgst=%v,ddgst=%v,r2t-only=%v", o.HeaderDigest, o.DataDigest, o.NoInCapsule), func(t *testing.T) {
			exercise(t, addr, disk, o)
		})
	}
	t.Run("tshark", func(t *testing.T) {
		if cap == nil {
			t.Skip("no capture: tshark or dumpcap missing or not allowed to capture (see the log above)")
		}
		cap.Check(t, 3*len(sessions), nvmftshark.Want{Digests: true, // an admin and two I/O queues a session
			PDUs: map[int]int{PDUICReq: 3 * len(sessions), PDUICResp: 3 * len(sessions), PDUCapsuleCmd: 100,
				PDUCapsuleRsp: 50, PDUH2CData: 10, PDUC2HData: 30, PDUR2T: 10}})
	})
}

// TestQueueReaderHandoff: the reading of a queue's PDUs moves between the
// Submits (one that finds nobody reading reads its own completion) and the
// reader goroutine (it takes over while commands are in flight). Bursts of
// 1 to 40 concurrent submitters on one queue of depth 16 (more wait for a
// command id), each checking its data, must all complete; then Close with
// commands waiting fails them rather than leaving them hanging, and a second
// Close does nothing.
func TestQueueReaderHandoff(t *testing.T) {
	addr, _ := startTarget(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := Connect(ctx, addr, nvmf.VolumeNQNPrefix+"vol", Options{QueueSize: 17})
	if err != nil {
		t.Fatal(err)
	}
	finished := make(chan error, 1)
	go func() {
		for burst := range 60 {
			n := 1 + burst*7%40
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for g := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					off := int64(burst*40+g) % 2048 * 4096
					want := bytes.Repeat([]byte{byte(burst), byte(g)}, 2048)
					if err := h.WriteAt(0, want, off); err != nil {
						errs <- err
						return
					}
					got := make([]byte, len(want))
					if err := h.ReadAt(0, got, off); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(got, want) {
						errs <- fmt.Errorf("burst %d submitter %d: read back differs", burst, g)
					}
				}()
			}
			wg.Wait()
			close(errs)
			if err := <-errs; err != nil {
				finished <- err
				return
			}
		}
		finished <- nil
	}()
	select {
	case err := <-finished:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("submitters still waiting after 3 minutes: a completion nobody read")
	}

	// Close with commands waiting: each fails.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- h.ReadAt(0, make([]byte, 4096), int64(i)*4096)
		}()
	}
	h.Close()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Submits still waiting a minute after Close")
	}
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
		}
	}
	t.Logf("%d of 40 reads racing Close failed", failed)
	// A second Close (a test's cleanup after its own Close) is harmless.
	h.Close()
}
