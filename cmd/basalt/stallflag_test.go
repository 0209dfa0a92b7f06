package main

import (
	"strings"
	"testing"
)

// A --wal-stall-timeout so short that a healthy disk would trip it (or that
// would make the watchdog's ticker panic) is refused before anything starts.
func TestWALStallTimeoutFlag(t *testing.T) {
	for _, v := range []string{"1ns", "50ms"} {
		cmd := chunkserverCommand()
		cmd.SetArgs([]string{"--insecure", "--mds", "127.0.0.1:1", "--data", t.TempDir(), "--wal-stall-timeout", v})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--wal-stall-timeout") {
			t.Errorf("basalt chunkserver --wal-stall-timeout %s: %v, want a --wal-stall-timeout error", v, err)
		}
	}
}
