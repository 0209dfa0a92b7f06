package testhost

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// One guest with every tool the block front ends' tests use: it boots, runs
// commands, reports a failing command's status and output, and powers off.
func TestBootRunShutdown(t *testing.T) {
	h := Start(t, Config{
		Tools:   []string{"nbd-client", "mkfs.ext4", "fio", "nvme", "iscsiadm", "iscsid", "multipath"},
		Modules: []string{"nbd", "ext4", "nvme-tcp", "iscsi_tcp", "dm-multipath"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(script string) string {
		t.Helper()
		out, err := h.Run(ctx, script)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got, want := strings.TrimSpace(run("uname -r")), h.Stats().Kernel; got != want {
		t.Errorf("uname -r = %q, want %q", got, want)
	}
	t.Log(run("cat /proc/modules | cut -d' ' -f1 | sort | tr '\\n' ' '"))
	t.Log(run("nbd-client --version 2>&1 | head -1; nvme version; iscsiadm --version; fio --version; mkfs.ext4 -V 2>&1 | head -1; multipath -h 2>&1 | head -1"))

	_, err := h.Run(ctx, "echo to stdout; echo to stderr >&2; exit 3")
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Status != 3 || exit.Output != "to stdout\nto stderr\n" {
		t.Fatalf("a command that exits 3: err %v, want an ExitError with status 3 and both lines", err)
	}
}
