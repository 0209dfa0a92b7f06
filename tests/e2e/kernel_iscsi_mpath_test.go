package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/testhost"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// Two access nodes under the guest kernel's dm-multipath, found through a
// redirector portal: the guest's login to the redirector is sent on to one
// access node (and served there, with mutual CHAP); its discovery through
// the redirector lists both nodes' portals, as they registered them with
// the MDS; it logs in to the volume's target through both, sees one disk twice
// (the same WWID, from VPD page 0x83), and puts a multipath map over both
// (the kernel's dm-multipath target, active/passive — one priority group per
// path — with queue_if_no_path; the map is made with dmsetup: multipath-tools
// needs udev, which the test guest does not run). fio writes with verify
// through the map while the active portal is killed and then a chunkserver:
// no IO error, the verify passes, and the map shows the dead path failed.
func TestKernelISCSIMultipath(t *testing.T) {
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"iscsiadm", "iscsid", "dmsetup", "fio"},
		Modules: []string{"iscsi_tcp", "crc32c_generic", "sd_mod", "dm-multipath", "dm-round-robin"}, // iscsi_tcp needs crc32c even without digests
	})
	p := startPlayground(t, "1GiB")
	ports := []int{testutil.FreePort(t), testutil.FreePort(t)}
	// The access nodes register the address the guest reaches them at.
	first, _ := startISCSI(t, p, ports[0], "--register", "--advertise", fmt.Sprintf("10.0.2.2:%d", ports[0]))
	startISCSI(t, p, ports[1], "--register", "--advertise", fmt.Sprintf("10.0.2.2:%d", ports[1]))
	redir := testutil.FreePort(t)
	startAccessCmd(t, redir, "iscsi", "--redirect", "--mds", p.st.MDS, "--tls-dir", p.st.TLSDir, "--tls-cert", "access-playground",
		"--listen", "127.0.0.1:"+strconv.Itoa(redir), "--cluster", iscsiTestCluster)
	target := iscsi.TargetName(iscsiTestCluster, p.st.Volume)
	guest := guestRunner(t, h, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, _ = h.Run(ctx, "dmsetup remove mpath; iscsiadm -m node --logoutall=all")
	})

	guest(time.Minute, startIscsid(guestInitiator))
	// A login to the redirector's portal: the kernel follows the
	// redirection to an access node, which serves the session.
	viaRedir := fmt.Sprintf("iscsiadm -m node -T %s -p 10.0.2.2:%d", target, redir)
	guest(time.Minute, viaRedir+" -o new >/dev/null && "+nodeAuth(viaRedir, chapSecret))
	guest(3*time.Minute, viaRedir+" --login && for i in $(seq 120); do [ -b /dev/sda ] && break; sleep 1; done; [ -b /dev/sda ]")
	session := guest(time.Minute, "iscsiadm -m session -P 1")
	current := regexp.MustCompile(`Current Portal: (\S+?),`).FindStringSubmatch(session)
	if current == nil || (current[1] != fmt.Sprintf("10.0.2.2:%d", ports[0]) && current[1] != fmt.Sprintf("10.0.2.2:%d", ports[1])) {
		t.Fatalf("a login through the redirector 10.0.2.2:%d did not end at an access node's portal %v:\n%s", redir, ports, session)
	}
	guest(3*time.Minute, viaRedir+" --logout && "+viaRedir+" -o delete && for i in $(seq 60); do [ -b /dev/sda ] || break; sleep 1; done; [ ! -b /dev/sda ]")

	// Discovery through the redirector lists the target at both access
	// nodes' portals; the guest logs in through each.
	disc := guest(2*time.Minute, fmt.Sprintf("iscsiadm -m discovery -t sendtargets -p 10.0.2.2:%d", redir))
	for _, port := range ports {
		if want := fmt.Sprintf("10.0.2.2:%d,1 %s", port, target); !strings.Contains(disc, want) {
			t.Fatalf("discovery through the redirector does not list %q:\n%s", want, disc)
		}
	}
	for _, port := range ports {
		node := fmt.Sprintf("iscsiadm -m node -T %s -p 10.0.2.2:%d", target, port)
		// A short replacement timeout, as multipath setups use: IO on a path
		// whose portal is gone fails after 5 s, so dm-multipath retries it on
		// the other path (the default 120 s would stall it that long).
		guest(time.Minute, nodeAuth(node, chapSecret)+" && "+
			node+" -o update -n node.session.timeo.replacement_timeout -v 5")
		guest(3*time.Minute, node+" --login")
	}
	guest(2*time.Minute, "for i in $(seq 120); do [ -b /dev/sda ] && [ -b /dev/sdb ] && break; sleep 1; done; [ -b /dev/sdb ]")
	wwids := strings.Fields(guest(time.Minute, "cat /sys/block/sda/device/wwid /sys/block/sdb/device/wwid"))
	if len(wwids) < 2 || strings.Join(wwids[:len(wwids)/2], " ") != strings.Join(wwids[len(wwids)/2:], " ") {
		t.Fatalf("the two paths do not show one disk: WWIDs %q", wwids)
	}
	// Which disk came through which portal: the map puts the first portal's
	// path in the first priority group.
	disks := map[string]string{} // portal → sdX
	for _, line := range strings.Split(guest(time.Minute,
		`iscsiadm -m session -P 3 | awk '/Current Portal:/ {p=$3} /Attached scsi disk/ {print p, $4}'`), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			disks[strings.TrimSuffix(f[0], ",1")] = f[1]
		}
	}
	active, standby := disks[fmt.Sprintf("10.0.2.2:%d", ports[0])], disks[fmt.Sprintf("10.0.2.2:%d", ports[1])]
	if active == "" || standby == "" {
		t.Fatalf("cannot tell the paths' disks apart: %v", disks)
	}
	// Active/passive (multipath-tools' path_grouping_policy failover): one
	// priority group per path. A volume has one writer; round-robin over two
	// access nodes would make each take the writer role from the other
	// (epoch fencing) until both paths failed.
	guest(time.Minute, fmt.Sprintf(`DM_DISABLE_UDEV=1 dmsetup create mpath --table "0 $(blockdev --getsz /dev/%[1]s) multipath 1 queue_if_no_path 0 2 1 round-robin 0 1 1 /dev/%[1]s 1 round-robin 0 1 1 /dev/%[2]s 1" &&
		for i in $(seq 30); do [ -b /dev/dm-0 ] && break; sleep 1; done; [ -b /dev/dm-0 ]`, active, standby))
	if got, want := strings.TrimSpace(guest(time.Minute, "blockdev --getsize64 /dev/dm-0")), strconv.Itoa(1<<30); got != want {
		t.Fatalf("the multipath map is %s bytes, want the volume's %s", got, want)
	}

	writes := func() int { // write requests the map completed so far
		f := strings.Fields(guest(time.Minute, "cat /sys/block/dm-0/stat"))
		n, err := strconv.Atoi(f[4])
		if err != nil {
			t.Fatalf("/sys/block/dm-0/stat: %v", err)
		}
		return n
	}
	fioDone := make(chan error, 1)
	fioStart := time.Now()
	go func() {
		// 8192 writes then their verify; the deadline is for a hang, not a pace.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		_, err := h.Run(ctx, "fio --name=mpath --filename=/dev/dm-0 --rw=randwrite --bs=4k --size=256m --io_size=32m "+
			"--ioengine=libaio --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=5 "+
			"--verify_state_save=0 --output-format=json --output=/root/fio.json")
		fioDone <- err
	}()
	// waitWrites waits until the map completed n more writes and returns how
	// long that took.
	waitWrites := func(n int, what string) time.Duration {
		start, from := time.Now(), writes()
		for writes()-from < n {
			select {
			case err := <-fioDone:
				t.Fatalf("fio ended %s: %v\n%s", what, err, guest(time.Minute, "cat /root/fio.json; dmsetup status mpath"))
			case <-time.After(500 * time.Millisecond):
			}
		}
		return time.Since(start)
	}
	waitWrites(1500, "before a portal was killed")
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	failover := waitWrites(100, "after a portal was killed")
	waitWrites(1500, "after a portal was killed")
	victim := p.busiestLeader()
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill chunkserver %d: %v", victim.Index, err)
	}
	afterCS := waitWrites(100, "after a chunkserver was killed")
	if err := <-fioDone; err != nil {
		t.Fatalf("fio in the guest failed: %v\n%s", err, guest(time.Minute, "cat /root/fio.json; dmsetup status mpath"))
	}
	report := readFio(t, guest)
	status := guest(time.Minute, "dmsetup status mpath")
	// "... A 0 2 1 8:0 F 1 0 1 8:16 A 0 0 1": the killed portal's path failed.
	if !strings.Contains(status, " F ") {
		t.Fatalf("dmsetup status shows no failed path after a portal was killed: %s", status)
	}
	logf(t, "kernel iSCSI multipath: a portal killed %s into fio; the next 100 writes through the map took %s "+
		"(replacement_timeout 5 s, then the other path); chunkserver %d killed, the next 100 writes took %s; "+
		"fio %.0f write IOPS, %.0f verify-read IOPS; map status: %s",
		killed.Sub(fioStart).Round(time.Millisecond), failover.Round(time.Millisecond), victim.Index,
		afterCS.Round(time.Millisecond), report.Write.IOPS, report.Read.IOPS, strings.TrimSpace(status))
}
