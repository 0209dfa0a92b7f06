package e2e

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// The reference for TestKernelNVMeANA: the guest kernel's own NVMe target
// (nvmet, nvmet-tcp, configured through configfs) serving one namespace
// through three ports on the guest's loopback, ANA group 1 optimized on the
// first and non-optimized on the other two, the first port's discovery log
// referring to the other two. The kernel initiator's picture of it — paths,
// their ANA states, the discovery log entries, the controllers' sysfs — is
// what basalt's three access nodes must give the same kernel.

// nvmetNQN is the reference subsystem's NQN.
const nvmetNQN = "nqn.2014-08.org.kernel:nvmet-reference"

// nvmetPorts are the reference's ports (port id i+1 on 127.0.0.1:nvmetPorts[i]).
var nvmetPorts = []int{4420, 4421, 4422}

// nvmetSetup configures nvmet: a null_blk namespace (no data is kept: the
// reference is about paths, not IO) in ANA group 1, three TCP ports with
// group 1's state optimized / non-optimized / non-optimized, and referrals
// on port 1 to ports 2 and 3, so that connect-all from port 1 finds all
// three.
var nvmetSetup = fmt.Sprintf(`set -e
grep -q configfs /proc/mounts || mount -t configfs none /sys/kernel/config
cd /sys/kernel/config/nvmet
S=subsystems/%[1]s
mkdir $S
echo 1 >$S/attr_allow_any_host
mkdir $S/namespaces/1
echo /dev/nullb0 >$S/namespaces/1/device_path
echo 1 >$S/namespaces/1/enable
i=0
for port in %[2]d %[3]d %[4]d; do
	i=$((i+1)); P=ports/$i
	mkdir $P
	echo tcp >$P/addr_trtype; echo ipv4 >$P/addr_adrfam; echo 127.0.0.1 >$P/addr_traddr; echo $port >$P/addr_trsvcid
	[ $i = 1 ] || echo non-optimized >$P/ana_groups/1/ana_state
	if [ $i != 1 ]; then
		R=ports/1/referrals/port$i
		mkdir $R
		echo tcp >$R/addr_trtype; echo ipv4 >$R/addr_adrfam; echo 127.0.0.1 >$R/addr_traddr; echo $port >$R/addr_trsvcid
		echo $i >$R/addr_portid; echo 1 >$R/enable
	fi
done
for i in 1 2 3; do ln -s /sys/kernel/config/nvmet/$S ports/$i/subsystems/%[1]s; done
for i in 1 2 3; do echo "port $i: $(cat ports/$i/addr_trsvcid) ana group 1 $(cat ports/$i/ana_groups/1/ana_state)"; done`,
	nvmetNQN, nvmetPorts[0], nvmetPorts[1], nvmetPorts[2])

// pathAttrsScript prints, for every path of subsystem %s, its ANA state,
// group and NSID and its controller's attributes, one "PATH NAME VALUE" line
// each ("-" for an attribute the kernel does not have).
const pathAttrsScript = `for c in /sys/class/nvme/nvme*; do
	[ "$(cat $c/subsysnqn 2>/dev/null)" = "%s" ] || continue
	for p in $c/nvme*c*n*; do
		[ -e $p/ana_state ] || continue
		for a in ana_state ana_grpid nsid; do v=$(cat $p/$a 2>/dev/null); echo "$(basename $p) $a ${v:--}"; done
		for a in state cntlid cntrltype transport address model serial firmware_rev kato queue_count sqsize; do
			v=$(cat $c/$a 2>/dev/null); echo "$(basename $p) $a ${v:--}"
		done
	done
done`

// picture is what the guest's kernel sees of one target's subsystem.
type picture struct {
	target     string
	listSubsys string
	// paths maps a path's name to its attributes (pathAttrsScript).
	paths map[string]map[string]string
	// disc holds every discovery log record of the target's discovery
	// controllers (nvme discover -o json, one per port asked).
	disc []map[string]any
}

func parsePathAttrs(out string) map[string]map[string]string {
	m := map[string]map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.SplitN(l, " ", 3)
		if len(f) != 3 {
			continue
		}
		if m[f[0]] == nil {
			m[f[0]] = map[string]string{}
		}
		m[f[0]][f[1]] = f[2]
	}
	return m
}

// parseDiscovery returns the records of `nvme discover -o json`.
func parseDiscovery(t *testing.T, out string) []map[string]any {
	t.Helper()
	var log struct {
		Records []map[string]any `json:"records"`
	}
	i := strings.Index(out, "{")
	if i < 0 || json.Unmarshal([]byte(out[i:]), &log) != nil {
		t.Fatalf("nvme discover -o json:\n%s", out)
	}
	return log.Records
}

// livePaths returns the names of the paths whose controller is live.
func (p *picture) livePaths() []string {
	var out []string
	for name, a := range p.paths {
		if a["state"] == "live" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// states returns the live paths' ANA states, sorted.
func (p *picture) states() []string {
	var out []string
	for _, name := range p.livePaths() {
		out = append(out, p.paths[name]["ana_state"])
	}
	sort.Strings(out)
	return out
}

// discoveryNQN is the well-known discovery subsystem's NQN.
const discoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// subsystemRecords returns the discovery records of NVM subsystem sub
// (not referrals, not the discovery subsystem's own entries), each once.
func (p *picture) subsystemRecords(sub string) []map[string]any {
	return p.records(sub, "nvme subsystem")
}

// currentDiscoveryRecords returns the records describing the discovery
// subsystem that returned the log (SUBTYPE 3, TP 8013), each once.
func (p *picture) currentDiscoveryRecords() []map[string]any {
	return p.records(discoveryNQN, "current discovery subsystem")
}

// records returns the discovery records of subsystem sub with subtype (as
// nvme-cli names it), each port's once.
func (p *picture) records(sub, subtype string) []map[string]any {
	seen := map[string]bool{}
	var out []map[string]any
	for _, r := range p.disc {
		if r["subnqn"] != sub || r["subtype"] != subtype {
			continue
		}
		k := fmt.Sprint(r["portid"], r["traddr"], r["trsvcid"])
		if !seen[k] {
			seen[k] = true
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]["trsvcid"]) < fmt.Sprint(out[j]["trsvcid"]) })
	return out
}

// String renders the picture: list-subsys, each path's attributes, every
// discovery record.
func (p *picture) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: nvme list-subsys:\n%s\n", p.target, strings.TrimSpace(p.listSubsys))
	var names []string
	for n := range p.paths {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a := p.paths[n]
		fmt.Fprintf(&b, "  %s: ana_state=%s ana_grpid=%s nsid=%s state=%s cntlid=%s cntrltype=%s transport=%s kato=%s queue_count=%s sqsize=%s model=%q serial=%q fw=%q %s\n",
			n, a["ana_state"], a["ana_grpid"], a["nsid"], a["state"], a["cntlid"], a["cntrltype"], a["transport"],
			a["kato"], a["queue_count"], a["sqsize"], a["model"], a["serial"], a["firmware_rev"], a["address"])
	}
	for _, r := range p.disc {
		fmt.Fprintf(&b, "  discovery record: subtype=%v trtype=%v adrfam=%v treq=%q portid=%v traddr=%v trsvcid=%v subnqn=%v eflags=%v sectype=%v\n",
			r["subtype"], r["trtype"], r["adrfam"], r["treq"], r["portid"], r["traddr"], r["trsvcid"], r["subnqn"], r["eflags"], r["sectype"])
	}
	return b.String()
}

// readPicture reads the guest's picture of subsystem sub at target: the
// paths' sysfs and list-subsys (discovery records are the caller's).
func readPicture(guest func(time.Duration, string) string, target, sub string) *picture {
	return &picture{
		target:     target,
		listSubsys: guest(time.Minute, "nvme list-subsys"),
		paths:      parsePathAttrs(guest(time.Minute, fmt.Sprintf(pathAttrsScript, sub))),
	}
}

// checkPicture fails the test unless p is the picture a three-port ANA
// target must give of subsystem sub: three live paths, one optimized and
// two non-optimized, each in an ANA group, on I/O controllers over TCP;
// the discovery logs have one NVM subsystem record per port (TCP, IPv4,
// distinct port ids) naming sub at the address of a live path, and one
// record of the current discovery subsystem per port, also at a live
// path's address (the discovery controller listens beside the I/O ones).
func checkPicture(t *testing.T, p *picture, sub string) {
	t.Helper()
	live := p.livePaths()
	if len(live) != 3 || strings.Join(p.states(), ",") != "non-optimized,non-optimized,optimized" {
		t.Errorf("%s: live paths %v in states %v, want three: optimized, non-optimized, non-optimized\n%s", p.target, live, p.states(), p)
	}
	if n := strings.Count(p.listSubsys, " live"); n < 3 {
		t.Errorf("%s: nvme list-subsys shows %d live paths, want 3:\n%s", p.target, n, p.listSubsys)
	}
	addrs := map[string]bool{}
	for _, name := range live {
		a := p.paths[name]
		if g := a["ana_grpid"]; g == "-" || g == "0" {
			t.Errorf("%s: path %s has no ANA group (ana_grpid %s)", p.target, name, g)
		}
		if a["cntrltype"] != "io" || a["transport"] != "tcp" || a["nsid"] != "1" {
			t.Errorf("%s: path %s: cntrltype %s transport %s nsid %s, want an I/O controller over TCP, NSID 1", p.target, name, a["cntrltype"], a["transport"], a["nsid"])
		}
		addrs[strings.Join(strings.Split(a["address"], ",")[:2], ",")] = true // traddr=A,trsvcid=P
	}
	for _, kind := range []struct {
		name string
		recs []map[string]any
	}{{sub, p.subsystemRecords(sub)}, {"the current discovery subsystem", p.currentDiscoveryRecords()}} {
		if len(kind.recs) != 3 {
			t.Errorf("%s: %d discovery records of %s, want one per port (3)\n%s", p.target, len(kind.recs), kind.name, p)
		}
		ports := map[any]bool{}
		for _, r := range kind.recs {
			if r["trtype"] != "tcp" || r["adrfam"] != "ipv4" {
				t.Errorf("%s: discovery record of %s: trtype %v adrfam %v, want tcp ipv4", p.target, kind.name, r["trtype"], r["adrfam"])
			}
			if ports[r["portid"]] {
				t.Errorf("%s: port id %v in two discovery records of %s", p.target, r["portid"], kind.name)
			}
			ports[r["portid"]] = true
			if a := fmt.Sprintf("traddr=%v,trsvcid=%v", r["traddr"], r["trsvcid"]); !addrs[a] {
				t.Errorf("%s: discovery record of %s at %s, where no live path is (paths at %v)", p.target, kind.name, a, addrs)
			}
		}
	}
}

// comparePictures fails the test where basalt's picture differs from the
// reference's in a field both must agree on; the rest (model, serial,
// firmware, queue counts, port ids' values) is theirs to choose.
func comparePictures(t *testing.T, ref, got *picture, refSub, gotSub string) {
	t.Helper()
	if a, b := strings.Join(ref.states(), ","), strings.Join(got.states(), ","); a != b {
		t.Errorf("ANA states: %s %s, %s %s", ref.target, a, got.target, b)
	}
	field := func(recs []map[string]any, k string) string {
		vs := map[string]bool{}
		for _, r := range recs {
			vs[fmt.Sprint(r[k])] = true
		}
		var out []string
		for v := range vs {
			out = append(out, v)
		}
		sort.Strings(out)
		return strings.Join(out, "|")
	}
	rr, gr := ref.subsystemRecords(refSub), got.subsystemRecords(gotSub)
	for _, k := range []string{"trtype", "adrfam", "subtype", "treq", "eflags", "sectype"} {
		if a, b := field(rr, k), field(gr, k); a != b {
			t.Errorf("discovery records' %s: %s %q, %s %q", k, ref.target, a, got.target, b)
		}
	}
	// The current discovery subsystem's records agree but for EFLAGS:
	// every basalt access node gives the same log (DUPRETINFO, which also
	// keeps nvme connect-all from connecting to them) and keeps persistent
	// discovery connections with change notices (EPCSD); nvmet's ports give
	// each its own log and nvmet 6.1 sets neither.
	rc, gc := ref.currentDiscoveryRecords(), got.currentDiscoveryRecords()
	for _, k := range []string{"trtype", "adrfam", "subtype", "treq", "sectype"} {
		if a, b := field(rc, k), field(gc, k); a != b {
			t.Errorf("current discovery subsystem records' %s: %s %q, %s %q", k, ref.target, a, got.target, b)
		}
	}
	if e, want := field(gc, "eflags"), "explicit discovery connections, duplicate discovery information"; e != want {
		t.Errorf("current discovery subsystem records' eflags: %s %q, want %q", got.target, e, want)
	}
	attr := func(p *picture, k string) string {
		vs := map[string]bool{}
		for _, name := range p.livePaths() {
			vs[p.paths[name][k]] = true
		}
		var out []string
		for v := range vs {
			out = append(out, v)
		}
		sort.Strings(out)
		return strings.Join(out, "|")
	}
	for _, k := range []string{"ana_grpid", "nsid", "cntrltype", "transport"} {
		if a, b := attr(ref, k), attr(got, k); a != b {
			t.Errorf("paths' %s: %s %q, %s %q", k, ref.target, a, got.target, b)
		}
	}
}

// nvmetReference configures nvmet in the guest, connects to it with
// connect-all through port 1 (the referrals bring ports 2 and 3), reads its
// picture, disconnects and returns it.
func nvmetReference(t *testing.T, guest func(time.Duration, string) string) *picture {
	t.Helper()
	begin := time.Now()
	logf(t, "nvmet reference:\n%s", guest(2*time.Minute, nvmetSetup))
	disc := func(port int) string {
		return fmt.Sprintf("-t tcp -a 127.0.0.1 -s %d -q %s", port, guestHostNQN)
	}
	var recs []map[string]any
	for _, port := range nvmetPorts {
		recs = append(recs, parseDiscovery(t, guest(2*time.Minute, "nvme discover -o json "+disc(port)))...)
	}
	guest(3*time.Minute, "nvme connect-all -k 5 "+disc(nvmetPorts[0]))
	var p *picture
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p = readPicture(guest, "nvmet", nvmetNQN)
		if len(p.livePaths()) == 3 && strings.Join(p.states(), ",") == "non-optimized,non-optimized,optimized" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nvmet: not three live paths, optimized and non-optimized, within 3 min:\n%s", p)
		}
		time.Sleep(time.Second)
	}
	p.disc = recs
	checkPicture(t, p, nvmetNQN)
	// Gone before basalt's paths come: the test reads /dev/nvme*n1.
	guest(3*time.Minute, fmt.Sprintf(`nvme disconnect -n %s >/dev/null
		for i in $(seq 120); do
			if ! grep -qs %s /sys/class/nvme/*/subsysnqn && ! ls /dev/nvme*n* >/dev/null 2>&1; then exit 0; fi
			sleep 1
		done
		echo "nvmet's controllers still there"; ls /dev/nvme*; exit 1`, nvmetNQN, nvmetNQN))
	logf(t, "nvmet reference read in %s", time.Since(begin).Round(time.Millisecond))
	return p
}
