package testhost

import (
	"context"
	"errors"
	"testing"
	"time"
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
	// A boot under TCG takes about two minutes on a quiet 2-core machine and
	// much longer on a loaded one (a 100 MiB initramfs with fio and nvme-cli
	// alone takes 20 s to unpack): wait generously.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	h, err := Boot(ctx, cfg)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
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
