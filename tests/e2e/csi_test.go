package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// startCSI runs `basalt csi --mode all` against the playground's MDS, on a
// Unix socket, with its node plugin attaching through nbdfuse and a loop
// device (this host's kernel has no nbd module); it returns the socket path.
func startCSI(t *testing.T, p *pg, nodeID string) string {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	logPath := filepath.Join(dir, "csi.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testcluster.Binary(t), "csi", "--endpoint", "unix://"+sock, "--mds", p.st.MDS,
		"--mode", "all", "--node-id", nodeID, "--zone", "zone-a", "--state-dir", filepath.Join(dir, "state"), "--attach", "nbdfuse")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("---- basalt csi log (tail) ----\n%s", tailFile(logPath, 100))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case <-exited:
			t.Fatalf("basalt csi exited:\n%s", tailFile(logPath, 100))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("basalt csi did not listen within 60 s:\n%s", tailFile(logPath, 100))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sock
}

func requireKernelAttach(t *testing.T) {
	t.Helper()
	testutil.RequireTools(t, "nbdfuse", "losetup", "mkfs.ext4", "resize2fs", "blkid", "mount", "umount", "fusermount3")
	if os.Geteuid() != 0 {
		t.Skip("skipped: the CSI node plugin mounts file systems and attaches loop devices: needs root")
	}
	for _, dev := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(dev); err != nil {
			t.Skipf("skipped: %s is missing (no FUSE or loop devices here)", dev)
		}
	}
}

// csi-sanity, controller and node, against `basalt csi` backed by a
// playground: every volume it stages is a real /dev/loopN over nbdfuse over
// the NBD front end, with a real ext4 on it.
func TestCSISanity(t *testing.T) {
	requireKernelAttach(t)
	p := startPlayground(t, "1GiB")
	sock := startCSI(t, p, "sanity-node")
	dir := t.TempDir()
	cfg := sanity.NewTestConfig()
	cfg.Address = sock
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 64 << 20
	cfg.TestVolumeExpandSize = 128 << 20
	cfg.IdempotentCount = 3
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	sanity.Test(t, cfg)
	if t.Failed() {
		return
	}
	// Nothing left behind: no loop device over an nbdfuse file of the
	// plugin's, no mount under the plugin's or the test's directories.
	out, _ := exec.CommandContext(context.Background(), "losetup", "-a").CombinedOutput()
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(out)+string(mounts), "\n") {
		if strings.Contains(line, filepath.Dir(sock)) || strings.Contains(line, dir) {
			t.Errorf("left behind: %s", line)
		}
	}
}
