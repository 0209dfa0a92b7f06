package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/nvmftshark"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testhost"
	"github.com/basalt-storage/basalt/internal/testutil"
)

const (
	guestHostNQN = "nqn.2014-08.org.nvmexpress:uuid:0ba5a17e-0000-4000-8000-000000000001"
	strangerNQN  = "nqn.2014-08.org.nvmexpress:uuid:0ba5a17e-0000-4000-8000-00000000dead"
	// neighborNQN is on a target's --allow-hosts but not on the volume's
	// own allow-list (basalt volume allow-host).
	neighborNQN   = "nqn.2014-08.org.nvmexpress:uuid:0ba5a17e-0000-4000-8000-00000000beef"
	nvmfVolumeNQN = "nqn.2024-11.io.basalt:volume:"
)

// A real Linux kernel is the NVMe/TCP host: Debian's kernel in a QEMU guest
// (internal/testhost) with nvme-cli discovers the volume's subsystem at a
// `basalt nvmf` target over the playground's cluster; a host not on the
// target's allow-list (--allow-hosts), and one on it but not on the
// volume's own (basalt volume allow-host), neither sees the subsystem in
// its discovery log nor connects to it; the host on both lists
// connects with header and data digests, fio writes and verifies on the raw
// namespace, and ext4 with checksummed files reads back the same after
// disconnect, connect and mount.
func TestKernelNVMeTCP(t *testing.T) {
	begin := time.Now()
	h := testhost.Start(t, testhost.Config{
		Tools:   []string{"nvme", "mkfs.ext4", "fio"},
		Modules: []string{"nvme-tcp", "ext4", "crc32c_generic"},
	})
	booted := time.Now()
	p := startPlayground(t, "1GiB")
	// Before the target starts, so its first read of the lists has it.
	run(t, time.Minute, testcluster.Binary(t), "volume", "allow-host", p.st.Volume, guestHostNQN,
		"--mds", p.st.MDS, "--tls-dir", p.st.TLSDir)
	port, logPath := startNVMf(t, p.st.MDS, p.st.TLSDir, neighborNQN)
	// The guest's connections reach the target through QEMU's user-mode
	// network, as connections to the host's loopback: captured there,
	// tshark judges the kernel's traffic and the target's answers.
	capture := nvmftshark.Start(t, fmt.Sprintf("127.0.0.1:%d", port))
	nqn := nvmfVolumeNQN + p.st.Volume
	guest := guestRunner(t, h, func() string { return tailFile(logPath, 60) })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, _ = h.Run(ctx, "umount /mnt/vol; nvme disconnect-all")
	})
	addr := fmt.Sprintf("-t tcp -a 10.0.2.2 -s %d", port)

	disc := guest(2*time.Minute, fmt.Sprintf("nvme discover %s -q %s", addr, guestHostNQN))
	if !strings.Contains(disc, nqn) || !strings.Contains(disc, "trtype:  tcp") && !strings.Contains(disc, "tcp") {
		t.Fatalf("nvme discover does not list %s:\n%s", nqn, disc)
	}
	for _, host := range []string{strangerNQN, neighborNQN} {
		out := guest(2*time.Minute, fmt.Sprintf(`nvme discover %s -q %s 2>&1
			if nvme connect %s -n %s -q %s 2>&1; then echo CONNECTED; else echo REFUSED; fi`, addr, host, addr, nqn, host))
		if strings.Contains(out, nqn) || !strings.Contains(out, "REFUSED") {
			t.Fatalf("host %s, not on both allow-lists, discovered or connected to %s:\n%s", host, nqn, out)
		}
	}
	if b, _ := os.ReadFile(logPath); !strings.Contains(string(b), "hostnqn="+neighborNQN) ||
		!strings.Contains(string(b), "not on the allow-list refused") {
		t.Fatalf("the target's log shows no refusal of %s:\n%s", neighborNQN, tailFile(logPath, 40))
	}

	connect := fmt.Sprintf(`nvme connect %s -n %s -q %s --hdr-digest --data-digest -k 5 &&
		for i in $(seq 120); do [ -b /dev/nvme0n1 ] && break; sleep 1; done; [ -b /dev/nvme0n1 ]`, addr, nqn, guestHostNQN)
	guest(3*time.Minute, connect)
	if got, want := strings.TrimSpace(guest(time.Minute, "blockdev --getsize64 /dev/nvme0n1")), strconv.Itoa(1<<30); got != want {
		t.Fatalf("/dev/nvme0n1 is %s bytes, want the volume's %s", got, want)
	}
	if b, _ := os.ReadFile(logPath); !strings.Contains(string(b), "I/O queue connected") ||
		!strings.Contains(string(b), "hdgst=true ddgst=true") {
		t.Fatalf("the target's log shows no I/O queue with both digests:\n%s", tailFile(logPath, 40))
	}
	connected := time.Now()

	// fio with verify on the raw namespace.
	j := guestFio(t, guest, "fio --name=raw --filename=/dev/nvme0n1 --rw=randwrite --bs=4k --offset=512m --size=256m "+
		"--io_size=24m --ioengine=libaio --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=11 "+
		"--verify_state_save=0 --output-format=json --output=/root/fio.json")
	fioDone := time.Now()

	// ext4 with files; disconnect, connect (a new controller) and mount: same sums.
	guest(5*time.Minute, "mkfs.ext4 -q -E nodiscard /dev/nvme0n1 && mkdir -p /mnt/vol && mount /dev/nvme0n1 /mnt/vol")
	guest(5*time.Minute, `set -e
		for n in 1 300 5000 17000; do dd if=/dev/urandom of=/mnt/vol/file-$n bs=1k count=$n 2>/dev/null; done
		sync; fstrim /mnt/vol 2>/dev/null || true`)
	sums := guest(2*time.Minute, "sha256sum /mnt/vol/file-*")
	guest(3*time.Minute, fmt.Sprintf("umount /mnt/vol && nvme disconnect -n %s", nqn))
	guest(3*time.Minute, connect)
	guest(2*time.Minute, "mount /dev/nvme0n1 /mnt/vol")
	if got := guest(2*time.Minute, "sha256sum /mnt/vol/file-*"); got != sums {
		t.Fatalf("files after unmount, disconnect, connect and mount:\n%swant:\n%s", got, sums)
	}
	guest(3*time.Minute, fmt.Sprintf("umount /mnt/vol && nvme disconnect -n %s", nqn))
	reconnected := time.Now()
	noticed := discoveryNotice(t, h, guest, addr, nqn, p)
	noticeDone := time.Now()

	if capture == nil {
		t.Log("tshark's judge skipped: no capture (tshark or dumpcap missing or not allowed to capture; see above)")
	} else {
		// Three discoveries, two refused connects, two controllers (an
		// admin and at least one I/O queue each); every command the kernel
		// sent.
		capture.Check(t, 9, nvmftshark.Want{Digests: true, PDUs: map[int]int{nvmftshark.ICReq: 9, nvmftshark.ICResp: 8,
			nvmftshark.CapsuleCmd: 5000, nvmftshark.CapsuleRsp: 5000, nvmftshark.C2HData: 1000}})
	}
	logf(t, "kernel NVMe/TCP: guest up in %s (kernel %s); discover+refusal+connect with digests %s; "+
		"fio randwrite 4 KiB iodepth 16 with crc32c verify: %.0f write IOPS, %.0f verify-read IOPS (%s, emulated CPU); "+
		"ext4 + files + reconnect %s; discovery log change notice to the kernel's uevent %s (step %s); whole test %s",
		booted.Sub(begin).Round(time.Millisecond), h.Stats().Kernel, connected.Sub(booted).Round(time.Millisecond),
		j.Write.IOPS, j.Read.IOPS, fioDone.Sub(connected).Round(time.Millisecond),
		reconnected.Sub(fioDone).Round(time.Millisecond), noticed.Round(time.Millisecond),
		noticeDone.Sub(reconnected).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
}

// discoveryNotice: the kernel judges the discovery log change notice. The
// guest keeps a persistent discovery controller for neighborNQN (on the
// target's --allow-hosts, not on the volume's allow-list: its log lacks
// nqn); then the volume allows neighborNQN. The kernel enables the notice
// (OAES bit 31), holds an Asynchronous Event Request, and passes the
// notice to user space as a uevent on that controller, NVME_AEN=0x70f002
// (drivers/nvme/host/core.c: nvme_handle_aen_notice keeps the result of a
// Discovery Log Page Change notice, nvme_aen_uevent sends it). The guest
// has no udev: busybox's uevent applet records the uevents. Afterwards
// `nvme discover` lists nqn. It returns how long the notice took from the
// allow-list edit to the uevent.
func discoveryNotice(t *testing.T, h *testhost.Host, guest func(time.Duration, string) string, addr, nqn string, p *pg) time.Duration {
	t.Helper()
	// The recorder, and a probe uevent (a "change" of /dev/null) until it
	// shows, so the recorder listens before the controller exists.
	guest(2*time.Minute, `cat >/root/uevent.sh <<'EOF'
#!/bin/sh
echo "$ACTION $DEVNAME NVME_AEN=$NVME_AEN NVME_EVENT=$NVME_EVENT" >>/tmp/uevents
EOF
		chmod +x /root/uevent.sh
		setsid uevent /root/uevent.sh </dev/null >/tmp/uevent.log 2>&1 &
		for i in $(seq 120); do
			echo change >/sys/class/mem/null/uevent
			grep -q '^change null ' /tmp/uevents 2>/dev/null && exit 0
			sleep 1
		done
		echo "busybox uevent records nothing:"; cat /tmp/uevent.log; exit 1`)
	disc := guest(2*time.Minute, fmt.Sprintf("nvme discover %s -q %s --persistent", addr, neighborNQN))
	if strings.Contains(disc, nqn) {
		t.Fatalf("%s discovered %s before the volume allowed it:\n%s", neighborNQN, nqn, disc)
	}
	ctrl := strings.TrimSpace(guest(time.Minute, fmt.Sprintf(`for c in /sys/class/nvme/nvme*; do
			[ "$(cat $c/subsysnqn)" = %s ] && [ "$(cat $c/hostnqn)" = %s ] &&
				echo "${c##*/} kato=$(cat $c/kato) state=$(cat $c/state)"
		done; true`, discoveryNQN, neighborNQN)))
	if f := strings.Fields(ctrl); len(f) != 3 || f[1] == "kato=0" || f[2] != "state=live" {
		t.Fatalf("want one live persistent discovery controller (keep-alive on) of %s in the guest, have %q", neighborNQN, ctrl)
	}
	dev := strings.Fields(ctrl)[0]
	t.Cleanup(func() { // the test's own disconnect-all may not take a discovery controller
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = h.Run(ctx, "echo 1 >/sys/class/nvme/"+dev+"/delete_controller")
	})

	edited := time.Now()
	run(t, time.Minute, testcluster.Binary(t), "volume", "allow-host", p.st.Volume, neighborNQN,
		"--mds", p.st.MDS, "--tls-dir", p.st.TLSDir)
	want := "change " + dev + " NVME_AEN=0x70f002 "
	// Generous: the target finds an allow-list change at its next
	// discovery check (5 s).
	got := guest(4*time.Minute, fmt.Sprintf(`for i in $(seq 180); do grep -q '^%s' /tmp/uevents && break; sleep 1; done
		cat /tmp/uevents`, want))
	took := time.Since(edited)
	if !strings.Contains(got, "\n"+want) && !strings.HasPrefix(got, want) {
		t.Fatalf("no discovery log change uevent (%q) from the kernel after 3 minutes; its uevents:\n%s", want, got)
	}
	t.Logf("the guest kernel's uevents, recorded by busybox uevent:\n%s", got)
	if disc := guest(2*time.Minute, fmt.Sprintf("nvme discover %s -q %s", addr, neighborNQN)); !strings.Contains(disc, nqn) {
		t.Fatalf("%s does not discover %s after the notice:\n%s", neighborNQN, nqn, disc)
	}
	guest(time.Minute, fmt.Sprintf(`echo 1 >/sys/class/nvme/%s/delete_controller; kill $(pidof uevent)
		for i in $(seq 60); do [ -e /sys/class/nvme/%s ] || exit 0; sleep 1; done; echo still there; exit 1`, dev, dev))
	return took
}

// startNVMf runs `basalt nvmf` over the cluster at mds, allowing only
// guestHostNQN and the hosts more names, and returns its port and log file.
func startNVMf(t *testing.T, mds, tlsDir string, more ...string) (int, string) {
	t.Helper()
	port := testutil.FreePort(t)
	return port, startAccess(t, port, "nvmf", "--mds", mds, "--tls-dir", tlsDir, "--tls-cert", "access-playground",
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--allow-hosts", strings.Join(append([]string{guestHostNQN}, more...), ","))
}

// startAccess runs `basalt ARGS` (a front end) until the test ends and waits
// until it listens on port; it returns the process's log file. The log's
// tail is printed if the test fails.
func startAccess(t *testing.T, port int, args ...string) string {
	t.Helper()
	_, logPath := startAccessCmd(t, port, args...)
	return logPath
}

// startAccessCmd is startAccess that also returns the process, for a test
// that kills it.
func startAccessCmd(t *testing.T, port int, args ...string) (*exec.Cmd, string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), args[0]+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testcluster.Binary(t), args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		lf.Close()
		if t.Failed() {
			t.Logf("---- basalt %s log (tail) ----\n%s", args[0], tailFile(logPath, 100))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			c.Close()
			return cmd, logPath
		}
		if time.Now().After(deadline) {
			t.Fatalf("basalt %s does not listen on %d after 60 s:\n%s", args[0], port, tailFile(logPath, 100))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tailFile returns the last n lines of a file.
func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
