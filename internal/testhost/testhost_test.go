package testhost

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// One guest with every tool the block front ends' tests use: it boots, runs
// commands (one at a time and side by side), reports a failing command's
// status and output, kills a command whose context ends, and powers off.
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
	loaded := run("cut -d' ' -f1 /proc/modules")
	for _, m := range []string{"nbd", "ext4", "nvme_tcp", "iscsi_tcp", "dm_multipath", "virtio_console", "virtio_net"} {
		if !strings.Contains("\n"+loaded, "\n"+m+"\n") {
			t.Errorf("module %s is not loaded; loaded:\n%s", m, loaded)
		}
	}
	for _, tool := range []string{"nbd-client --version", "nvme version", "iscsiadm --version", "fio --version", "mkfs.ext4 -V", "multipath -h"} {
		out, err := h.Run(ctx, tool+" 2>&1")
		var exit *ExitError
		if err != nil && !(errors.As(err, &exit) && exit.Status == 1) { // some print their version and exit 1
			t.Errorf("%s: %v", tool, err)
		}
		t.Logf("%s: %s", tool, strings.SplitN(out, "\n", 2)[0])
	}
	if got := run("ip -4 addr show eth0"); !strings.Contains(got, "10.0.2.15/24") {
		t.Errorf("eth0 has no 10.0.2.15/24:\n%s", got)
	}

	_, err := h.Run(ctx, "echo to stdout; echo to stderr >&2; exit 3")
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Status != 3 || exit.Output != "to stdout\nto stderr\n" {
		t.Fatalf("a command that exits 3: err %v, want an ExitError with status 3 and both lines", err)
	}
	if _, err := h.Run(ctx, "kill -9 $$"); !errors.As(err, &exit) || exit.Status != 128+9 {
		t.Fatalf("a command killed by SIGKILL: err %v, want an ExitError with status 137", err)
	}

	// Side by side: the quick command answers while the slow one still runs.
	slow := make(chan string, 1)
	go func() { slow <- run("sleep 2; echo slow") }()
	if got := run("echo quick"); got != "quick\n" {
		t.Errorf("quick command printed %q", got)
	}
	select {
	case <-slow:
		t.Error("the slow command finished before the quick one")
	default:
	}
	if got := <-slow; got != "slow\n" {
		t.Errorf("slow command printed %q", got)
	}

	// A command whose context ends is killed, with its process group.
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	start := time.Now()
	if _, err := h.Run(short, "sleep 600 & sleep 600; echo not reached"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a command past its deadline: err %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the killed command returned after %s", took)
	}
	if got := run("pidof sleep || true"); strings.TrimSpace(got) != "" {
		t.Errorf("sleep processes %s are left after the kill", strings.TrimSpace(got))
	}

	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	if err := h.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Run(ctx, "true"); err == nil {
		t.Error("Run after Shutdown succeeded")
	}
}
