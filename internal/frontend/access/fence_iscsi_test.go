package access_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// qemuIO is a qemu-io process on an iSCSI LUN (QEMU's iSCSI driver,
// libiscsi): one iSCSI session, logged in as one initiator name, taking
// qemu-io commands one at a time.
type qemuIO struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
}

// qemuIOPrompt is what qemu-io prints when it waits for a command.
const qemuIOPrompt = "qemu-io> "

// startQemuIO logs in to volume's target at portal as initiator.
func startQemuIO(t *testing.T, ctx context.Context, portal, volume, initiator string) *qemuIO {
	t.Helper()
	host, port, _ := strings.Cut(portal, ":")
	opts := fmt.Sprintf("driver=iscsi,transport=tcp,portal=%s:%s,target=%s,lun=0,initiator-name=%s",
		host, port, iscsi.TargetName("c", volume), initiator)
	return runQemuIO(t, ctx, opts, initiator)
}

// runQemuIO starts qemu-io on the image opts (its --image-opts) as who.
func runQemuIO(t *testing.T, ctx context.Context, opts, who string) *qemuIO {
	t.Helper()
	cmd := exec.CommandContext(ctx, "qemu-io", "--image-opts", opts)
	cmd.WaitDelay = 5 * time.Second
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w // one stream: errors in order with the rest
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
		r.Close()
	})
	q := &qemuIO{t: t, in: in, out: bufio.NewReader(r)}
	if out, err := q.untilPrompt(); err != nil {
		t.Fatalf("qemu-io as %s: %v: %s", who, err, out)
	}
	return q
}

// untilPrompt reads qemu-io's output up to its next prompt.
func (q *qemuIO) untilPrompt() (string, error) {
	var b strings.Builder
	for !strings.HasSuffix(b.String(), qemuIOPrompt) {
		c, err := q.out.ReadByte()
		if err != nil {
			return b.String(), err
		}
		b.WriteByte(c)
	}
	return strings.TrimSuffix(b.String(), qemuIOPrompt), nil
}

// do runs one qemu-io command and returns what it printed.
func (q *qemuIO) do(command string) string {
	q.t.Helper()
	if _, err := io.WriteString(q.in, command+"\n"); err != nil {
		q.t.Fatalf("qemu-io %q: %v", command, err)
	}
	out, err := q.untilPrompt()
	if err != nil {
		q.t.Fatalf("qemu-io %q: %v: %s", command, err, out)
	}
	return out
}

// publish attaches volume "vol" to node, writable and exclusive, as
// ControllerPublishVolume does.
func publish(t *testing.T, ctx context.Context, mc *mdsclient.Client, node string) {
	t.Helper()
	if _, err := mc.AttachVolume(ctx, &api.AttachVolumeRequest{Name: "vol", Node: node, Exclusive: true}); err != nil {
		t.Fatal(err)
	}
}

// wrote fails the test unless qemu-io's output is a whole 4 KiB write.
func wrote(t *testing.T, what, out string) {
	t.Helper()
	if !strings.Contains(out, "wrote 4096/4096 bytes") {
		t.Fatalf("%s: %s", what, out)
	}
}

// reads fails the test unless qemu-io's output is a whole 4 KiB read that
// matched its pattern.
func reads(t *testing.T, what, out string) {
	t.Helper()
	if !strings.Contains(out, "read 4096/4096 bytes") || strings.Contains(out, "failed") {
		t.Fatalf("%s: %s", what, out)
	}
}

// dataProtect reports whether qemu-io's output is a write refused with
// DATA PROTECT, WRITE PROTECTED (07/27/00), which QEMU logs and returns as
// EACCES.
func dataProtect(out string) bool {
	return strings.Contains(out, "SENSE KEY:DATA PROTECTION(7) ASCQ:WRITE_PROTECTED(0x2700)") &&
		strings.Contains(out, "write failed: Permission denied")
}

// TestFencedInitiatorStaysFenced: a volume published (attached in the MDS)
// to node A, whose iSCSI initiator name is registered, is written by A's
// initiator; B's initiator, on another access node, is refused as QEMU's
// iSCSI driver sees a write-protected LUN (EACCES: DATA PROTECT) and
// changes nothing, fencing nobody, while its reads go on. Published to B,
// B writes; A's session is refused once its answer is refreshed, and A
// logging in again — on its access node or on B's — is refused at its
// first write; B's data is all there.
func TestFencedInitiatorStaysFenced(t *testing.T) {
	testutil.RequireTool(t, "qemu-io")
	if out, _ := exec.Command("qemu-img", "--help").CombinedOutput(); !bytes.Contains(out, []byte("iscsi")) {
		t.Skip("qemu has no iscsi driver (Debian package qemu-block-extra)")
	}
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	id := c.Identity(identity.RoleAdmin, "access-fence-iscsi")
	mdsAddrs := strings.Split(c.MDSAddr, ",")
	mc, err := mdsclient.Dial(mdsAddrs, id.ClientTLS(identity.RoleMDS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const iqnA = "iqn.2026-12.io.basalt.test:node-a"
	const iqnB = "iqn.2026-12.io.basalt.test:node-b"
	for node, iqn := range map[string]string{"node-a": iqnA, "node-b": iqnB} {
		if _, err := mc.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: node, InitiatorIqn: iqn}}); err != nil {
			t.Fatal(err)
		}
	}
	var portals []string
	for i := range 2 {
		node, err := access.Start(access.Config{
			MDS: mdsAddrs, MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
			ClientName: fmt.Sprintf("access-fence-iscsi-%d", i),
			ISCSI:      access.ISCSIConfig{Listen: "127.0.0.1:0", Cluster: "c"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { node.Close() })
		portals = append(portals, node.ISCSIPortal().String())
	}
	refused := func(what, out string) {
		t.Helper()
		if !dataProtect(out) {
			t.Fatalf("%s: %s; want DATA PROTECT, WRITE PROTECTED (write failed: Permission denied)", what, out)
		}
	}

	c.CreateVolume("vol", 16<<20)
	publish(t, ctx, mc, "node-a")
	a := startQemuIO(t, ctx, portals[0], "vol", iqnA)
	wrote(t, "A's write while the volume is published to A", a.do("write -P 0x61 0 4k"))
	b := startQemuIO(t, ctx, portals[1], "vol", iqnB)
	for i := range 3 {
		refused(fmt.Sprintf("B's write %d while the volume is published to A", i+1), b.do("write -P 0x62 4k 4k"))
	}
	reads(t, "B's read", b.do("read -P 0x61 0 4k"))
	reads(t, "B's read of the block it was refused", b.do("read -P 0 4k 4k"))
	wrote(t, "A's write after B's were refused (A still the writer)", a.do("write -P 0x61 8k 4k"))

	// Published to B: B's next session writes and takes the writer role.
	publish(t, ctx, mc, "node-b")
	b = startQemuIO(t, ctx, portals[1], "vol", iqnB)
	wrote(t, "B's write once the volume is published to B", b.do("write -P 0x62 4k 4k"))
	deadline := time.Now().Add(2 * time.Minute)
	for tries := 1; ; tries++ {
		// Fenced by B's epoch first (its backend cannot write, NOT READY),
		// then refused by its refreshed answer.
		out := a.do("write -P 0x61 12k 4k")
		if strings.Contains(out, "wrote") {
			t.Fatalf("A's late write on its old session was written: %s", out)
		}
		if dataProtect(out) {
			t.Logf("A's old session refused at its write %d: %s", tries, strings.TrimSpace(out))
			break
		}
		if tries == 1 {
			t.Logf("A's first late write on its old session: %s", strings.TrimSpace(out))
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's old session not refused 2 minutes after the volume was published to B: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i, portal := range portals {
		again := startQemuIO(t, ctx, portal, "vol", iqnA)
		refused(fmt.Sprintf("A's first write after logging in again at access node %d", i), again.do("write -P 0x61 12k 4k"))
		reads(t, "A's read after logging in again", again.do("read -P 0x62 4k 4k"))
	}
	// B was not fenced: its writes go on, and its data is all there.
	wrote(t, "B's write after A came back", b.do("write -P 0x63 16k 4k"))
	for _, r := range []string{"read -P 0x61 0 4k", "read -P 0x62 4k 4k", "read -P 0x61 8k 4k", "read -P 0 12k 4k", "read -P 0x63 16k 4k"} {
		reads(t, "B reads back: "+r, b.do(r))
	}
}
