package testhost

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A boot under TCG takes 6–60 s here, longer on a loaded machine (a 100 MiB
// initramfs with fio and nvme-cli alone takes 20 s to unpack), so a guest not
// up within bootDeadline has hung rather than slowed: rarely (once in some
// hundred boots so far, under load) Debian's kernel stalls early (an RCU stall, the two vCPUs'
// clocks 20 s apart, timer interrupts no longer arriving). That is QEMU's TCG,
// not the code under test, so Start boots a fresh guest once before failing.
const (
	bootDeadline = 3 * time.Minute
	bootAttempts = 2
)

// Start boots a test host for a test and powers it off when the test ends.
// Where this machine lacks QEMU, the kernel or a tool, the test is skipped
// with a message naming what is missing; with -short it is skipped too. When the test failed, the end of the
// guest's console goes to the test log.
func Start(t testing.TB, cfg Config) *Host {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a Linux guest under QEMU; skipped with -short")
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	var h *Host
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), bootDeadline)
		var err error
		h, err = Boot(ctx, cfg)
		cancel()
		if errors.Is(err, ErrUnavailable) {
			t.Skipf("skipped: %v", err)
		}
		if errors.Is(err, context.DeadlineExceeded) && attempt < bootAttempts {
			t.Logf("testhost: boot %d of %d hung, booting a fresh guest: %v", attempt, bootAttempts, err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("guest console (tail):\n%s", h.console.tail(60))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := h.Shutdown(ctx); err != nil {
			t.Errorf("%v", err)
		}
	})
	return h
}
