package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// debianPackage names the Debian package that installs each tool a test
// runs; scripts/install-deps installs them.
var debianPackage = map[string]string{
	"etcd":          "etcd-server",
	"fio":           "fio",
	"fusermount3":   "fuse3",
	"ip":            "iproute2",
	"iscsi-inq":     "libiscsi-bin",
	"iscsi-test-cu": "libiscsi-bin",
	"iptables":      "iptables",
	"losetup":       "mount",
	"mkfs.ext4":     "e2fsprogs",
	"mount":         "mount",
	"nbd-client":    "nbd-client",
	"nbdfuse":       "libnbd-bin",
	"nbdinfo":       "libnbd-bin",
	"nbdkit":        "nbdkit",
	"qemu-img":      "qemu-utils",
	"qemu-io":       "qemu-utils",
	"umount":        "mount",
}

// RequireTool returns the path of the executable name, or skips t when it is
// not installed. The skip is loud: besides t.Skip's message (shown with -v)
// it prints a SKIP line to stderr, which go test always shows, naming the
// tool and the package that has it.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		why := fmt.Sprintf("%s is not installed", name)
		if pkg := debianPackage[name]; pkg != "" {
			why += fmt.Sprintf(" (Debian package %s; scripts/install-deps installs it)", pkg)
		}
		fmt.Fprintf(os.Stderr, "SKIP %s: %s\n", t.Name(), why)
		t.Skip(why)
	}
	return path
}

// RequireTools is RequireTool for each of names.
func RequireTools(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		RequireTool(t, name)
	}
}
