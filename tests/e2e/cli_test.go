package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testcluster"
)

// The operator's CLI against a real cluster: every command's table and JSON, and
// clear errors that change nothing.
func TestCLI(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Copysets: 6})
	bin := testcluster.Binary(t)
	cli := func(wantOK bool, args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append(args, "--mds", c.MDSAddr, "--tls-dir", c.TLSDir)...).CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("basalt %s: err=%v, want success=%v\n%s", strings.Join(args, " "), err, wantOK, out)
		}
		return string(out)
	}

	out := cli(true, "pool", "ls")
	if !strings.Contains(out, "default") || !strings.Contains(out, "16MiB") && !strings.Contains(out, "4MiB") {
		t.Fatalf("pool ls:\n%s", out)
	}
	out = cli(true, "pool", "create", "fast", "--replicas", "3", "--chunk-size", "8MiB", "--copysets", "3")
	if !strings.Contains(out, "fast") || !strings.Contains(out, "8MiB") {
		t.Fatalf("pool create:\n%s", out)
	}
	cli(false, "pool", "create", "fast") // exists already
	cli(false, "pool", "create", "odd", "--chunk-size", "3MiB")

	cli(true, "volume", "create", "db1", "--size", "10GiB", "--pool", "fast")
	cli(true, "volume", "create", "db2", "--size", "512MiB", "--pool", "default")
	cli(false, "volume", "create", "db1", "--size", "1GiB", "--pool", "fast") // duplicate
	cli(false, "volume", "create", "bad name!", "--size", "1GiB", "--pool", "fast")
	cli(false, "volume", "create", "db3", "--size", "12345", "--pool", "fast") // not 4 KiB aligned
	cli(false, "volume", "create", "db3", "--size", "1GiB", "--pool", "nosuch")

	var vols []struct {
		Name     string `json:"name"`
		Size     uint64 `json:"size"`
		PoolName string `json:"pool_name"`
	}
	if err := json.Unmarshal([]byte(cli(true, "volume", "ls", "-o", "json")), &vols); err != nil {
		t.Fatal(err)
	}
	if len(vols) != 2 || vols[0].Name != "db1" || vols[0].Size != 10<<30 || vols[0].PoolName != "fast" || vols[1].Name != "db2" {
		t.Fatalf("volume ls -o json: %+v", vols)
	}
	cli(true, "volume", "resize", "db1", "--size", "20GiB")
	cli(false, "volume", "resize", "db1", "--size", "1GiB") // shrinking is refused
	if out := cli(true, "volume", "info", "db1"); !strings.Contains(out, "20GiB") {
		t.Fatalf("volume info after grow:\n%s", out)
	}
	// A volume's NVMe allow-list: a bad NQN is refused and changes nothing;
	// the list shows in info (every host) and ls (a count).
	const host = "nqn.2014-08.org.nvmexpress:uuid:0ba5a17e-0000-4000-8000-0000000000c1"
	for _, bad := range []string{"host1", "nqn.2026-13.io.basalt:h", "nqn.2026-12.io.basalt.h", "nqn.2026-12.io.basalt:" + strings.Repeat("h", 202)} {
		if out := cli(false, "volume", "allow-host", "db2", bad); !strings.Contains(out, "host NQN") {
			t.Errorf("allow-host %q: the error does not say what is wrong:\n%s", bad, out)
		}
	}
	if out := cli(true, "volume", "info", "db2"); !strings.Contains(out, "NVMe hosts allowed: any") {
		t.Fatalf("volume info after refused allow-hosts:\n%s", out)
	}
	cli(false, "volume", "allow-host", "nosuch", host)
	cli(true, "volume", "allow-host", "db2", host)
	if out := cli(true, "volume", "allow-host", "db2", host); !strings.Contains(out, "nothing changed") {
		t.Errorf("allow-host twice:\n%s", out)
	}
	if out := cli(true, "volume", "info", "db2"); !strings.Contains(out, "\n  "+host+"\n") {
		t.Errorf("volume info does not list the host:\n%s", out)
	}
	var listed []struct {
		Name         string   `json:"name"`
		AllowedHosts []string `json:"allowed_hosts"`
	}
	if err := json.Unmarshal([]byte(cli(true, "volume", "ls", "-o", "json")), &listed); err != nil || len(listed) != 2 ||
		len(listed[0].AllowedHosts) != 0 || len(listed[1].AllowedHosts) != 1 || listed[1].AllowedHosts[0] != host {
		t.Errorf("volume ls -o json: %+v %v", listed, err)
	}
	if out := cli(true, "volume", "ls"); !strings.Contains(out, "NVME HOSTS") || !strings.Contains(out, "any") {
		t.Errorf("volume ls has no NVME HOSTS column:\n%s", out)
	}
	if out := cli(true, "volume", "deny-host", "db2", host); !strings.Contains(out, "allows any NVMe host now") {
		t.Errorf("deny-host of the last host:\n%s", out)
	}
	cli(true, "volume", "rm", "db2")
	cli(false, "volume", "rm", "db2")
	cli(false, "volume", "info", "db2")

	c.WaitHealthy(60 * time.Second) // the new pool's copysets elect their leaders
	out = cli(true, "status")
	for _, want := range []string{"HEALTHY", "3 up, 0 down", "0 degraded"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	var st struct {
		Chunkservers []struct {
			Online bool `json:"online"`
		} `json:"chunkservers"`
		LeadersPerChunkserver map[string]uint32 `json:"leaders_per_chunkserver"`
	}
	if err := json.Unmarshal([]byte(cli(true, "status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	leaders := uint32(0)
	for _, n := range st.LeadersPerChunkserver {
		leaders += n
	}
	if len(st.Chunkservers) != 3 || leaders != 9 {
		t.Fatalf("status -o json: %d chunkservers, %d leaders (want 3 and 6+3 copysets)", len(st.Chunkservers), leaders)
	}

	// One chunkserver down: the status says so.
	c.Kill(c.CS[0])
	deadline := time.Now().Add(90 * time.Second)
	for {
		out = cli(true, "status")
		if strings.Contains(out, "2 up, 1 down") && strings.Contains(out, "DEGRADED") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("90 s after a chunkserver died, status still says:\n%s", out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	cli(false, "volume", "ls", "-o", "yaml") // unknown output format
}
