package csi

import (
	"os"
	"path/filepath"
	"testing"
)

// iscsiSessionDevice reads the kernel's sysfs layout: a session under
// /sys/class/iscsi_session names its target, and its device holds the SCSI
// target and LUN 0's disk (H:C:T:0/block/sdX); a session whose disk has not
// appeared yet is found without a device.
func TestISCSISessionDevice(t *testing.T) {
	root := t.TempDir()
	mk := func(p, target string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target != "" {
			if err := os.WriteFile(filepath.Join(root, p, "targetname"), []byte(target+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	const a, b = "iqn.2026-11.io.basalt:csi:a", "iqn.2026-11.io.basalt:csi:b"
	mk("session1", a)
	mk("session1/device/target2:0:0/2:0:0:1/block/sdc", "") // another LUN
	mk("session1/device/target2:0:0/2:0:0:0/block/sdb", "")
	mk("session2", b)
	mk("session2/device", "")
	if dev, found := iscsiSessionDevice(root, a); dev != "sdb" || !found {
		t.Errorf("LUN 0 of %s: %q %v, want sdb true", a, dev, found)
	}
	if dev, found := iscsiSessionDevice(root, b); dev != "" || !found {
		t.Errorf("a session without its disk yet: %q %v, want \"\" true", dev, found)
	}
	if dev, found := iscsiSessionDevice(root, "iqn.other"); dev != "" || found {
		t.Errorf("no session: %q %v", dev, found)
	}
}
