package layering

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/basalt-storage/basalt/"

// rule says which of basalt's own packages one package (or every package under a
// prefix ending in "/...") may import in its non-test files. A package without a
// rule fails the test: a new package must say where it sits in the picture.
type rule struct {
	pkg   string
	may   []string
	why   string
	extra func(p pkgInfo) []string // further checks; returns violations
}

// Leaves that any layer may use: helpers with no basalt dependency of their own
// beyond each other.
var leaves = []string{"internal/race", "internal/sockio", "internal/bufpool", "internal/latency", "internal/debughttp", "internal/fsdir", "internal/identity", "internal/capability"}

func withLeaves(may ...string) []string { return append(may, leaves...) }

// The picture (docs/architecture.md): front ends → client → chunkserver →
// raftstore → wal/datastore; MDS → placement. Imports point down it, never up.
var rules = []rule{
	{pkg: "cmd/...", may: []string{"..."}, why: "the binary wires everything"},
	{pkg: "internal/race", why: "a build-tag constant"},
	{pkg: "internal/sockio", may: []string{"internal/race"}, why: "raw socket system calls"},
	{pkg: "internal/bufpool", may: []string{"internal/race"}, why: "size-class buffers"},
	{pkg: "internal/latency", why: "the one bucket scale of every stage histogram"},
	{pkg: "internal/faultpoint", why: "named fault points for tests: a spec, counters and actions; cmd/basalt wires them into the chunkserver's knobs"},
	{pkg: "internal/debughttp", why: "the /metrics and pprof listener"},
	{pkg: "internal/fsdir", why: "durable directory entries (fsync the directory)"},
	{pkg: "internal/identity", why: "the cluster CA, certificates and mutually verified TLS configs every plane uses"},
	{pkg: "internal/capability", why: "the signed session capability: the MDS signs, chunkservers verify"},
	{pkg: "internal/placement", why: "pure placement and routing math: no I/O, easy to simulate",
		extra: pureStd},
	{pkg: "pkg/api", why: "the wire API: generated code, statuses, frame format"},
	{pkg: "internal/reservation", may: withLeaves("pkg/api"),
		why: "persistent reservations (SPC-4): the pure model the MDS and the front ends share, its Store interface, an in-memory store and a cache; no I/O of its own"},
	{pkg: "pkg/mdsclient", may: []string{"pkg/api"}, why: "the MDS's gRPC client"},
	{pkg: "internal/wal", may: withLeaves(), why: "the shared log knows nothing of Raft groups' users"},
	{pkg: "internal/datastore", may: withLeaves(), why: "chunk files know nothing of Raft"},
	{pkg: "internal/transport", may: withLeaves("pkg/api"), why: "framed connections"},
	{pkg: "internal/raftstore", may: withLeaves("internal/wal", "pkg/api"), why: "Raft groups over the WAL"},
	{pkg: "internal/raftstore/...", may: withLeaves("internal/wal", "internal/raftstore", "pkg/api"), why: "the raft host's own parts"},
	{pkg: "internal/raftnet", may: withLeaves("internal/raftstore", "internal/transport", "pkg/api"), why: "the Raft peer transport"},
	{pkg: "internal/scrub", may: withLeaves("internal/placement", "internal/raftstore", "internal/transport", "pkg/api"), why: "replica comparison over the data plane"},
	{pkg: "internal/chunkserver", may: withLeaves("internal/datastore", "internal/placement", "internal/raftnet",
		"internal/raftstore", "internal/scrub", "internal/transport", "internal/wal", "pkg/api", "pkg/mdsclient"),
		why: "the chunkserver process: never the MDS, the client or a front end"},
	{pkg: "internal/mds", may: withLeaves("internal/placement", "internal/reservation", "pkg/api"), why: "metadata service: never the data plane"},
	{pkg: "pkg/client", may: withLeaves("internal/placement", "internal/transport", "pkg/api", "pkg/mdsclient"),
		why: "the client library: the data plane's wire, never a server's internals"},
	{pkg: "internal/frontend", may: withLeaves("pkg/api"), why: "the protocol-neutral access layer (pkg/api: the one Op enum)"},
	{pkg: "internal/frontend/volumes", may: withLeaves("internal/frontend", "pkg/client", "pkg/api", "pkg/mdsclient"),
		why: "the one adapter from exports to the client library; knows no protocol"},
	{pkg: "internal/frontend/access", may: withLeaves("internal/frontend", "internal/frontend/...", "internal/reservation", "pkg/client", "pkg/api", "pkg/mdsclient"),
		why: "the one builder of front ends: protocols over the volumes adapter"},
	{pkg: "internal/frontend/iscsi", may: withLeaves("internal/frontend", "internal/frontend/iscsi/scsi", "internal/reservation", "pkg/api"),
		why: "the iSCSI transport over its own SCSI command set, both parsers and mappers over the backend interface"},
	{pkg: "internal/frontend/frontendtest", may: withLeaves("internal/frontend", "pkg/api"),
		why: "test support: the in-memory backend the protocol servers' tests share"},
	{pkg: "internal/frontend/...", may: withLeaves("internal/frontend", "internal/reservation", "pkg/api"),
		why: "a protocol server is a parser and a mapper over the backend interface"},
	{pkg: "internal/csi", may: withLeaves("internal/frontend", "internal/frontend/...", "pkg/api", "pkg/client", "pkg/mdsclient"),
		why: "the Kubernetes CSI driver: the MDS API for the controller, a front end for the node's kernel attach"},
	{pkg: "internal/playground", may: withLeaves("internal/frontend", "internal/frontend/...", "internal/mds", "pkg/api", "pkg/client", "pkg/mdsclient"),
		why: "starts processes; the chunkservers are child processes"},
	{pkg: "internal/nvmfhost", may: withLeaves(), why: "an NVMe/TCP host speaks the wire, never the target's internals"},
	{pkg: "internal/bench", may: withLeaves("pkg/api", "pkg/mdsclient", "internal/nvmfhost"), why: "drives fio, qemu-img, the NVMe/TCP host and processes"},
	{pkg: "internal/testcluster", may: withLeaves("internal/scrub", "internal/transport", "internal/testutil", "pkg/api", "pkg/client", "pkg/mdsclient"),
		why: "test support: real processes"},
	{pkg: "internal/testhost", may: withLeaves("internal/testhost/wire"), why: "test support: a QEMU guest"},
	{pkg: "internal/testhost/...", may: withLeaves("internal/testhost/wire"), why: "the guest's agent and its channel's framing"},
	{pkg: "internal/testutil", may: withLeaves(), why: "test support"},
	{pkg: "internal/linearize", why: "test support: histories checked for linearizability (porcupine)"},
	{pkg: "internal/lazyfs", why: "test support: a FUSE file system that forgets what was not fsynced"},
	{pkg: "internal/nvmftshark", why: "test support: tshark's dissector judges captured NVMe/TCP traffic"},
	{pkg: "tests/...", may: []string{"..."}, why: "tests use anything"},
	{pkg: "deploy", may: []string{"internal/csi", "internal/testcluster"}, why: "Kubernetes manifests and the Helm chart; their test checks them against the driver"},
}

// testSupport: these packages and those under them support tests; production code
// never imports them.
var testSupport = []string{"internal/testcluster", "internal/testhost", "internal/testutil", "internal/linearize", "internal/lazyfs",
	"internal/frontend/frontendtest", "internal/nvmftshark"}

func isTestSupport(rel string) bool {
	for _, t := range testSupport {
		if rel == t || strings.HasPrefix(rel, t+"/") {
			return true
		}
	}
	return false
}

type pkgInfo struct {
	ImportPath string
	Imports    []string
	Name       string
}

func TestImportsFollowThePicture(t *testing.T) {
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(p.ImportPath, module)
		r, ok := ruleFor(rel)
		if !ok {
			t.Errorf("%s has no layering rule: add it to tests/layering with the packages it may import and why", rel)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if strings.HasPrefix(dep, "cmd/") {
				t.Errorf("%s imports %s: nothing imports cmd/", rel, dep)
			}
			if isTestSupport(dep) && !isTestSupport(rel) && !strings.HasPrefix(rel, "tests/") {
				t.Errorf("%s imports test support %s outside a test", rel, dep)
			}
			if !allowed(r.may, dep) {
				t.Errorf("%s imports %s; %s may import only %v (%s)", rel, dep, rel, r.may, r.why)
			}
		}
		if r.extra != nil {
			for _, v := range r.extra(p) {
				t.Errorf("%s: %s", rel, v)
			}
		}
	}
}

func ruleFor(rel string) (rule, bool) {
	for _, r := range rules { // exact rules first
		if r.pkg == rel {
			return r, true
		}
	}
	for _, r := range rules {
		if prefix, ok := strings.CutSuffix(r.pkg, "/..."); ok && strings.HasPrefix(rel, prefix+"/") {
			return r, true
		}
	}
	return rule{}, false
}

func allowed(may []string, dep string) bool {
	for _, m := range may {
		if m == "..." || m == dep {
			return true
		}
		if prefix, ok := strings.CutSuffix(m, "/..."); ok && strings.HasPrefix(dep, prefix+"/") {
			return true
		}
	}
	return false
}

// pureStd allows only computation from the standard library: no files, sockets,
// clocks or processes, so placement can be simulated exactly.
func pureStd(p pkgInfo) []string {
	ok := []string{"cmp", "errors", "fmt", "maps", "math", "math/bits", "slices", "sort", "strconv", "strings", "encoding/binary"}
	var bad []string
	for _, imp := range p.Imports {
		if strings.HasPrefix(imp, module) || slices.Contains(ok, imp) || path.Dir(imp) == "hash" {
			continue
		}
		bad = append(bad, fmt.Sprintf("imports %s; placement stays pure (allowed: %v and hash/*)", imp, ok))
	}
	return bad
}

func listPackages(t *testing.T) []pkgInfo {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Name", module+"...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkgInfo
	dec := json.NewDecoder(out)
	for {
		var p pkgInfo
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; expected the whole module", len(pkgs))
	}
	return pkgs
}
