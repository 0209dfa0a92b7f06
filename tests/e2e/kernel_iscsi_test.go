package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testhost"
	"github.com/basalt-storage/basalt/internal/testutil"
)

const (
	guestInitiator   = "iqn.2026-11.io.basalt.test:guest"
	chapUser         = "guest"
	chapSecret       = "guest-secret-0123"
	chapMutualUser   = "basalt-target"
	chapMutualSecr   = "target-secret-4567"
	iscsiTestCluster = "e2e"
)

// A real Linux kernel is the iSCSI initiator: Debian's kernel in a QEMU guest
// (internal/testhost) with open-iscsi's iscsid and iscsiadm discovers the
// volume's target at a `basalt iscsi` portal that requires mutual CHAP and
// allows only the guest's initiator name; a wrong secret is refused at login;
// with the right ones the kernel logs in, fio writes and verifies on the raw
// disk, ext4 grows online with the volume (a unit attention, a rescan,
// resize2fs), and its checksummed files read back the same after logout,
// login and mount.
func TestKernelISCSI(t *testing.T) {
	begin := time.Now()
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"iscsiadm", "iscsid", "mkfs.ext4", "resize2fs", "fio", "blkid", "dumpe2fs", testcluster.Binary(t)},
		Modules: []string{"iscsi_tcp", "crc32c_generic", "sd_mod", "ext4"},
	})
	booted := time.Now()
	p := startPlayground(t, "1GiB")
	port := testutil.FreePort(t)
	_, logPath := startISCSI(t, p, port)
	target := iscsi.TargetName(iscsiTestCluster, p.st.Volume)
	guest := guestRunner(t, h, func() string { return tailFile(logPath, 60) })
	portal := fmt.Sprintf("10.0.2.2:%d", port)
	node := fmt.Sprintf("iscsiadm -m node -T %s -p %s", target, portal)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, _ = h.Run(ctx, "umount /mnt/vol; iscsiadm -m node --logoutall=all")
	})

	guest(time.Minute, startIscsid(guestInitiator))
	disc := guest(2*time.Minute, "iscsiadm -m discovery -t sendtargets -p "+portal)
	if !strings.Contains(disc, target) {
		t.Fatalf("discovery through %s does not list %s:\n%s", portal, target, disc)
	}
	// The portal answers with the address it was reached at on this host
	// (127.0.0.1): the guest reaches it as 10.0.2.2, so it names its node.
	guest(time.Minute, node+" -o new >/dev/null")
	guest(time.Minute, nodeAuth(node, "wrong-secret-9999"))
	refused := guest(3*time.Minute, node+" --login 2>&1; echo EXIT=$?")
	if !strings.Contains(refused, "EXIT=24") || strings.Contains(refused, "successful") {
		t.Fatalf("login with a wrong CHAP secret: want iscsiadm's authentication failure (exit 24):\n%s", refused)
	}
	guest(time.Minute, nodeAuth(node, chapSecret))
	guest(3*time.Minute, node+" --login && for i in $(seq 120); do [ -b /dev/sda ] && break; sleep 1; done; [ -b /dev/sda ]")
	if got, want := strings.TrimSpace(guest(time.Minute, "blockdev --getsize64 /dev/sda")), strconv.Itoa(1<<30); got != want {
		t.Fatalf("/dev/sda is %s bytes, want the volume's %s", got, want)
	}
	if s := guest(time.Minute, "iscsiadm -m session -P 2"); !strings.Contains(s, "CHAP") || !strings.Contains(s, chapMutualUser) {
		t.Fatalf("the session does not show mutual CHAP:\n%s", s)
	}
	loggedIn := time.Now()

	report := guestFio(t, guest, "fio --name=raw --filename=/dev/sda --rw=randwrite --bs=4k --offset=512m --size=256m "+
		"--io_size=24m --ioengine=libaio --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=11 "+
		"--verify_state_save=0 --output-format=json --output=/root/fio.json")
	fioDone := time.Now()

	guest(5*time.Minute, "mkfs.ext4 -q -E nodiscard /dev/sda && mkdir -p /mnt/vol && mount /dev/sda /mnt/vol")
	guest(5*time.Minute, `set -e
		for n in 1 300 5000 17000; do dd if=/dev/urandom of=/mnt/vol/file-$n bs=1k count=$n 2>/dev/null; done
		sync; fstrim /mnt/vol 2>/dev/null || true`)
	sums := guest(2*time.Minute, "sha256sum /mnt/vol/file-*")

	// Online growth: the volume grows while ext4 is mounted; the session
	// gets a CAPACITY DATA HAS CHANGED unit attention on its next command
	// (the portal re-reads the size every 5 s), the kernel rescans the disk
	// and resize2fs grows the mounted file system into it.
	fsBefore := guestFSBytes(t, guest, "/mnt/vol")
	resized := time.Now()
	run(t, time.Minute, testcluster.Binary(t), "volume", "resize", p.st.Volume, "--size", "2GiB",
		"--mds", p.st.MDS, "--tls-dir", p.st.TLSDir)
	guest(3*time.Minute, `for i in $(seq 120); do
			dd if=/dev/sda of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null
			dmesg | grep -q "Capacity data has changed" && break; sleep 1
		done; dmesg | grep "Capacity data has changed"`)
	noticed := time.Now()
	guest(time.Minute, "echo 1 > /sys/block/sda/device/rescan")
	if got, want := strings.TrimSpace(guest(time.Minute, "blockdev --getsize64 /dev/sda")), strconv.Itoa(2<<30); got != want {
		t.Fatalf("after the resize and a rescan /dev/sda is %s bytes, want %s", got, want)
	}
	guest(5*time.Minute, "resize2fs /dev/sda")
	fsAfter := guestFSBytes(t, guest, "/mnt/vol")
	if fsAfter < fsBefore+(900<<20) {
		t.Fatalf("the mounted ext4 has %d bytes after resize2fs, %d before: it did not grow by the volume's 1 GiB", fsAfter, fsBefore)
	}
	if got := guest(2*time.Minute, "sha256sum /mnt/vol/file-*"); got != sums {
		t.Fatalf("files after the online growth:\n%swant:\n%s", got, sums)
	}
	logf(t, "online growth: resize to the unit attention in the guest %s; ext4 %d → %d MiB",
		noticed.Sub(resized).Round(time.Millisecond), fsBefore>>20, fsAfter>>20)

	guest(3*time.Minute, "umount /mnt/vol && "+node+" --logout && for i in $(seq 60); do [ -b /dev/sda ] || break; sleep 1; done; [ ! -b /dev/sda ]")
	// Again through the CSI node plugin's iSCSI attach (csi.StageDevice, what
	// NodeStageVolume does: an iscsiadm node record, --login, LUN 0's disk
	// found in sysfs, the ext4 found and mounted) at a portal without CHAP,
	// as the plugin's own loopback portal is; then its unstage (unmount,
	// --logout, the record deleted, the session gone).
	open := testutil.FreePort(t)
	startAccessCmd(t, open, "iscsi", "--mds", p.st.MDS, "--tls-dir", p.st.TLSDir, "--tls-cert", "access-playground",
		"--listen", "127.0.0.1:"+strconv.Itoa(open), "--cluster", iscsiTestCluster)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := h.Run(ctx, fmt.Sprintf("%s csi stage-device %s --method iscsi --addr 10.0.2.2:%d --cluster %s --path /mnt/vol --state /tmp/stage.json 2>&1",
		testcluster.Binary(t), p.st.Volume, open, iscsiTestCluster))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(out), "/dev/sd") {
		t.Fatalf("guest: csi stage-device over iSCSI: %v\n%s", err, tail(out, 20))
	}
	if got := guest(2*time.Minute, "sha256sum /mnt/vol/file-*"); got != sums {
		t.Fatalf("files after unmount, logout and the plugin's stage:\n%swant:\n%s", got, sums)
	}
	guest(3*time.Minute, testcluster.Binary(t)+" csi unstage-device /tmp/stage.json")
	if left := strings.TrimSpace(guest(time.Minute, "grep ' /mnt/vol ' /proc/mounts; ls /sys/class/iscsi_session/ 2>/dev/null; iscsiadm -m node 2>/dev/null | grep -F 10.0.2.2:"+strconv.Itoa(open)+","+"; true")); left != "" {
		t.Fatalf("after the plugin's unstage the guest still has:\n%s", left)
	}
	logf(t, "kernel iSCSI: guest up in %s (kernel %s); discovery + refused login + login with mutual CHAP %s; "+
		"fio randwrite 4 KiB iodepth 16 with crc32c verify: %.0f write IOPS, %.0f verify-read IOPS (%s, emulated CPU); "+
		"ext4 + files + re-login %s; whole test %s",
		booted.Sub(begin).Round(time.Millisecond), h.Stats().Kernel, loggedIn.Sub(booted).Round(time.Millisecond),
		report.Write.IOPS, report.Read.IOPS, fioDone.Sub(loggedIn).Round(time.Millisecond),
		time.Since(fioDone).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
}

// startISCSI runs `basalt iscsi` on port over p's cluster, requiring mutual
// CHAP and allowing only guestInitiator, and returns the process and its log
// file.
func startISCSI(t *testing.T, p *pg, port int, extra ...string) (*exec.Cmd, string) {
	t.Helper()
	dir := t.TempDir()
	secret, mutual := filepath.Join(dir, "chap"), filepath.Join(dir, "chap-mutual")
	if err := os.WriteFile(secret, []byte(chapSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mutual, []byte(chapMutualSecr+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startAccessCmd(t, port, append([]string{"iscsi", "--mds", p.st.MDS, "--tls-dir", p.st.TLSDir, "--tls-cert", "access-playground",
		"--listen", "127.0.0.1:" + strconv.Itoa(port), "--cluster", iscsiTestCluster, "--initiator", guestInitiator,
		"--chap-user", chapUser, "--chap-secret-file", secret,
		"--chap-mutual-user", chapMutualUser, "--chap-mutual-secret-file", mutual}, extra...)...)
}

// guestFSBytes is the size of the file system mounted at dir in the guest
// (df's 1K-blocks, in bytes).
func guestFSBytes(t *testing.T, guest func(time.Duration, string) string, dir string) int64 {
	t.Helper()
	f := strings.Fields(guest(time.Minute, "df -k "+dir+" | tail -1"))
	if len(f) < 2 {
		t.Fatalf("df %s: %q", dir, f)
	}
	kb, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df %s: %q: %v", dir, f, err)
	}
	return kb << 10
}

// nodeAuth is the guest script that sets an iscsiadm node's mutual CHAP
// settings, with secret as the initiator's secret.
func nodeAuth(node, secret string) string {
	return strings.Join([]string{
		node + " -o update -n node.session.auth.authmethod -v CHAP",
		node + " -o update -n node.session.auth.username -v " + chapUser,
		node + " -o update -n node.session.auth.password -v " + secret,
		node + " -o update -n node.session.auth.username_in -v " + chapMutualUser,
		node + " -o update -n node.session.auth.password_in -v " + chapMutualSecr,
	}, " && ")
}

// startIscsid is the guest script that names the initiator and starts
// open-iscsi's daemon.
func startIscsid(initiator string) string {
	return fmt.Sprintf(`set -e
		mkdir -p /etc/iscsi/nodes /etc/iscsi/send_targets /var/lib/iscsi /run/lock/iscsi
		echo "InitiatorName=%s" > /etc/iscsi/initiatorname.iscsi
		printf 'node.startup = manual\n' > /etc/iscsi/iscsid.conf
		iscsid # returns once it listens for iscsiadm`, initiator)
}
