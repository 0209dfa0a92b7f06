package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testhost"
)

// The kubelet's sequence when a pod's node dies, with a real kernel as node
// A: the volume is published to A, whose kernel (the QEMU guest, kernel NBD
// through the playground's front end) makes ext4, writes files and runs fio
// with verify; A is given up for dead and the volume is published to node B
// (the host's `basalt csi` node plugin), which stages it, finds every file as
// A wrote it, verifies every block of A's fio job (fio --verify_only) and
// goes on with fio with verify; A's kernel, still attached, gets an IO error
// for its late write. The figure: publish to B → first write on B durable.
func TestCSIReattachFromKernelNode(t *testing.T) {
	requireKernelAttach(t)
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"nbd-client", "mkfs.ext4", "sha256sum", "dd", "fio"},
		Modules: []string{"nbd", "ext4"},
	})
	p := startPlayground(t, "1GiB")
	sock := startCSI(t, p, "node-b")
	// The pod's workload: random 4 KiB writes, each block with a checksum and
	// its offset, read back and checked at the end (--verify_only: checked
	// only, on the node the pod moved to).
	fioArgs := func(file string) []string {
		return []string{"--name=pod", "--filename=" + file, "--size=4m", "--rw=randwrite", "--bs=4k",
			"--ioengine=psync", "--direct=1", "--verify=crc32c", "--verify_fatal=1", "--randseed=11",
			"--verify_state_save=0", "--output-format=terse"}
	}
	guest := func(timeout time.Duration, script string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return h.Run(ctx, script)
	}
	must := func(timeout time.Duration, script string) string {
		t.Helper()
		out, err := guest(timeout, script)
		if err != nil {
			t.Fatalf("guest: %s: %v\n%s", script, err, tail(out, 20))
		}
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const vol = "pvc-moves"
	ctl, node, rwo := setupCSIVolume(t, ctx, p, csiVolume{Sock: sock, Other: "node-a", Name: vol, Size: 128 << 20, PublishTo: "node-a"})
	// Node A: its kernel attaches, formats, writes.
	t.Cleanup(func() { _, _ = guest(30*time.Second, "umount -l /mnt/vol; nbd-client -d /dev/nbd0") })
	must(time.Minute, fmt.Sprintf("nbd-client 10.0.2.2 %d /dev/nbd0 -N %s -b 4096", p.nbdPort, vol))
	must(3*time.Minute, "mkfs.ext4 -q /dev/nbd0 && mkdir -p /mnt/vol && mount /dev/nbd0 /mnt/vol")
	must(3*time.Minute, `set -e
		for n in 1 300 3000; do dd if=/dev/urandom of=/mnt/vol/file-$n bs=1k count=$n 2>/dev/null; done
		sync`)
	sums := must(time.Minute, "cd /mnt/vol && sha256sum file-*")
	must(5*time.Minute, "fio "+strings.Join(fioArgs("/mnt/vol/fio.dat"), " ")+" && sync")

	// Node A is given up for dead: the volume goes to node B.
	lost := time.Now()
	if _, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-b", VolumeCapability: rwo}); err != nil {
		t.Fatalf("publish to node B: %v", err)
	}
	published := time.Since(lost)
	dir := t.TempDir()
	t.Cleanup(func() { releaseUnder(t, dir) })
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(target, "from-b"))
	if err == nil {
		_, err = f.Write([]byte("node B writes"))
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		t.Fatalf("node B's first write: %v", err)
	}
	f.Close()
	firstWrite := time.Since(lost)
	t.Logf("node A given up → publish to B done (A fenced): %v; → first write on B durable (stage, mount, write, fsync): %v", published, firstWrite)
	for _, line := range strings.Split(strings.TrimSpace(sums), "\n") {
		want, name, _ := strings.Cut(strings.TrimSpace(line), "  ")
		got := run(t, time.Minute, "sha256sum", filepath.Join(target, name))
		if !strings.HasPrefix(got, want) {
			t.Fatalf("%s on node B: %s, node A wrote %s", name, got, want)
		}
	}
	// Every block of A's fio job reads back as A wrote it, and the pod's fio
	// goes on on B.
	verified := run(t, 5*time.Minute, "fio", append(fioArgs(filepath.Join(target, "fio.dat")), "--verify_only")...)
	if f := strings.Split(verified, ";"); len(f) < 6 || f[5] != "4096" { // terse: read KiB
		t.Fatalf("fio --verify_only on node B did not read A's 4 MiB back:\n%s", verified)
	}
	run(t, 5*time.Minute, "fio", fioArgs(filepath.Join(target, "fio-b.dat"))...)
	// Node A's late write, straight to the device, is refused.
	if out, err := guest(2*time.Minute, "dd if=/dev/urandom of=/dev/nbd0 bs=4k count=1 seek=30000 oflag=direct"); err == nil {
		t.Fatalf("node A's late write after the publish to B succeeded:\n%s", out)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// Online expansion of a mounted ext4, judged by a real kernel (the QEMU
// guest is node A): the volume is published to A, whose kernel attaches it,
// makes ext4, mounts it and writes a file; ControllerExpandVolume grows the
// volume while it stays mounted; `basalt csi grow-device` in the guest — the
// node plugin's NodeExpandVolume steps — makes the device show the new size
// and runs resize2fs on the mounted file system; statfs shows the bigger
// file system, the file reads back as written, the added space takes data;
// detaching leaves no device behind.
//
// Over NVMe/TCP the guest stages and unstages with the node plugin's own
// code (`basalt csi stage-device` / `unstage-device`: NodeStageVolume's
// nvme connect, device lookup, mkfs and mount; NodeUnstageVolume's unmount,
// nvme disconnect and wait). Over NVMe/TCP (a `basalt nvmf` access node) the target notices the growth
// and sends a Namespace Attribute Changed notice: the kernel rescans and
// /dev/nvme0n1 grows by itself.
func TestCSIExpandOnline(t *testing.T) { testExpandOnline(t, "nvmf") }

// The same over kernel NBD (nbd-client -nonetlink to the playground's NBD
// front end): grow-device tells the kernel the new size with NBD_SET_SIZE.
func TestCSIExpandOnlineNBD(t *testing.T) { testExpandOnline(t, "nbd") }

func testExpandOnline(t *testing.T, proto string) {
	requireKernelAttach(t)
	bin := testcluster.Binary(t)
	cfg := testhost.Config{Tools: []string{"mkfs.ext4", "resize2fs", "sha256sum", "dd", "blockdev", "blkid", bin}}
	if proto == "nvmf" {
		cfg.Tools = append(cfg.Tools, "nvme")
		cfg.Modules = []string{"nvme-tcp", "ext4", "crc32c_generic"}
	} else {
		cfg.Tools = append(cfg.Tools, "nbd-client")
		cfg.Modules = []string{"nbd", "ext4", "crc32c_generic"}
	}
	h := testhost.Start(t, cfg)
	p := startPlayground(t, "1GiB")
	frontLog := p.logPath
	var port int
	if proto == "nvmf" {
		port, frontLog = startNVMf(t, p.st.MDS, p.st.TLSDir)
	}
	sock := startCSI(t, p, "node-b")
	must := func(timeout time.Duration, script string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		out, err := h.Run(ctx, script)
		if err != nil {
			t.Fatalf("guest: %s: %v\n%s\n---- front end log (tail) ----\n%s", script, err, tail(out, 20), tailFile(frontLog, 40))
		}
		return strings.TrimSpace(out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	vol := "pvc-grows-" + proto
	const before, after = 128 << 20, 512 << 20
	ctl, _, rwo := setupCSIVolume(t, ctx, p, csiVolume{Sock: sock, Other: "node-a", Name: vol, Size: before, PublishTo: "node-a"})

	// Node A stages: attach, mkfs, mount; the pod writes.
	dev, attach, detach, leftover := "/dev/nvme0n1",
		fmt.Sprintf(`nvme connect -t tcp -a 10.0.2.2 -s %d -n %s -q %s -k 5 &&
			for i in $(seq 120); do [ -b /dev/nvme0n1 ] && break; sleep 1; done; [ -b /dev/nvme0n1 ]`, port, nvmfVolumeNQN+vol, guestHostNQN),
		"nvme disconnect-all",
		`for i in $(seq 60); do ls /dev/nvme[0-9]* >/dev/null 2>&1 || break; sleep 1; done
			ls /dev/nvme[0-9]* 2>/dev/null; nvme list-subsys 2>/dev/null | grep -i nqn; true`
	if proto == "nbd" {
		dev, attach, detach, leftover = "/dev/nbd0",
			fmt.Sprintf("nbd-client -nonetlink 10.0.2.2 %d /dev/nbd0 -N %s -b 4096", p.nbdPort, vol),
			"nbd-client -d /dev/nbd0",
			`for i in $(seq 60); do [ -e /sys/block/nbd0/pid ] || break; sleep 1; done
			cat /sys/block/nbd0/pid 2>/dev/null; true`
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = h.Run(ctx, "umount -l /mnt/vol; "+detach)
	})
	if proto == "nvmf" {
		// The node plugin's own NodeStageVolume steps, in the guest's
		// kernel: nvme connect, find the namespace's device in sysfs, mkfs
		// on a blank device, mount (csi.StageDevice).
		dev = must(3*time.Minute, fmt.Sprintf("%s csi stage-device %s --method nvmf --addr 10.0.2.2:%d --hostnqn %s --fs ext4 --path /mnt/vol --state /tmp/stage.json 2>&1",
			bin, vol, port, guestHostNQN))
		if !strings.HasPrefix(dev, "/dev/nvme") || strings.Contains(dev, "\n") {
			t.Fatalf("stage-device printed %q, want the namespace's device", dev)
		}
		if m := must(time.Minute, "grep ' /mnt/vol ' /proc/mounts"); !strings.HasPrefix(m, dev+" /mnt/vol ext4 ") {
			t.Fatalf("after stage-device /proc/mounts has %q, want %s on /mnt/vol as ext4", m, dev)
		}
	} else {
		must(3*time.Minute, attach)
		must(3*time.Minute, "mkfs.ext4 -q "+dev+" && mkdir -p /mnt/vol && mount "+dev+" /mnt/vol")
	}
	must(3*time.Minute, "dd if=/dev/urandom of=/mnt/vol/data bs=1k count=4000 2>/dev/null && sync")
	sum := must(time.Minute, "sha256sum /mnt/vol/data")
	fsBytes := func() int64 { // statfs: the file system's size in bytes
		t.Helper()
		out := must(time.Minute, "stat -f -c '%b %S' /mnt/vol")
		var blocks, bsize int64
		if _, err := fmt.Sscan(out, &blocks, &bsize); err != nil {
			t.Fatalf("stat -f: %q: %v", out, err)
		}
		return blocks * bsize
	}
	devBefore := must(time.Minute, "blockdev --getsize64 "+dev)
	fsBefore := fsBytes()

	// The resizer: ControllerExpandVolume while the volume is mounted.
	r, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol,
		CapacityRange: &csi.CapacityRange{RequiredBytes: after}, VolumeCapability: rwo})
	if err != nil {
		t.Fatal(err)
	}
	if r.CapacityBytes < after || !r.NodeExpansionRequired {
		t.Fatalf("ControllerExpandVolume: %v", r)
	}
	expanded := time.Now()
	// The kubelet's NodeExpandVolume: the node plugin's steps, in the guest.
	must(5*time.Minute, fmt.Sprintf("%s csi grow-device %s --method %s --size %d --fs ext4 --path /mnt/vol 2>&1", bin, dev, proto, after))
	grown := time.Since(expanded)
	devAfter := must(time.Minute, "blockdev --getsize64 "+dev)
	if devAfter != strconv.Itoa(after) {
		t.Fatalf("%s is %s bytes after grow-device, want %d (it was %s)", dev, devAfter, after, devBefore)
	}
	fsAfter := fsBytes()
	if fsAfter < after*9/10 || fsAfter <= fsBefore {
		t.Fatalf("ext4 is %d bytes after the expansion (was %d), want about %d", fsAfter, fsBefore, after)
	}
	if s := must(time.Minute, "sha256sum /mnt/vol/data"); s != sum {
		t.Fatalf("the file written before the expansion reads %q, was %q", s, sum)
	}
	// The added space takes data: more than the old file system held.
	must(5*time.Minute, "dd if=/dev/zero of=/mnt/vol/more bs=1M count=200 2>/dev/null && sync && rm /mnt/vol/more && sync")
	t.Logf("%s: device %s → %s bytes, ext4 (statfs) %d → %d bytes, mounted throughout; ControllerExpandVolume → device and ext4 grown: %v",
		proto, devBefore, devAfter, fsBefore, fsAfter, grown.Round(100*time.Millisecond))

	// Unstage: unmount and detach leave no device behind.
	if proto == "nvmf" { // NodeUnstageVolume's steps: unmount, nvme disconnect, wait
		must(2*time.Minute, bin+" csi unstage-device /tmp/stage.json 2>&1")
		if m := must(time.Minute, "grep ' /mnt/vol ' /proc/mounts; ls /tmp/stage.json 2>/dev/null; true"); m != "" {
			t.Fatalf("after unstage-device: %q", m)
		}
	} else {
		must(2*time.Minute, "umount /mnt/vol && "+detach)
	}
	if left := must(2*time.Minute, leftover); left != "" {
		t.Fatalf("after the detach the guest still has:\n%s", left)
	}
	if _, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: "node-a"}); err != nil {
		t.Fatal(err)
	}
}
