package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testhost"
)

// A real Linux kernel is the NBD client: Debian's kernel in a QEMU guest
// (internal/testhost) attaches the playground's volume as /dev/nbd0 over two
// connections, makes ext4 on it and writes files with checksums; fio with
// verify writes on the file system while the chunkserver leading the most
// copysets is killed with SIGKILL. fio finishes without an error, and after
// unmount, detach, attach and mount every file and every fio block reads back
// as written.
func TestKernelNBDClient(t *testing.T) {
	begin := time.Now()
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"nbd-client", "mkfs.ext4", "fio", "blkid", "dumpe2fs", testcluster.Binary(t)},
		Modules: []string{"nbd", "ext4"},
	})
	booted := time.Now()
	p := startPlayground(t, "2GiB")
	guest := guestRunner(t, h, nil)
	// Runs before the playground stops (cleanups run last-registered first), so
	// a failed test does not leave the guest's sync waiting for a gone server.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = h.Run(ctx, "umount /mnt/vol; nbd-client -d /dev/nbd0")
	})

	attach := fmt.Sprintf("nbd-client 10.0.2.2 %d /dev/nbd0 -N %s -C 2 -b 4096", p.nbdPort, p.st.Volume)
	guest(time.Minute, attach)
	if got, want := strings.TrimSpace(guest(time.Minute, "blockdev --getsize64 /dev/nbd0")), strconv.Itoa(2<<30); got != want {
		t.Fatalf("/dev/nbd0 is %s bytes, want the volume's %s", got, want)
	}
	// One scan of /proc/net/tcp can miss a socket when the table changes
	// between its reads (seq_file), so the count is read until it shows both.
	n := 0
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if n = establishedTo(t, p.nbdPort); n == 2 || time.Now().After(deadline) {
			break
		}
	}
	if n != 2 {
		t.Fatalf("the NBD front end has %d connections from the guest, want 2 (nbd-client -C 2)", n)
	}
	guest(3*time.Minute, "mkfs.ext4 -q /dev/nbd0 && mkdir -p /mnt/vol && mount /dev/nbd0 /mnt/vol")
	guest(2*time.Minute, `set -e
		for n in 1 300 5000 17000; do dd if=/dev/urandom of=/mnt/vol/file-$n bs=1k count=$n 2>/dev/null; done
		sync`)
	sums := guest(time.Minute, "sha256sum /mnt/vol/file-*")
	attached := time.Now()

	victim := p.busiestLeader()
	writes := func() int { // write requests /dev/nbd0 completed so far
		f := strings.Fields(guest(time.Minute, "cat /sys/block/nbd0/stat"))
		n, err := strconv.Atoi(f[4])
		if err != nil {
			t.Fatalf("/sys/block/nbd0/stat: %v", err)
		}
		return n
	}
	before := writes()
	fioDone := make(chan error, 1)
	fioStart := time.Now()
	go func() {
		// 8192 writes take ~40 s in a quiet TCG guest; on a loaded machine the
		// guest has managed 13 a second, so the deadline is for a hang, not a pace.
		ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
		defer cancel()
		_, err := h.Run(ctx, fioJob+" --output=/root/fio.json")
		fioDone <- err
	}()
	// The kill lands once fio has done about a sixth of its 8192 writes.
	for writes()-before < 1500 {
		select {
		case err := <-fioDone:
			t.Fatalf("fio ended before the chunkserver was killed: %v", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill chunkserver %d: %v", victim.Index, err)
	}
	sinceStart, written := time.Since(fioStart), writes()-before
	logf(t, "killed chunkserver %d (pid %d), the busiest leader, %s into fio, after %d writes to /dev/nbd0 (%.0f/s)",
		victim.Index, victim.PID, sinceStart.Round(time.Millisecond), written, float64(written)/sinceStart.Seconds())
	if err := <-fioDone; err != nil {
		t.Fatalf("fio in the guest failed after the kill: %v\n%s", err, guest(time.Minute, "cat /root/fio.json"))
	}
	var report struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				IOPS    float64 `json:"iops"`
				Runtime int     `json:"runtime"` // ms
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(guest(time.Minute, "cat /root/fio.json")), &report); err != nil || len(report.Jobs) != 1 {
		t.Fatalf("fio's report: %v (%d jobs)", err, len(report.Jobs))
	}
	if j := report.Jobs[0]; j.Error != 0 {
		t.Fatalf("fio reports error %d", j.Error)
	}
	fioTook := time.Since(fioStart)

	// The victim comes back with the command the playground recorded, and
	// catches up while the volume is detached and attached again.
	cmd := exec.Command(victim.RestartCmd[0], victim.RestartCmd[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	guest(2*time.Minute, "umount /mnt/vol && nbd-client -d /dev/nbd0")
	guest(time.Minute, attach)
	guest(time.Minute, "mount /dev/nbd0 /mnt/vol")
	if got := guest(time.Minute, "sha256sum /mnt/vol/file-*"); got != sums {
		t.Fatalf("files after unmount, detach, attach and mount:\n%swant:\n%s", got, sums)
	}
	guest(12*time.Minute, fioJob+" --verify_only")
	guest(2*time.Minute, "umount /mnt/vol && nbd-client -d /dev/nbd0")

	// Again through the CSI node plugin's kernel NBD attach (what
	// NodeStageVolume does with --nbd-target: nbd-client to an access
	// node's NBD server, the ext4 found and mounted), then its unstage.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := h.Run(ctx, fmt.Sprintf("%s csi stage-device %s --method nbd --addr 10.0.2.2:%d --path /mnt/vol --state /tmp/stage.json 2>&1",
		testcluster.Binary(t), p.st.Volume, p.nbdPort))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(out), "/dev/nbd") {
		t.Fatalf("guest: csi stage-device over NBD: %v\n%s", err, tail(out, 20))
	}
	if got := guest(2*time.Minute, "sha256sum /mnt/vol/file-*"); got != sums {
		t.Fatalf("files through the plugin's NBD stage:\n%swant:\n%s", got, sums)
	}
	guest(3*time.Minute, testcluster.Binary(t)+" csi unstage-device /tmp/stage.json")
	if left := strings.TrimSpace(guest(time.Minute, "grep ' /mnt/vol ' /proc/mounts; cat /sys/block/nbd*/pid 2>/dev/null; true")); left != "" {
		t.Fatalf("after the plugin's unstage the guest still has:\n%s", left)
	}
	p.waitHealthy(60 * time.Second)
	w := report.Jobs[0].Write
	logf(t, "kernel NBD: guest up in %s (kernel %s, uptime %s at ready, initramfs %.0f MiB); attach+mkfs+files %s; "+
		"fio %s: %.0f write IOPS over %.1f s of writes with the kill (4 KiB, iodepth 16, then verify); whole test %s",
		booted.Sub(begin).Round(time.Millisecond), h.Stats().Kernel, h.Stats().GuestUptime.Round(10*time.Millisecond),
		float64(h.Stats().InitramfsBytes)/(1<<20), attached.Sub(booted).Round(time.Millisecond),
		fioTook.Round(time.Millisecond), w.IOPS, float64(w.Runtime)/1000, time.Since(begin).Round(time.Millisecond))
}

// fioJob writes 4 KiB blocks at random places of a file on the mounted volume
// and reads each back verified; with --verify_only it checks them again.
const fioJob = "fio --name=survive --filename=/mnt/vol/fio.dat --size=256m --io_size=32m --rw=randwrite --bs=4k" +
	" --ioengine=libaio --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=7" +
	" --verify_state_save=0 --output-format=json"

// establishedTo counts the established TCP connections to a local port.
func establishedTo(t *testing.T, port int) int {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	local := fmt.Sprintf(":%04X", port)
	n := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		// "sl local_address rem_address st ...", addresses as hex IP:port, st 01 = ESTABLISHED
		fields := strings.Fields(s.Text())
		if len(fields) > 3 && strings.HasSuffix(fields[1], local) && fields[3] == "01" {
			n++
		}
	}
	return n
}
