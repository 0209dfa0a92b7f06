package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/basalt-storage/basalt/internal/testhost"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// The kubelet's sequence when a pod's node dies, with a real kernel as node
// A: the volume is published to A, whose kernel (the QEMU guest, kernel NBD
// through the playground's front end) makes ext4 and writes files; A is
// given up for dead and the volume is published to node B (the host's `basalt
// csi` node plugin), which stages it, finds every file as A wrote it and
// writes; A's kernel, still attached, gets an IO error for its late write.
// The figure: publish to B → first write on B durable.
func TestCSIReattachFromKernelNode(t *testing.T) {
	requireKernelAttach(t)
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"nbd-client", "mkfs.ext4", "sha256sum", "dd"},
		Modules: []string{"nbd", "ext4"},
	})
	p := startPlayground(t, "1GiB")
	sock := startCSI(t, p, "node-b")
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
	mc, err := mdsclient.Dial([]string{p.st.MDS}, adminTLS(t, p.st.TLSDir))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	if _, err := mc.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: "node-a"}}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	rwo := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	const vol = "pvc-moves"
	if _, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: "node-a", VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	// Node A: its kernel attaches, formats, writes.
	t.Cleanup(func() { _, _ = guest(30*time.Second, "umount -l /mnt/vol; nbd-client -d /dev/nbd0") })
	must(time.Minute, fmt.Sprintf("nbd-client 10.0.2.2 %d /dev/nbd0 -N %s -b 4096", p.nbdPort, vol))
	must(3*time.Minute, "mkfs.ext4 -q /dev/nbd0 && mkdir -p /mnt/vol && mount /dev/nbd0 /mnt/vol")
	must(3*time.Minute, `set -e
		for n in 1 300 3000; do dd if=/dev/urandom of=/mnt/vol/file-$n bs=1k count=$n 2>/dev/null; done
		sync`)
	sums := must(time.Minute, "cd /mnt/vol && sha256sum file-*")

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
