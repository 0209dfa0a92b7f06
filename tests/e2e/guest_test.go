package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testhost"
)

// guestRunner returns a function that runs a script in h's guest within a
// timeout and returns its output; a failure fails the test, with diag's text
// (the servers' logs) when diag is not nil.
func guestRunner(t *testing.T, h *testhost.Host, diag func() string) func(time.Duration, string) string {
	return func(timeout time.Duration, script string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		out, err := h.Run(ctx, script)
		if err != nil {
			if diag != nil {
				t.Fatalf("guest: %v\n%s", err, diag())
			}
			t.Fatalf("guest: %v", err)
		}
		return out
	}
}

// fioReport is what these tests read of fio's JSON output.
type fioReport struct {
	Error int `json:"error"`
	Write struct {
		IOPS float64 `json:"iops"`
	} `json:"write"`
	Read struct {
		IOPS float64 `json:"iops"`
	} `json:"read"`
}

// guestFio runs a fio command line that writes /root/fio.json in the guest
// and returns its one job's report (readFio).
func guestFio(t *testing.T, guest func(time.Duration, string) string, cmd string) fioReport {
	t.Helper()
	guest(10*time.Minute, cmd)
	return readFio(t, guest)
}

// readFio returns the one job of the guest's /root/fio.json; fio's error
// fails the test.
func readFio(t *testing.T, guest func(time.Duration, string) string) fioReport {
	t.Helper()
	var out struct {
		Jobs []fioReport `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(guest(time.Minute, "cat /root/fio.json")), &out); err != nil || len(out.Jobs) != 1 {
		t.Fatalf("fio's report: %v (%d jobs)", err, len(out.Jobs))
	}
	if out.Jobs[0].Error != 0 {
		t.Fatalf("fio reports error %d", out.Jobs[0].Error)
	}
	return out.Jobs[0]
}
