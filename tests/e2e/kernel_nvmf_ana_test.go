package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/nvmftshark"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testhost"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// accessNode is a `basalt nvmf --multipath` process.
type accessNode struct {
	port   int
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startAccessNode runs `basalt nvmf --multipath` on a free port, advertised
// to the guest as 10.0.2.2:PORT, allowing only guestHostNQN.
func startAccessNode(t *testing.T, mds, tlsDir string) *accessNode {
	t.Helper()
	a := &accessNode{port: testutil.FreePort(t), exited: make(chan struct{})}
	a.log = filepath.Join(t.TempDir(), "nvmf.log")
	lf, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(testcluster.Binary(t), "nvmf", "--multipath", "--mds", mds, "--tls-dir", tlsDir, "--tls-cert", "access-playground",
		"--listen", "127.0.0.1:"+strconv.Itoa(a.port), "--advertise", "10.0.2.2:"+strconv.Itoa(a.port),
		"--allow-hosts", guestHostNQN)
	a.cmd.Stdout, a.cmd.Stderr = lf, lf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.cmd.Wait(); lf.Close(); close(a.exited) }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(os.Interrupt)
		select {
		case <-a.exited:
		case <-time.After(30 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.exited
		}
		if t.Failed() {
			t.Logf("---- basalt nvmf :%d log (tail) ----\n%s", a.port, tailFile(a.log, 60))
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(a.port), time.Second)
		if err == nil {
			c.Close()
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("basalt nvmf does not listen on %d after 60 s:\n%s", a.port, tailFile(a.log, 100))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill ends the process as a crash would.
func (a *accessNode) kill() {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.exited
}

// guestPath is one path of a namespace as the guest's kernel sees it.
type guestPath struct {
	path     string // nvme0c1n1
	port     int    // trsvcid of its controller
	state    string // ana_state
	ctrlLive bool   // the controller's state is live
	subsys   string // subsystem NQN
	nsid     int
}

// guestPaths reads /sys/class/nvme/*/nvme*c*n*/ana_state with each
// controller's address and state.
const guestPathsScript = `for f in /sys/class/nvme/nvme*/nvme*c*n*/ana_state; do
	[ -e "$f" ] || continue
	p=$(dirname $f); c=$(dirname $p)
	echo "$(basename $p) $(cat $f) $(cat $c/state) $(cat $c/subsysnqn) $(cat $p/nsid) $(cat $c/address)"
done`

var trsvcidRE = regexp.MustCompile(`trsvcid=(\d+)`)

func parseGuestPaths(out string) []guestPath {
	var ps []guestPath
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		p := guestPath{path: f[0], state: f[1], ctrlLive: f[2] == "live", subsys: f[3]}
		p.nsid, _ = strconv.Atoi(f[4])
		if m := trsvcidRE.FindStringSubmatch(l); m != nil {
			p.port, _ = strconv.Atoi(m[1])
		}
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].path < ps[j].path })
	return ps
}

// countStates counts the states of the live paths of subsystem sub.
func countStates(ps []guestPath, sub string) map[string]int {
	n := map[string]int{}
	for _, p := range ps {
		if p.ctrlLive && p.subsys == sub {
			n[p.state]++
		}
	}
	return n
}

// of returns the paths of one subsystem.
func of(ps []guestPath, sub string) []guestPath {
	var out []guestPath
	for _, p := range ps {
		if p.subsys == sub {
			out = append(out, p)
		}
	}
	return out
}

// anaTable renders the MDS's view (basalt nvmf ls) of one subsystem.
func anaTable(l *api.ListANAResponse, sub string) (table string, optimized uint64) {
	addr := map[uint64]string{}
	var b strings.Builder
	for _, n := range l.Nodes {
		addr[n.Id] = n.Addr
	}
	for _, a := range l.Assignments {
		if a.Subsystem != sub {
			continue
		}
		optimized = a.Optimized
		fmt.Fprintf(&b, "  nsid %d: optimized %d (%s), non-optimized", a.Nsid, a.Optimized, addr[a.Optimized])
		for _, n := range a.NonOptimized {
			fmt.Fprintf(&b, " %d (%s)", n, addr[n])
		}
		b.WriteString("\n")
	}
	return b.String(), optimized
}

// TestKernelNVMeANA: three `basalt nvmf --multipath` access nodes over the
// playground's cluster; the guest's kernel discovers the volume's subsystem
// on all three (one discovery record each), connects to every one
// (nvme connect-all) and sees one optimized and two non-optimized paths,
// as the MDS assigned them. fio writes with verify on the multipath
// namespace; the access node of the optimized path is killed while it runs:
// fio sees no error, the MDS makes a surviving path optimized, the kernel
// uses it, and the verify passes. The failover pause (the longest write
// completion latency fio saw) is logged, not asserted. Before basalt, the
// same boot reads the kernel's picture of its own target, nvmet, set up the
// same way (kernel_nvmet_test.go), and basalt's picture must agree with it;
// after the groups, the volume is connected again with header and data
// digests and a chunkserver is killed under fio with verify.
func TestKernelNVMeANA(t *testing.T) {
	begin := time.Now()
	bin := testcluster.Binary(t)
	h := testhost.Start(t, testhost.Config{
		Tools: []string{"nvme", "fio", bin},
		// nvmet, nvmet-tcp and null_blk: the reference target (nvmetReference).
		Modules: []string{"nvme-tcp", "crc32c_generic", "nvmet", "nvmet-tcp", "null_blk"},
	})
	p := startPlayground(t, "1GiB")
	nodes := []*accessNode{startAccessNode(t, p.st.MDS, p.st.TLSDir), startAccessNode(t, p.st.MDS, p.st.TLSDir), startAccessNode(t, p.st.MDS, p.st.TLSDir)}
	byPort := map[int]*accessNode{}
	var captures []*nvmftshark.Capture // each node's traffic, for tshark
	for _, a := range nodes {
		byPort[a.port] = a
		captures = append(captures, nvmftshark.Start(t, fmt.Sprintf("127.0.0.1:%d", a.port)))
	}
	nqn := nvmfVolumeNQN + p.st.Volume
	logs := func() string {
		var b strings.Builder
		for _, a := range nodes {
			fmt.Fprintf(&b, "---- access node :%d ----\n%s\n", a.port, tailFile(a.log, 30))
		}
		return b.String()
	}
	guest := guestRunner(t, h, logs)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, _ = h.Run(ctx, "nvme disconnect-all")
	})
	mc, err := mdsclient.Dial([]string{p.st.MDS}, adminTLS(t, p.st.TLSDir))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	listANA := func() *api.ListANAResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := mc.ListANA(ctx, &api.ListANARequest{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// poll runs fn until it returns true, for up to d.
	poll := func(d time.Duration, what string, fn func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			ok, last := fn()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s; last:\n%s\n%s", what, d, last, logs())
			}
			time.Sleep(time.Second)
		}
	}

	// The reference first: the guest kernel's own target, three ports.
	ref := nvmetReference(t, guest)

	// Discovery: one record per access node (once every node's first
	// heartbeat reached the MDS).
	disc := fmt.Sprintf("-t tcp -a 10.0.2.2 -s %d -q %s", nodes[0].port, guestHostNQN)
	poll(3*time.Minute, "three discovery records", func() (bool, string) {
		out := guest(2*time.Minute, "nvme discover "+disc)
		n := 0
		for _, a := range nodes {
			if strings.Contains(out, fmt.Sprintf("trsvcid: %d", a.port)) {
				n++
			}
		}
		return n == 3 && strings.Count(out, nqn) == 3, out
	})
	connected := time.Now()
	// The CSI node plugin's multipath attach (csi.StageDevice, what
	// NodeStageVolume does with --nvmf-discovery): discover the volume's
	// paths, connect to each, find the multipath head in sysfs.
	stage := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := h.Run(ctx, fmt.Sprintf("%s csi stage-device %s --method nvmf --discovery 10.0.2.2:%d --hostnqn %s --state /tmp/stage.json 2>&1",
			bin, p.st.Volume, nodes[0].port, guestHostNQN))
		if err != nil {
			t.Fatalf("guest: csi stage-device: %v\n%s\n%s", err, tail(out, 20), logs())
		}
		return strings.TrimSpace(out)
	}
	staged := stage()

	// The kernel's paths: three, one optimized and two non-optimized, the
	// optimized one the MDS's.
	var paths []guestPath
	var table string
	poll(4*time.Minute, "one optimized and two non-optimized paths", func() (bool, string) {
		paths = of(parseGuestPaths(guest(time.Minute, guestPathsScript)), nqn)
		n := countStates(paths, nqn)
		if len(paths) != 3 || n["optimized"] != 1 || n["non-optimized"] != 2 {
			return false, fmt.Sprint(paths)
		}
		var opt uint64
		table, opt = anaTable(listANA(), nqn)
		for _, pa := range paths {
			if pa.state == "optimized" && !strings.Contains(table, fmt.Sprintf("optimized %d (10.0.2.2:%d)", opt, pa.port)) {
				return false, fmt.Sprintf("kernel %v, MDS\n%s", paths, table)
			}
		}
		return true, ""
	})
	pathsReady := time.Now()
	// basalt's picture beside nvmet's: the same fields must agree.
	got := readPicture(guest, "basalt", nqn)
	got.disc = parseDiscovery(t, guest(2*time.Minute, "nvme discover -o json "+disc))
	checkPicture(t, got, nqn)
	comparePictures(t, ref, got, nvmetNQN, nqn)
	logf(t, "the kernel's picture of each target:\n%s\n%s", ref, got)
	subsys := guest(time.Minute, "nvme list-subsys")
	logf(t, "nvme list-subsys:\n%s\nMDS assignment:\n%s", subsys, table)
	logf(t, "path states (kernel): %v", paths)
	if strings.Count(subsys, "live") < 3 {
		t.Fatalf("nvme list-subsys shows fewer than three live paths:\n%s", subsys)
	}
	dev := guest(time.Minute, "ls /dev/nvme*n1 | grep -v c | head -1")
	dev = strings.TrimSpace(dev)
	if dev == "" {
		t.Fatalf("no multipath namespace device:\n%s", guest(time.Minute, "ls /dev/nvme*"))
	}
	if dev != staged {
		t.Fatalf("stage-device gave %q, the multipath namespace device is %s", staged, dev)
	}
	var optimized *accessNode
	for _, pa := range paths {
		if pa.state == "optimized" {
			optimized = byPort[pa.port]
		}
	}
	if optimized == nil {
		t.Fatalf("the optimized path's port is none of the access nodes': %v", paths)
	}

	// fio with verify on the namespace; the optimized node dies under it.
	type fioResult struct {
		out string
		err error
	}
	fioDone := make(chan fioResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		// SIGPIPE ignored: when the killed node's socket is gone, the 6.1
		// kernel's nvme-tcp may send on it in fio's own context (the
		// inline send of queue_rq) and the EPIPE raises SIGPIPE in fio,
		// which killed a job in one run; the kernel recovers the path
		// either way (seen: "failed to send request -32").
		out, err := h.Run(ctx, "trap '' PIPE; fio --name=ana --filename="+dev+" --rw=randwrite --bs=4k --offset=256m --size=128m "+
			"--io_size=24m --ioengine=libaio --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=7 "+
			"--verify_state_save=0 --output-format=json --output=/root/ana.json && cat /root/ana.json")
		fioDone <- fioResult{out, err}
	}()
	// Kill once the optimized node has served writes for a while.
	poll(5*time.Minute, "the optimized access node attaches the volume", func() (bool, string) {
		b, _ := os.ReadFile(optimized.log)
		return strings.Contains(string(b), "volume attached"), ""
	})
	time.Sleep(3 * time.Second)
	killed := time.Now()
	optimized.kill()
	logf(t, "killed the optimized access node :%d at %s into fio", optimized.port, killed.Sub(pathsReady).Round(time.Millisecond))

	// The MDS moves the optimized path to a survivor and the kernel follows.
	var after []guestPath
	poll(4*time.Minute, "a surviving path becomes optimized", func() (bool, string) {
		after = of(parseGuestPaths(guest(time.Minute, guestPathsScript)), nqn)
		n := countStates(after, nqn)
		if n["optimized"] != 1 || n["non-optimized"] != 1 {
			return false, fmt.Sprint(after)
		}
		for _, pa := range after {
			if pa.ctrlLive && pa.state == "optimized" && pa.port == optimized.port {
				return false, fmt.Sprint(after)
			}
		}
		return true, ""
	})
	moved := time.Now()
	tableAfter, _ := anaTable(listANA(), nqn)
	logf(t, "after the kill: kernel paths %v (optimized on a survivor %s after the kill)\nMDS assignment:\n%s",
		after, moved.Sub(killed).Round(time.Millisecond), tableAfter)

	var r fioResult
	select {
	case r = <-fioDone:
	case <-time.After(20 * time.Minute):
		t.Fatalf("fio did not finish within 20 min\n%s", logs())
	}
	if r.err != nil {
		t.Fatalf("fio failed across the failover: %v\n%s", r.err, logs())
	}
	var report struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				IOPS float64 `json:"iops"`
				Clat struct {
					Max float64 `json:"max"`
				} `json:"clat_ns"`
			} `json:"write"`
			Read struct {
				IOPS float64 `json:"iops"`
			} `json:"read"`
		} `json:"jobs"`
	}
	if i := strings.Index(r.out, "{"); i < 0 || json.Unmarshal([]byte(r.out[i:]), &report) != nil || len(report.Jobs) != 1 {
		t.Fatalf("fio's report:\n%s", r.out)
	}
	j := report.Jobs[0]
	if j.Error != 0 {
		t.Fatalf("fio reports error %d", j.Error)
	}
	logf(t, "kernel NVMe/TCP ANA: discover to three paths with one optimized %s; fio randwrite 4 KiB QD16 + crc32c verify "+
		"across the kill: %.0f write IOPS, %.0f verify-read IOPS, no error; failover pause (longest write completion) %s",
		pathsReady.Sub(connected).Round(time.Millisecond), j.Write.IOPS, j.Read.IOPS,
		time.Duration(j.Write.Clat.Max).Round(time.Millisecond))

	// NodeUnstageVolume's detach: every path (the killed node's too) goes,
	// and the subsystem with them.
	guest(3*time.Minute, bin+" csi unstage-device /tmp/stage.json")
	if left := strings.TrimSpace(guest(time.Minute, "nvme list-subsys 2>/dev/null | grep -F "+nqn+"; ls /dev/nvme*n1 2>/dev/null; true")); left != "" {
		t.Fatalf("after unstage-device the guest still has:\n%s", left)
	}
	// Every path's traffic so far (discovery, ANA log pages and their
	// change notices, the IO, the killed node's connections cut) decodes
	// in tshark with no malformed PDU and no error.
	for i, c := range captures {
		if c == nil {
			t.Log("tshark's judge skipped: no capture (tshark or dumpcap missing or not allowed to capture; see above)")
			continue
		}
		c.Check(t, 2, nvmftshark.Want{PDUs: map[int]int{nvmftshark.ICReq: 2, nvmftshark.ICResp: 2,
			nvmftshark.CapsuleCmd: 10, nvmftshark.CapsuleRsp: 10}})
		logf(t, "access node :%d: tshark decoded its traffic", nodes[i].port)
	}

	// A node joins (three live again), and two subsystems of three
	// namespaces each: inherit puts one host's namespaces on one optimized
	// node, balance on three.
	nodes = append(nodes, startAccessNode(t, p.st.MDS, p.st.TLSDir))
	byPort[nodes[3].port] = nodes[3]
	groups := map[string]api.ANAPolicy{
		groupNQNPrefix + "inh": api.ANAPolicy_ANA_POLICY_INHERIT,
		groupNQNPrefix + "bal": api.ANAPolicy_ANA_POLICY_BALANCE,
	}
	for g, policy := range groups {
		var vols []string
		for i := range 3 {
			v := fmt.Sprintf("%s-%d", strings.TrimPrefix(g, groupNQNPrefix), i+1)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, err := mc.CreateVolume(ctx, &api.CreateVolumeRequest{Name: v, Size: 64 << 20})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			vols = append(vols, v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := mc.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{Nqn: g, Policy: policy, Volumes: vols}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	disc = fmt.Sprintf("-t tcp -a 10.0.2.2 -s %d -q %s", nodes[3].port, guestHostNQN)
	poll(3*time.Minute, "each group listed by the three live access nodes", func() (bool, string) {
		out := guest(2*time.Minute, "nvme discover "+disc)
		for g := range groups {
			if strings.Count(out, g) != 3 {
				return false, out
			}
		}
		return true, ""
	})
	guest(3*time.Minute, "nvme connect-all "+disc+" -k 5")
	var all []guestPath
	poll(4*time.Minute, "three paths per group namespace, one optimized", func() (bool, string) {
		all = parseGuestPaths(guest(time.Minute, guestPathsScript))
		for g := range groups {
			ps := of(all, g)
			if len(ps) != 9 {
				return false, fmt.Sprint(all)
			}
			for nsid := 1; nsid <= 3; nsid++ {
				n := map[string]int{}
				for _, pa := range ps {
					if pa.nsid == nsid && pa.ctrlLive {
						n[pa.state]++
					}
				}
				if n["optimized"] != 1 || n["non-optimized"] != 2 {
					return false, fmt.Sprint(ps)
				}
			}
		}
		return true, ""
	})
	l := listANA()
	for g, policy := range groups {
		opt := map[int]bool{}
		for _, pa := range of(all, g) {
			if pa.state == "optimized" && pa.ctrlLive {
				opt[pa.port] = true
			}
		}
		want := 1
		if policy == api.ANAPolicy_ANA_POLICY_BALANCE {
			want = 3
		}
		table, _ := anaTable(l, g)
		logf(t, "%s (%s): kernel paths %v\nMDS assignment:\n%s", g, policyText(policy), of(all, g), table)
		if len(opt) != want {
			t.Errorf("%s (%s): the three namespaces are optimized on %d access nodes, want %d", g, policyText(policy), len(opt), want)
		}
	}

	// The inherit group grows under the connected host: each access node's
	// controller of the group sends a Namespace Attribute Changed notice,
	// the kernel rescans ("rescanning namespaces") and the fourth
	// namespace gets three live paths, one optimized.
	inh := groupNQNPrefix + "inh"
	rescans := func() string {
		return strings.TrimSpace(guest(time.Minute, "dmesg | grep -c 'rescanning namespaces' || true"))
	}
	rescansBefore := rescans()
	{
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := mc.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "inh-4", Size: 64 << 20})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		_, err = mc.SetNVMfSubsystem(ctx, &api.SetNVMfSubsystemRequest{Subsystem: &api.NVMfSubsystem{Nqn: inh, Policy: groups[inh],
			Volumes: []string{"inh-1", "inh-2", "inh-3", "inh-4"}}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	grew := time.Now()
	poll(4*time.Minute, "the grown group's fourth namespace on three live paths, one optimized", func() (bool, string) {
		ps := of(parseGuestPaths(guest(time.Minute, guestPathsScript)), inh)
		n := map[string]int{}
		for _, pa := range ps {
			if pa.nsid == 4 && pa.ctrlLive {
				n[pa.state]++
			}
		}
		return n["optimized"] == 1 && n["non-optimized"] == 2, fmt.Sprint(ps)
	})
	logf(t, "group grown under the host: the fourth namespace's paths ready in the guest %s after the edit", time.Since(grew).Round(time.Millisecond))
	if after := rescans(); after == rescansBefore {
		t.Errorf("the guest's kernel logged no namespace rescan after the group grew (%s rescans before and after)", rescansBefore)
	} else {
		logf(t, "the guest's kernel logged 'rescanning namespaces' %s times before the edit, %s after", rescansBefore, after)
	}

	// The volume again through every live access node, now with header and
	// data digests (nvme connect-all; the groups' controllers stay, the
	// volume's, connected without digests by the connect-all above, go
	// first), and the chunkserver that leads the most copysets killed under
	// fio with verify: the paths stay, fio sees no error.
	digested := func(a *accessNode) int { // the volume's I/O queues connected with both digests
		b, _ := os.ReadFile(a.log)
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "I/O queue connected") && strings.Contains(l, "subnqn="+nqn+" ") &&
				strings.Contains(l, "hdgst=true ddgst=true") {
				n++
			}
		}
		return n
	}
	before := map[*accessNode]int{}
	for _, a := range nodes {
		before[a] = digested(a)
	}
	guest(3*time.Minute, fmt.Sprintf(`nvme disconnect -n %s >/dev/null
		for i in $(seq 120); do grep -qs %s /sys/class/nvme/*/subsysnqn || exit 0; sleep 1; done; exit 1`, nqn, nqn))
	guest(3*time.Minute, "nvme connect-all "+disc+" -k 5 --hdr-digest --data-digest")
	var dpaths []guestPath
	poll(4*time.Minute, "three paths to the volume again, one optimized", func() (bool, string) {
		dpaths = of(parseGuestPaths(guest(time.Minute, guestPathsScript)), nqn)
		n := countStates(dpaths, nqn)
		return n["optimized"] == 1 && n["non-optimized"] == 2, fmt.Sprint(dpaths)
	})
	noSQFlow := 0 // queues connect-all connected with SQ flow control disabled (discovery TREQ bit 2)
	for _, a := range nodes {
		b, _ := os.ReadFile(a.log)
		noSQFlow += strings.Count(string(b), "sqflow=false")
		if a == optimized {
			continue // killed above
		}
		if digested(a) == before[a] {
			t.Fatalf("access node :%d: no I/O queue of %s connected with header and data digests\n%s", a.port, nqn, logs())
		}
	}
	dev = strings.TrimSpace(guest(time.Minute, fmt.Sprintf(`for s in /sys/class/nvme-subsystem/nvme-subsys*; do
		[ "$(cat $s/subsysnqn)" = %s ] && ls $s | grep -E '^nvme[0-9]+n1$'; done; true`, nqn)))
	if dev == "" {
		t.Fatalf("no multipath device of %s", nqn)
	}
	dev = "/dev/" + dev
	writes := func() int { // writes the volume's paths completed so far
		out := guest(time.Minute, fmt.Sprintf(`for c in /sys/class/nvme/nvme*; do
			[ "$(cat $c/subsysnqn)" = %s ] || continue; for p in $c/nvme*c*n1; do cat $p/stat; done; done`, nqn))
		n := 0
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) > 4 {
				w, _ := strconv.Atoi(f[4])
				n += w
			}
		}
		return n
	}
	w0 := writes()
	fioStart := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		out, err := h.Run(ctx, "fio --name=cs --filename="+dev+" --rw=randwrite --bs=4k --offset=512m --size=128m "+
			"--io_size=24m --ioengine=libaio --direct=1 --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=9 "+
			"--verify_state_save=0 --output-format=json --output=/root/cs.json && cat /root/cs.json")
		fioDone <- fioResult{out, err}
	}()
	waitWrites := func(n int, what string) time.Duration {
		start, from := time.Now(), writes()
		for writes()-from < n {
			select {
			case r := <-fioDone:
				t.Fatalf("fio ended %s: %v\n%s\n%s", what, r.err, r.out, logs())
			case <-time.After(500 * time.Millisecond):
			}
		}
		return time.Since(start)
	}
	waitWrites(1500, "before the chunkserver was killed")
	victim := p.busiestLeader()
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill chunkserver %d: %v", victim.Index, err)
	}
	csKilled := time.Now()
	next100 := waitWrites(100, "after the chunkserver was killed")
	select {
	case r = <-fioDone:
	case <-time.After(20 * time.Minute):
		t.Fatalf("fio did not finish within 20 min\n%s", logs())
	}
	if r.err != nil {
		t.Fatalf("fio failed across the chunkserver's kill: %v\n%s\n%s", r.err, r.out, logs())
	}
	report.Jobs = nil
	if i := strings.Index(r.out, "{"); i < 0 || json.Unmarshal([]byte(r.out[i:]), &report) != nil || len(report.Jobs) != 1 {
		t.Fatalf("fio's report:\n%s", r.out)
	}
	if j = report.Jobs[0]; j.Error != 0 {
		t.Fatalf("fio reports error %d", j.Error)
	}
	dpaths = of(parseGuestPaths(guest(time.Minute, guestPathsScript)), nqn)
	logf(t, "chunkserver %d (pid %d, the busiest leader) killed %s into fio on %s (digests on; %d writes through its paths in all): "+
		"the next 100 writes took %s; fio randwrite 4 KiB QD16 + crc32c verify: %.0f write IOPS, %.0f verify-read IOPS, "+
		"no error; pause (longest write completion) %s; paths after: %v",
		victim.Index, victim.PID, csKilled.Sub(fioStart).Round(time.Millisecond), dev, writes()-w0,
		next100.Round(time.Millisecond), j.Write.IOPS, j.Read.IOPS, time.Duration(j.Write.Clat.Max).Round(time.Millisecond), dpaths)
	logf(t, "I/O queues connected with SQ flow control disabled: %d; whole test %s", noSQFlow, time.Since(begin).Round(time.Millisecond))
}

const groupNQNPrefix = "nqn.2024-11.io.basalt:group:"

func policyText(p api.ANAPolicy) string {
	if p == api.ANAPolicy_ANA_POLICY_BALANCE {
		return "balance"
	}
	return "inherit"
}
