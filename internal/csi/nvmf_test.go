package csi

import (
	"os"
	"path/filepath"
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
