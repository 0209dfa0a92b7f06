package csi

import (
	"log/slog"
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

// The initiator name a node plugin registers: the configured one, else the
// InitiatorName of open-iscsi's file when it holds one, else none.
func TestNodeInitiatorIQN(t *testing.T) {
	dir := t.TempDir()
	const iqn = "iqn.1993-08.org.debian:01:5f1c0a7e9b2d"
	files := map[string]string{
		"good":    "## DO NOT EDIT OR REMOVE THIS FILE!\n## If you remove this file, the iSCSI daemon will not start.\nInitiatorName=" + iqn + "\n",
		"spaced":  "  InitiatorName=" + iqn + "  \n",
		"bad":     "InitiatorName=host-a\n",
		"empty":   "",
		"comment": "#InitiatorName=" + iqn + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	for _, tc := range []struct{ configured, file, want string }{
		{"iqn.2026-12.io.test:x", "good", "iqn.2026-12.io.test:x"},
		{"", "good", iqn},
		{"", "spaced", iqn},
		{"", "bad", ""},
		{"", "empty", ""},
		{"", "comment", ""},
		{"", "missing", ""},
	} {
		if got := nodeInitiatorIQN(tc.configured, filepath.Join(dir, tc.file), quiet); got != tc.want {
			t.Errorf("nodeInitiatorIQN(%q, %s) = %q, want %q", tc.configured, tc.file, got, tc.want)
		}
	}
}
