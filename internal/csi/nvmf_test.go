package csi

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nvmeNamespaceDevice reads the kernel's sysfs layout: with native multipath
// the subsystem lists the head nvmeXn1 (the per-path nvmeXcYn1 has no device
// node); without it the namespace hangs under the controller.
func TestNVMeNamespaceDevice(t *testing.T) {
	root := t.TempDir()
	mk := func(p string, nqn string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		if nqn != "" {
			if err := os.WriteFile(filepath.Join(root, p, "subsysnqn"), []byte(nqn+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	const a, b = "nqn.2024-11.io.basalt:volume:a", "nqn.2024-11.io.basalt:volume:b"
	mk("nvme-subsys0", a)
	mk("nvme-subsys0/nvme0/nvme0c0n1", "")
	mk("nvme-subsys0/nvme0n1", "")
	mk("nvme-subsys1", b)
	mk("nvme-subsys1/nvme1/nvme1n1", "")
	if got := nvmeNamespaceDevice(root, a); got != "nvme0n1" {
		t.Errorf("multipath head: %q, want nvme0n1", got)
	}
	if got := nvmeNamespaceDevice(root, b); got != "nvme1n1" {
		t.Errorf("no multipath: %q, want nvme1n1", got)
	}
	if got := nvmeNamespaceDevice(root, "nqn.other"); got != "" {
		t.Errorf("unknown subsystem: %q", got)
	}
	if nvmeSubsystemGone(root, a) || !nvmeSubsystemGone(root, "nqn.other") {
		t.Error("nvmeSubsystemGone is wrong")
	}
}

// discoveryPaths reads nvme-cli's `nvme discover` text: every record of the
// volume's subsystem, whatever the other records.
func TestDiscoveryPaths(t *testing.T) {
	const out = `
Discovery Log Number of Records 4, Generation counter 7
=====Discovery Log Entry 0======
trtype:  tcp
adrfam:  ipv4
subtype: nvme subsystem
treq:    not specified
portid:  1
trsvcid: 4420
subnqn:  nqn.2024-11.io.basalt:volume:a
traddr:  10.0.0.1
eflags:  none
sectype: none
=====Discovery Log Entry 1======
trtype:  tcp
subtype: nvme subsystem
trsvcid: 4420
subnqn:  nqn.2024-11.io.basalt:volume:ab
traddr:  10.0.0.1
=====Discovery Log Entry 2======
trtype:  tcp
subtype: nvme subsystem
trsvcid: 4421
subnqn:  nqn.2024-11.io.basalt:volume:a
traddr:  10.0.0.2
=====Discovery Log Entry 3======
trtype:  tcp
subtype: nvme subsystem
trsvcid: 4420
subnqn:  nqn.2024-11.io.basalt:volume:a
traddr:  fd00::3
`
	got := discoveryPaths(out, "nqn.2024-11.io.basalt:volume:a")
	want := []string{"10.0.0.1:4420", "10.0.0.2:4421", "[fd00::3]:4420"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("paths %v, want %v", got, want)
	}
	if got := discoveryPaths(out, "nqn.other"); len(got) != 0 {
		t.Fatalf("paths of an unknown subsystem: %v", got)
	}
}

// The host NQN a node plugin registers: the configured one, else
// /etc/nvme/hostnqn's when it holds one, else none.
func TestNodeHostNQN(t *testing.T) {
	dir := t.TempDir()
	const nqn = "nqn.2014-08.org.nvmexpress:uuid:12345678-1234-1234-1234-123456789abc"
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	if err := os.WriteFile(good, []byte(nqn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("not an nqn\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	for _, tc := range []struct{ configured, file, want string }{
		{"nqn.2026-12.io.test:x", good, "nqn.2026-12.io.test:x"},
		{"", good, nqn},
		{"", bad, ""},
		{"", filepath.Join(dir, "missing"), ""},
	} {
		if got := nodeHostNQN(tc.configured, tc.file, quiet); got != tc.want {
			t.Errorf("nodeHostNQN(%q, %s) = %q, want %q", tc.configured, tc.file, got, tc.want)
		}
	}
}
