package testcluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/basalt-storage/basalt/internal/testutil"
)

// Net is a private network of network namespaces for one test: a hub namespace
// holding a bridge, and one namespace per node ("ctl" for the test itself,
// "mds1", "cs1", ...), each joined to the bridge by a veth pair and given an
// address in 10.231.0.0/24. Nothing is added to the namespace the test was
// started in: every interface and address lives in a namespace Net created, and
// deleting the namespaces removes it all.
type Net struct {
	Prefix string            `json:"prefix"` // namespace names are Prefix-node
	Addrs  map[string]string `json:"addrs"`  // node -> IPv4 address
}

const netEnv = "BASALT_TESTCLUSTER_NET"

// NS is the name of node's namespace.
func (n *Net) NS(node string) string { return n.Prefix + "-" + node }

// IP is node's address.
func (n *Net) IP(node string) string {
	ip, ok := n.Addrs[node]
	if !ok {
		panic("testcluster: no node " + node + " in the test network")
	}
	return ip
}

// NetNodes returns the node names a cluster of mds MDS and cs chunkservers needs.
func NetNodes(mds, cs int) []string {
	var out []string
	for i := 1; i <= mds; i++ {
		out = append(out, fmt.Sprintf("mds%d", i))
	}
	for i := 1; i <= cs; i++ {
		out = append(out, fmt.Sprintf("cs%d", i))
	}
	return out
}

// InNetns runs the calling test inside the "ctl" namespace of a new Net with
// the given nodes. In the test process started by `go test` it creates the
// network, runs this same test (by name) in a child test process inside "ctl",
// relays its output, fails if the child fails, removes the namespaces, and
// returns nil: the caller must then return. In that child it returns the Net.
// It skips the test, saying why, when the machine cannot make namespaces
// (not root, no ip or iptables).
func InNetns(t *testing.T, nodes ...string) *Net {
	t.Helper()
	if s := os.Getenv(netEnv); s != "" {
		var n Net
		if err := json.Unmarshal([]byte(s), &n); err != nil {
			t.Fatalf("%s: %v", netEnv, err)
		}
		return &n
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces and iptables")
	}
	testutil.RequireTools(t, "ip", "iptables")
	removeStaleNets()
	n := &Net{Prefix: fmt.Sprintf("bt%d", os.Getpid()), Addrs: map[string]string{}}
	t.Cleanup(n.destroy)
	hub := n.NS("hub")
	if err := run("ip", "netns", "add", hub); err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	must := func(args ...string) {
		t.Helper()
		if err := run(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
	must("ip", "-n", hub, "link", "set", "br0", "up")
	for i, node := range append([]string{"ctl"}, nodes...) {
		ns, veth := n.NS(node), "v-"+node
		ip := fmt.Sprintf("10.231.0.%d", i+1)
		must("ip", "netns", "add", ns)
		must("ip", "-n", hub, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("ip", "-n", hub, "link", "set", veth, "master", "br0", "up")
		must("ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		must("ip", "-n", ns, "link", "set", "eth0", "up")
		must("ip", "-n", ns, "link", "set", "lo", "up")
		n.Addrs[node] = ip
	}
	desc, _ := json.Marshal(n)

	cmd := exec.Command("ip", "netns", "exec", n.NS("ctl"), os.Args[0],
		"-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v=true", "-test.count=1", "-test.timeout=20m",
		"-test.short="+strconv.FormatBool(testing.Short()))
	cmd.Env = append(os.Environ(), netEnv+"="+string(desc), "BASALT_BIN="+Binary(t))
	// If this process dies (a test timeout panics past every Cleanup), so does
	// the child, and with it its cluster; the next run removes the namespaces.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	skipped := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "--- SKIP") {
			skipped = true
		}
		t.Log("ctl| " + line)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the test failed inside its network namespaces: %v", err)
	}
	if skipped {
		t.Skip("the test skipped inside its network namespaces (see above)")
	}
	return nil
}

// Partition drops every packet between nodes a and b (both ways, in both
// namespaces), as a broken link would: connections hang, nothing is refused.
func (n *Net) Partition(t testing.TB, a, b string) {
	t.Helper()
	for _, p := range [][2]string{{a, b}, {b, a}} {
		ns, peer := n.NS(p[0]), n.IP(p[1])
		for _, rule := range [][]string{{"INPUT", "-s", peer}, {"OUTPUT", "-d", peer}} {
			args := append([]string{"netns", "exec", ns, "iptables", "-w", "-A"}, rule...)
			if err := run(append(append([]string{"ip"}, args...), "-j", "DROP")...); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("network: %s <-/-> %s", a, b)
}

// Heal removes every drop rule of every node.
func (n *Net) Heal(t testing.TB) {
	t.Helper()
	for node := range n.Addrs {
		for _, chain := range []string{"INPUT", "OUTPUT"} {
			if err := run("ip", "netns", "exec", n.NS(node), "iptables", "-w", "-F", chain); err != nil {
				t.Error(err)
			}
		}
	}
	t.Logf("network: healed")
}

func (n *Net) destroy() {
	for node := range n.Addrs {
		_ = run("ip", "netns", "del", n.NS(node))
	}
	_ = run("ip", "netns", "del", n.NS("hub"))
}

var staleNet = regexp.MustCompile(`^bt(\d+)-\S+`)

// removeStaleNets deletes the namespaces of earlier test processes that died
// before they could (named bt<pid>-..., with no process <pid> left).
func removeStaleNets() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		m := staleNet.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		_ = run("ip", "netns", "del", strings.Fields(m[0])[0])
	}
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
