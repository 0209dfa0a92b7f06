package e2e

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testhost"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// The kubelet's sequence when a pod's node dies, with a real kernel as node
// A: the node plugin runs in the QEMU guest (`basalt csi --mode node`, the
// static binary, its gRPC on a TCP port QEMU forwards to the test) and the
// test calls it as a kubelet would. NodeStageVolume attaches the volume with
// the guest's kernel over NVMe/TCP to a `basalt nvmf` access node on this
// host, makes ext4 and mounts it; NodePublishVolume bind-mounts it; the pod
// writes files and runs fio with verify. A is given up for dead and the
// volume is published to node B (this host's `basalt csi` node plugin),
// which stages it, finds every file as A wrote it, verifies every block of
// A's fio job (fio --verify_only) and goes on with fio with verify. A's
// kernel, still attached, gets an IO error for every late write, and B
// still writes after them. NodeUnpublish/NodeUnstage on A leave no mount,
// NVMe subsystem or state behind. The figure: publish to B → first write on
// B durable.
func TestCSIReattachFromKernelNode(t *testing.T) {
	requireKernelAttach(t)
	begin := time.Now()
	bin := testcluster.Binary(t)
	const guestPort = 10000 // the guest plugin's gRPC
	fwd := testutil.FreePort(t)
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"nvme", "mkfs.ext4", "blkid", "dumpe2fs", "e2fsck", "resize2fs", "sha256sum", "dd", "fio", bin},
		Modules: []string{"nvme-tcp", "ext4", "crc32c_generic"},
		Forward: []testhost.Forward{{HostPort: fwd, GuestPort: guestPort}},
	})
	booted := time.Now()
	p := startPlayground(t, "1GiB")
	nvmfPort, nvmfLog := startNVMf(t, p.st.MDS, p.st.TLSDir)
	sock := startCSI(t, p, "node-b")
	logs := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, _ := h.Run(ctx, "tail -n 40 /tmp/csi.log")
		return "---- node A's plugin (guest) ----\n" + a + "\n---- basalt nvmf ----\n" + tailFile(nvmfLog, 30)
	}
	guest := guestRunner(t, h, logs)
	nodeA := startGuestCSI(t, h, guest, bin, p, "node-a", guestPort, fwd, nvmfPort)
	// The pod's workload: random 4 KiB writes, each block with a checksum and
	// its offset, read back and checked at the end (--verify_only: checked
	// only, on the node the pod moved to).
	fioArgs := func(file string) []string {
		return []string{"--name=pod", "--filename=" + file, "--size=4m", "--rw=randwrite", "--bs=4k",
			"--ioengine=psync", "--direct=1", "--verify=crc32c", "--verify_fatal=1", "--randseed=11",
			"--verify_state_save=0", "--output-format=terse"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const vol = "pvc-moves"
	ctl, node, rwo := setupCSIVolume(t, ctx, p, csiVolume{Sock: sock, Name: vol, Size: 128 << 20, PublishTo: "node-a"})

	// Node A: the kubelet stages and publishes through the guest's plugin.
	const stagingA = "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.basalt.io/pvc-moves/globalmount"
	const targetA = "/var/lib/kubelet/pods/pod-a/volumes/kubernetes.io~csi/pvc-moves/mount"
	staged := time.Now()
	if _, err := nodeA.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: stagingA, VolumeCapability: rwo,
		PublishContext: map[string]string{"readOnly": "false"}}); err != nil {
		t.Fatalf("NodeStageVolume on node A: %v\n%s", err, logs())
	}
	stageTook := time.Since(staged)
	if _, err := nodeA.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: stagingA, TargetPath: targetA,
		VolumeCapability: rwo}); err != nil {
		t.Fatalf("NodePublishVolume on node A: %v\n%s", err, logs())
	}
	devA := strings.TrimSpace(guest(time.Minute, "awk '$2==\""+stagingA+"\" {print $1\" \"$3}' /proc/mounts"))
	devA, fsA, _ := strings.Cut(devA, " ")
	if !strings.HasPrefix(devA, "/dev/nvme") || fsA != "ext4" {
		t.Fatalf("node A's staging path holds %q (%s), want ext4 on the NVMe/TCP namespace's device", devA, fsA)
	}
	guest(3*time.Minute, "set -e; for n in 1 300 3000; do dd if=/dev/urandom of="+targetA+"/file-$n bs=1k count=$n 2>/dev/null; done; sync")
	sums := guest(time.Minute, "cd "+targetA+" && sha256sum file-*")
	guest(5*time.Minute, "fio "+strings.Join(fioArgs(targetA+"/fio.dat"), " ")+" && sync")
	if st, err := nodeA.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol, VolumePath: targetA}); err != nil ||
		len(st.Usage) == 0 || st.Usage[0].Used < 4<<20 {
		t.Fatalf("NodeGetVolumeStats on node A: %v, %v; want at least the 4 MiB fio wrote used", st, err)
	}

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
	writeB := func(name string) error {
		f, err := os.Create(filepath.Join(target, name))
		if err == nil {
			_, err = f.Write([]byte("node B writes"))
		}
		if err == nil {
			err = f.Sync()
		}
		if f != nil {
			f.Close()
		}
		return err
	}
	if err := writeB("from-b"); err != nil {
		t.Fatalf("node B's first write: %v", err)
	}
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

	// Node A's late writes, straight to its device, are refused — every one:
	// A's path stays fenced — and B still writes after them.
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		out, err := h.Run(ctx, fmt.Sprintf("dd if=/dev/urandom of=%s bs=4k count=1 seek=%d oflag=direct 2>&1", devA, 30000+i))
		cancel()
		var exit *testhost.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("node A's late write %d after the publish to B: %v (want an IO error)\n%s\n%s", i+1, err, out, logs())
		}
	}
	if err := writeB("after-a"); err != nil {
		t.Fatalf("node B's write after node A's late writes: %v (A took the volume back?)", err)
	}

	// The kubelet on A, back, cleans up: nothing is left.
	if _, err := nodeA.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: targetA}); err != nil {
		t.Fatalf("NodeUnpublishVolume on node A: %v\n%s", err, logs())
	}
	unstaged := time.Now()
	if _, err := nodeA.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: stagingA}); err != nil {
		t.Fatalf("NodeUnstageVolume on node A: %v\n%s", err, logs())
	}
	unstageTook := time.Since(unstaged)
	if left := strings.TrimSpace(guest(time.Minute, `grep -e /var/lib/kubelet -e /dev/nvme /proc/mounts; ls -A /sys/class/nvme-subsystem/; ls -A /var/lib/basalt-csi/volumes/; true`)); left != "" {
		t.Fatalf("node A after NodeUnpublish and NodeUnstage still has:\n%s", left)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	t.Logf("node A (guest kernel %s, up in %v): NodeStageVolume (nvme connect, mkfs, mount) %v, NodeUnstageVolume after the fence %v; whole test %v",
		h.Stats().Kernel, booted.Sub(begin).Round(time.Millisecond), stageTook.Round(time.Millisecond), unstageTook.Round(time.Millisecond),
		time.Since(begin).Round(time.Second))
}

// startGuestCSI runs `basalt csi --mode node` in the guest as node nodeID,
// its gRPC on guestPort (forwarded to this host's 127.0.0.1:hostPort): the
// MDS and the `basalt nvmf` access node on nvmfPort are this host's, at
// 10.0.2.2; its certificate is the playground's access one, copied in; its
// NVMe host NQN is guestHostNQN (the access node's allow-list). It returns
// a node client once the plugin answers NodeGetInfo as nodeID.
func startGuestCSI(t *testing.T, h *testhost.Host, guest func(time.Duration, string) string, bin string, p *pg,
	nodeID string, guestPort, hostPort, nvmfPort int) csi.NodeClient {
	t.Helper()
	var script strings.Builder
	script.WriteString("set -e; mkdir -p /etc/basalt/tls /etc/nvme\n")
	fmt.Fprintf(&script, "echo %s > /etc/nvme/hostnqn\n", guestHostNQN)
	files, _ := filepath.Glob(filepath.Join(p.st.TLSDir, "ca.cr*"))
	certs, _ := filepath.Glob(filepath.Join(p.st.TLSDir, "access-playground.*"))
	if len(certs) == 0 {
		t.Fatalf("no access-playground certificate in %s", p.st.TLSDir)
	}
	for _, f := range append(files, certs...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&script, "echo %s | base64 -d > /etc/basalt/tls/%s\n", base64.StdEncoding.EncodeToString(b), filepath.Base(f))
	}
	_, mdsPort, _ := net.SplitHostPort(p.st.MDS)
	fmt.Fprintf(&script, "setsid %s csi --endpoint tcp://0.0.0.0:%d --mode node --node-id %s --mds 10.0.2.2:%s --tls-dir /etc/basalt/tls "+
		"--state-dir /var/lib/basalt-csi --attach nvmf --nvmf-target 10.0.2.2:%d </dev/null >/tmp/csi.log 2>&1 &\n",
		bin, guestPort, nodeID, mdsPort, nvmfPort)
	guest(time.Minute, script.String())
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(guest(time.Minute, "cat /tmp/csi.log"), "csi plugin serving") {
		if time.Now().After(deadline) {
			t.Fatalf("the guest's node plugin does not serve after 3 minutes:\n%s", guest(time.Minute, "tail -n 40 /tmp/csi.log; pidof basalt || echo not running"))
		}
		time.Sleep(time.Second)
	}
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", hostPort), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n := csi.NewNodeClient(conn)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		info, err := n.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		cancel()
		if err == nil && info.NodeId == nodeID {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest's node plugin over 127.0.0.1:%d: NodeGetInfo %v, %v", hostPort, info, err)
		}
		time.Sleep(time.Second)
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
