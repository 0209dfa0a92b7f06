package iscsi

// libiscsi's conformance suite, iscsi-test-cu (Debian libiscsi-bin), judges
// the target: every test of its ALL family, suite by suite, against a memory
// volume. testdata/libiscsi-expected.txt is a ratchet: it lists each test
// that does not pass yet, with its result (fail, skip or hang) and why. The
// test fails when a listed test's result changes (fix the list: it passes
// now) or an unlisted test does not pass.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// suiteTimeout bounds one suite's run: some tests wait for a target that
// rightly ignores a bad PDU (their own timeouts are a few seconds); a suite
// that hangs past this is killed and its unfinished tests count as "hang".
const suiteTimeout = 3 * time.Minute

type cuResult struct{ status, why string }

// validStatuses reports a ratchet status: fail, skip or hang, or several
// joined by "|" (either, as timing decides; "pass" may be one of them).
func validStatuses(st string) bool {
	for _, s := range strings.Split(st, "|") {
		if s != "fail" && s != "skip" && s != "hang" && !(s == "pass" && strings.Contains(st, "|")) {
			return false
		}
	}
	return true
}

// readExpected parses testdata/libiscsi-expected.txt: "STATUS TEST REASON...".
func readExpected(t *testing.T) map[string]cuResult {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "libiscsi-expected.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]cuResult{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 || !validStatuses(fields[0]) {
			t.Fatalf("libiscsi-expected.txt: bad line %q (want STATUS TEST REASON)", line)
		}
		want[fields[1]] = cuResult{fields[0], strings.Join(fields[2:], " ")}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return want
}

var (
	cuTestLine = regexp.MustCompile(`(?m)^  Test: (\S+) \.\.\.`)
	// cuVerdict is a test's verdict: the first line-final "passed" or
	// "FAILED" (the teardown's PERSISTENT RESERVE IN probe may print after it,
	// on the same line: a skip, or after a reset its unit attention).
	cuVerdict = regexp.MustCompile(`(?m)(passed|FAILED)\s*(\[SKIPPED\] PERSISTENT RESERVE IN is not implemented\.|\[FAILED\] PRIN command: .*)?\s*$`)
)

// parseSuite returns the result of each test in one suite's normal-mode
// stdout: the text between "Test: NAME ..." and its verdict decides.
func parseSuite(suite string, out []byte) map[string]string {
	res := map[string]string{}
	locs := cuTestLine.FindAllSubmatchIndex(out, -1)
	for i, l := range locs {
		name := suite + "." + string(out[l[2]:l[3]])
		end := len(out)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		body := out[l[1]:end]
		// The verdict: the first line-final "passed" or "FAILED".
		v := cuVerdict.FindIndex(body)
		switch {
		case v == nil:
			res[name] = "hang"
		case bytes.HasPrefix(body[v[0]:], []byte("FAILED")):
			res[name] = "fail"
		case bytes.Contains(body[:v[0]], []byte("[SKIPPED]")):
			res[name] = "skip"
		default:
			res[name] = "pass"
		}
	}
	return res
}

func TestLibiscsiConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("runs libiscsi's whole conformance suite (about a minute); not in -short")
	}
	testutil.RequireTool(t, "iscsi-test-cu")
	want := readExpected(t)
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(256 << 20)}, Config{})
	url := "iscsi://" + addr + "/" + TargetName(testCluster, "disk") + "/0"

	list, err := exec.Command("iscsi-test-cu", "-l").Output()
	if err != nil {
		t.Fatalf("iscsi-test-cu -l: %v", err)
	}
	var suites []string
	all := map[string]bool{}
	for _, l := range strings.Fields(string(list)) {
		switch strings.Count(l, ".") {
		case 1:
			if strings.HasPrefix(l, "ALL.") {
				suites = append(suites, l)
			}
		case 2:
			if strings.HasPrefix(l, "ALL.") {
				all[l] = true
			}
		}
	}
	if len(suites) == 0 {
		t.Fatalf("iscsi-test-cu -l listed no suites:\n%s", list)
	}

	got := map[string]string{}
	dir := t.TempDir()
	for _, suite := range suites {
		ctx, cancel := context.WithTimeout(context.Background(), suiteTimeout)
		// The same URL twice: the multipath tests see two paths to one LU.
		cmd := exec.CommandContext(ctx, "iscsi-test-cu", "--dataloss", "--verbose",
			"-i", "iqn.2026-11.io.basalt.test:initiator-1", "-I", "iqn.2026-11.io.basalt.test:initiator-2",
			"-t", suite, url, url)
		cmd.Dir = dir
		cmd.WaitDelay = 5 * time.Second
		out, _ := cmd.Output() // it exits 0 with failed tests; the output says
		cancel()
		res := parseSuite(suite, out)
		for name, r := range res {
			got[name] = r
		}
		for name := range all {
			if strings.HasPrefix(name, suite+".") {
				if _, ok := res[name]; !ok {
					got[name] = "hang" // killed before it started, or never printed
				}
			}
		}
	}

	counts := map[string]int{}
	var problems []string
	names := make([]string, 0, len(got))
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r := got[n]
		counts[r]++
		w, listed := want[n]
		switch {
		case listed && !slices.Contains(strings.Split(w.status, "|"), r):
			problems = append(problems, fmt.Sprintf("%s: %s, but testdata/libiscsi-expected.txt says %s (%s): update the list", n, r, w.status, w.why))
		case !listed && r != "pass":
			problems = append(problems, fmt.Sprintf("%s: %s (not in testdata/libiscsi-expected.txt)", n, r))
		}
	}
	for n := range want {
		if _, ok := got[n]; !ok {
			problems = append(problems, fmt.Sprintf("%s: listed in testdata/libiscsi-expected.txt but not run", n))
		}
	}
	if path := os.Getenv("BASALT_LIBISCSI_RESULTS"); path != "" {
		// For updating the ratchet: every result, one per line.
		var b strings.Builder
		for _, n := range names {
			fmt.Fprintf(&b, "%s %s\n", got[n], n)
		}
		os.WriteFile(path, []byte(b.String()), 0o644)
	}
	t.Logf("iscsi-test-cu ALL: %d tests: %d passed, %d skipped, %d failed, %d hung",
		len(got), counts["pass"], counts["skip"], counts["fail"], counts["hang"])
	if len(problems) > 0 {
		if len(problems) > 50 {
			problems = append(problems[:50], fmt.Sprintf("... and %d more", len(problems)-50))
		}
		t.Errorf("iscsi-test-cu results differ from the ratchet:\n%s", strings.Join(problems, "\n"))
	}
}
