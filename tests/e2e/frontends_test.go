package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testutil"
)

// Two NBD front ends on one cluster: the playground's own, with fio writing (and
// verifying) through it, and the one inside chunkserver 1, asked about the same
// volume by nbdinfo several times meanwhile. nbdinfo only looks (NBD_OPT_INFO, then
// NBD_OPT_GO and one read): it must never take the writer role, so fio never sees
// its writer fenced.
func TestNbdinfoOnSecondFrontEndLeavesWriterAlone(t *testing.T) {
	testutil.RequireTools(t, "fio", "nbdinfo")
	p := startPlayground(t, "1GiB")
	sock := p.st.Chunkservers[0].NBDSocket
	if sock == "" {
		t.Skip("skipped: chunkserver 1 has no NBD socket (its path would be too long for a Unix socket)")
	}
	second := "nbd+unix:///" + p.st.Volume + "?socket=" + sock

	type result struct {
		out string
		err error
	}
	fioDone := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "fio", "--ioengine=nbd", "--uri="+p.unixURI(),
			"--output-format=normal", "--verify_state_save=0",
			"--name=writer", "--rw=randwrite", "--bs=4k", "--size=256m", "--iodepth=8",
			"--time_based", "--runtime=15", "--verify=crc32c", "--verify_backlog=256",
			"--randseed=11").CombinedOutput()
		fioDone <- result{string(out), err}
	}()

	time.Sleep(2 * time.Second) // fio is connected and writing
	for i := range 5 {
		out := run(t, time.Minute, "nbdinfo", second)
		if !strings.Contains(out, "export-size: 1073741824") {
			t.Fatalf("nbdinfo #%d through chunkserver 1 does not show the volume's size:\n%s", i+1, out)
		}
		time.Sleep(time.Second)
	}
	var r result
	select {
	case r = <-fioDone:
		if fioOK(r.out, r.err) {
			t.Fatalf("fio ended before the nbdinfo calls were done, so they did not overlap (lengthen its runtime):\n%s", r.out)
		}
	default:
		r = <-fioDone
	}
	if !fioOK(r.out, r.err) {
		t.Fatalf("fio through the playground's front end failed while nbdinfo asked the other one (err %v):\n%s", r.err, r.out)
	}
	logf(t, "fio while nbdinfo ran 5 times on the other front end:\n%s", tail(r.out, 8))
}

// fioOK reports a fio run without IO or verify errors.
func fioOK(out string, err error) bool {
	return err == nil && !strings.Contains(out, "verify: bad") && strings.Contains(out, "err= 0")
}
