package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/scrub"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/api"
)

func TestCheckTable(t *testing.T) {
	r := &checkResult{
		Pools: []poolCheck{{ID: 1, Name: "default", Copysets: 8, Checked: 7, Chunks: 12, Differences: 1, Unreachable: 1}},
		Differences: []chunkDiff{{
			Difference: scrub.Difference{Pool: 1, Copyset: 3, Volume: 5, Index: 2, Differ: []uint64{2},
				Replicas: []scrub.ReplicaCRC{{Member: 1, CRC32C: 0xabc}, {Member: 2, Zero: true}, {Member: 3, CRC32C: 0xabc}}},
			PoolName: "default", VolumeName: "db", Offset: 8 << 20,
		}},
		Unreachable: []unreachable{{Member: 4, Addr: "10.0.0.4:6800", Copysets: []string{"default/6"}, Err: "connection refused"}},
	}
	var b bytes.Buffer
	if err := printResult(&b, "table", r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"default  8         7        12               1            0          1",
		"default  3        db (5)  2      8388608  2          1=0x00000abc 2=zeros 3=0x00000abc",
		"4       10.0.0.4:6800  default/6  connection refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "all replicas agree") || !errors.Is(r.err(), scrub.ErrReplicasDiffer) {
		t.Errorf("a difference must fail the check: err %v\n%s", r.err(), out)
	}
	r.Differences, r.Pools[0].Differences = nil, 0
	if !errors.Is(r.err(), scrub.ErrIncomplete) {
		t.Errorf("an unchecked copyset must fail the check: %v", r.err())
	}
	r.Pools[0].Checked = 8
	if r.err() != nil {
		t.Errorf("clean: %v", r.err())
	}
}

// TestCheckCluster runs `basalt check` against a real cluster: clean after
// writes, clean while writes go on, then exactly the chunk corrupted on one
// replica's disk. The chunkservers' background scrub runs fast meanwhile and
// must log that chunk, and nothing before the corruption.
func TestCheckCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	c := testcluster.Start(t, testcluster.Options{ChunkserverFlags: []string{
		"--scrub-interval=20ms", "--scrub-pass-interval=300ms", "--scrub-rate=256MiB"}})
	const chunkSize = 4 << 20 // testcluster's default
	vol := c.CreateVolume("checked", 16*chunkSize)
	v := c.Open("checked", false)
	// The first 4 KiB of every chunk, distinct content each.
	for i := range 16 {
		buf := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		if _, err := v.WriteAt(buf, int64(i)*chunkSize); err != nil {
			t.Fatalf("write chunk %d: %v", i, err)
		}
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}

	res, code, out := runCheckBinary(t, c)
	if code != 0 || len(res.Differences) != 0 || len(res.Pools) != 1 {
		t.Fatalf("clean cluster: exit %d\n%s", code, out)
	}
	if p := res.Pools[0]; p.Chunks != 16 || p.Checked != p.Copysets || p.Copysets != int(c.Pool.CopysetCount) {
		t.Fatalf("clean cluster: %+v, want 16 chunks compared in every copyset", p)
	}

	// A busy volume: replicas apply each write at slightly different moments,
	// which must never be reported as a difference (at worst as unsettled).
	busy := c.Open("checked", false)
	stop, stopped := make(chan struct{}), make(chan error, 4)
	for w := range 4 {
		go func() {
			buf := bytes.Repeat([]byte{0xff}, 4096)
			for i := w; ; i += 4 {
				select {
				case <-stop:
					stopped <- nil
					return
				default:
				}
				buf[0], buf[1] = byte(i), byte(i>>8)
				off := int64(i%16)*chunkSize + int64(i%13)*4096
				if _, err := busy.WriteAt(buf, off); err != nil {
					stopped <- err
					return
				}
			}
		}()
	}
	res, _, out = runCheckBinary(t, c)
	close(stop)
	for range 4 {
		if err := <-stopped; err != nil {
			t.Fatalf("busy writer: %v", err)
		}
	}
	if err := busy.Close(); err != nil {
		t.Fatal(err)
	}
	if len(res.Differences) != 0 || len(res.Unreachable) != 0 {
		t.Fatalf("busy volume reported as differing:\n%s", out)
	}
	rechecked := 0
	for _, r := range res.Copysets {
		if r.Rounds > 1 {
			rechecked++
		}
	}
	t.Logf("busy volume: %d chunks compared, %d copysets re-checked, %d chunks unsettled",
		res.Pools[0].Chunks, rechecked, len(res.Unsettled))

	scrubLogs := func(s string) int {
		n := 0
		for _, p := range c.CS {
			n += c.CountLog(p, s)
		}
		return n
	}
	if n := scrubLogs(`msg="scrub pass done"`); n == 0 {
		t.Errorf("no background scrub pass completed")
	}
	if n := scrubLogs(`msg="replicas differ"`); n != 0 {
		t.Fatalf("background scrub reported %d differences on healthy replicas", n)
	}

	// Corrupt chunk 5 on one member, in a range no write touched (a WAL replay
	// at restart rewrites only what was written).
	const chunk = 5
	copyset := api.CopysetOf(vol.Id, chunk, c.Pool.CopysetCount)
	group := api.GroupID(c.Pool.Id, copyset)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cr, err := c.API.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: c.Pool.Id})
	if err != nil {
		t.Fatal(err)
	}
	var members []uint64
	addrs := map[uint64]string{}
	for _, cs := range cr.Chunkservers {
		addrs[cs.Id] = cs.Addr
	}
	for _, cs := range cr.Copysets {
		if cs.Id == copyset {
			members = cs.Members
		}
	}
	if len(members) != 3 {
		t.Fatalf("copyset %d members %v", copyset, members)
	}
	victim, proc := members[1], (*testcluster.Proc)(nil)
	for _, p := range c.CS {
		b, err := os.ReadFile(filepath.Join(p.DataDir, "id"))
		if err != nil {
			t.Fatal(err)
		}
		if id, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); id == victim {
			proc = p
		}
	}
	if proc == nil {
		t.Fatalf("no process holds chunkserver %d", victim)
	}
	c.Stop(proc)
	path := filepath.Join(proc.DataDir, "data", "copysets", fmt.Sprintf("%016x", group), "chunks",
		fmt.Sprintf("%016x_%016x", vol.Id, uint64(chunk)))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("chunk file of chunkserver %d: %v", victim, err)
	}
	if _, err := f.WriteAt([]byte("bit rot"), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c.Start(proc)
	c.Eventually(60*time.Second, "restarted replica answers", func(ctx context.Context) error {
		_, err := testcluster.ReplicaChecksums(ctx, c.DataSecurity(), addrs[victim], c.Pool.Id, copyset)
		return err
	})
	c.WaitHealthy(60 * time.Second)

	res, code, out = runCheckBinary(t, c)
	if code == 0 {
		t.Fatalf("corrupt replica: exit 0\n%s", out)
	}
	if len(res.Differences) != 1 {
		t.Fatalf("want exactly one difference\n%s", out)
	}
	d := res.Differences[0]
	if d.Volume != vol.Id || d.Index != chunk || d.Copyset != copyset || !slices.Equal(d.Differ, []uint64{victim}) ||
		d.VolumeName != "checked" || len(res.Unsettled) != 0 || len(res.Unreachable) != 0 {
		t.Fatalf("difference %+v, want volume %d chunk %d copyset %d differing on %d\n%s",
			d, vol.Id, chunk, copyset, victim, out)
	}
	want := fmt.Sprintf(`component=scrub pool=%d copyset=%d group=%d volume=%d chunk=%d differ=[%d]`,
		c.Pool.Id, copyset, group, vol.Id, chunk, victim)
	c.Eventually(30*time.Second, "background scrub logs the corrupt chunk", func(context.Context) error {
		if scrubLogs(want) == 0 {
			return fmt.Errorf("no log line %s", want)
		}
		return nil
	})
	// The table names it too.
	cmd := exec.Command(testcluster.Binary(t), "check", "--mds", c.MDSAddr, "--tls-dir", c.TLSDir)
	tbl, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(tbl), "replicas differ:") ||
		!strings.Contains(string(tbl), fmt.Sprintf("checked (%d)  %d ", vol.Id, chunk)) {
		t.Fatalf("table run: %v\n%s", err, tbl)
	}
}

// runCheckBinary runs `basalt check -o json` and returns its result and exit code.
func runCheckBinary(t *testing.T, c *testcluster.Cluster) (*checkResult, int, string) {
	t.Helper()
	cmd := exec.Command(testcluster.Binary(t), "check", "--mds", c.MDSAddr, "--tls-dir", c.TLSDir, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	out := stdout.String() + stderr.String()
	var res checkResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("check output: %v\n%s", err, out)
	}
	return &res, code, out
}
