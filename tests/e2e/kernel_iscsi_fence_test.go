package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/testhost"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// The Linux kernel's initiator, fenced: a volume published (attached in the
// MDS) to the guest's node, whose initiator name is registered, is written
// by the guest through a `basalt iscsi` portal; published to another node,
// the guest's writes fail — promptly, with DATA PROTECT in the kernel's log,
// not retried, the session still logged in — while its reads go on; logged
// in again (a new session), its first write fails the same way.
func TestKernelISCSIFencedInitiator(t *testing.T) {
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"iscsiadm", "iscsid"},
		Modules: []string{"iscsi_tcp", "crc32c_generic", "sd_mod"},
	})
	p := startPlayground(t, "256MiB")
	port := testutil.FreePort(t)
	_, logPath := startAccessCmd(t, port, "iscsi", "--mds", p.st.MDS, "--tls-dir", p.st.TLSDir, "--tls-cert", "access-playground",
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--cluster", iscsiTestCluster)
	guest := guestRunner(t, h, func() string { return tailFile(logPath, 60) })
	target := iscsi.TargetName(iscsiTestCluster, p.st.Volume)
	node := fmt.Sprintf("iscsiadm -m node -T %s -p 10.0.2.2:%d", target, port)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, _ = h.Run(ctx, "iscsiadm -m node --logoutall=all")
	})

	mc, err := mdsclient.Dial([]string{p.st.MDS}, adminTLS(t, p.st.TLSDir))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for id, iqn := range map[string]string{"node-guest": guestInitiator, "node-other": "iqn.2026-11.io.basalt.test:other"} {
		if _, err := mc.RegisterNode(ctx, &api.RegisterNodeRequest{Node: &api.Node{Id: id, InitiatorIqn: iqn}}); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(id string) {
		t.Helper()
		if _, err := mc.AttachVolume(ctx, &api.AttachVolumeRequest{Name: p.st.Volume, Node: id, Exclusive: true}); err != nil {
			t.Fatal(err)
		}
	}
	login := func() {
		t.Helper()
		guest(3*time.Minute, node+" --login && for i in $(seq 120); do [ -b /dev/sda ] && break; sleep 1; done; [ -b /dev/sda ]")
	}
	// write writes /root/block at 4 KiB block n with O_DIRECT and says how
	// it ended, with the time it took.
	write := func(n int) string {
		return guest(3*time.Minute, fmt.Sprintf(`s=$(date +%%s); if dd if=/root/block of=/dev/sda bs=4k count=1 seek=%d oflag=direct conv=notrunc 2>/dev/null; then r=ok; else r=failed; fi; echo "$r $(( $(date +%%s) - s ))s"`, n))
	}

	publish("node-guest")
	guest(time.Minute, startIscsid(guestInitiator))
	guest(time.Minute, node+" -o new >/dev/null")
	login()
	guest(time.Minute, "dd if=/dev/urandom of=/root/block bs=4k count=1 2>/dev/null")
	if got := write(10); !strings.HasPrefix(got, "ok") {
		t.Fatalf("the guest's write while the volume is published to its node: %s", got)
	}

	publish("node-other")
	published := time.Now()
	var refused string
	for {
		// The session's answer is refreshed in the background (every 5 s
		// after its first write): writes go on until it is.
		got := write(11)
		if strings.HasPrefix(got, "failed") {
			refused = got
			break
		}
		if time.Since(published) > 2*time.Minute {
			t.Fatalf("the guest still writes 2 minutes after the volume was published to another node: %s", got)
		}
		time.Sleep(time.Second)
	}
	logf(t, "the guest's first refused write %s after the publish: %s", time.Since(published).Round(time.Second), refused)
	if dmesg := guest(time.Minute, "dmesg | grep -i -A1 'Sense Key' | tail -4"); !strings.Contains(dmesg, "Data Protect") || !strings.Contains(dmesg, "Write protected") {
		t.Fatalf("the kernel does not log DATA PROTECT, WRITE PROTECTED for the refused write:\n%s", dmesg)
	}
	for i := range 3 {
		if got := write(11); !strings.HasPrefix(got, "failed") {
			t.Fatalf("the guest's write %d after it was refused: %s", i+2, got)
		}
	}
	if s := guest(time.Minute, "ls /sys/class/iscsi_session/"); strings.TrimSpace(s) == "" {
		t.Fatal("the refused writes ended the session")
	}
	guest(time.Minute, "dd if=/dev/sda of=/root/back bs=4k count=1 skip=10 iflag=direct 2>/dev/null && cmp /root/block /root/back")

	// A new session asks afresh: its first write is refused.
	guest(3*time.Minute, node+" --logout && for i in $(seq 60); do [ -b /dev/sda ] || break; sleep 1; done; [ ! -b /dev/sda ]")
	login()
	if got := write(12); !strings.HasPrefix(got, "failed") {
		t.Fatalf("the guest's first write after logging in again: %s", got)
	}
	guest(time.Minute, "dd if=/dev/sda of=/root/back bs=4k count=1 skip=10 iflag=direct 2>/dev/null && cmp /root/block /root/back")
	if got := strings.TrimSpace(guest(time.Minute, "dd if=/dev/sda bs=4k count=1 skip=12 iflag=direct 2>/dev/null | tr -d '\\000' | wc -c")); got != "0" {
		t.Fatalf("block 12, written only by refused writes, holds %s non-zero bytes", got)
	}
}
