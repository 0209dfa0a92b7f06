package bench

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Machine describes where the benchmark ran; it heads the report.
type Machine struct {
	Date     time.Time
	Host     string
	Kernel   string
	NProc    int
	MemBytes uint64
	Disk     string // df line of the bench directory's file system
	Device   string // block device, model and rotational flag, as /sys tells
	Fio      string
	NBDKit   string
	Basalt   string // VCS revision the binary was built from, if known
	Baseline string // VCS revision of the baseline binary (Config.Baseline), if any
	// LoadStart and LoadEnd are /proc/loadavg's 1-minute figure when the run began
	// and ended: other work on the machine skews every figure.
	LoadStart, LoadEnd string
}

// LoadAvg returns the 1-minute load average, or "".
func LoadAvg() string {
	f := strings.Fields(readString("/proc/loadavg"))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// DescribeMachine gathers the header facts; what it cannot learn it leaves empty.
func DescribeMachine(ctx context.Context, dir string) Machine {
	m := Machine{Date: time.Now().UTC(), NProc: runtime.NumCPU()}
	m.Host, _ = os.Hostname()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemBytes = statusKB(b, "MemTotal:") << 10
	}
	if out := commandLine(ctx, "df", "-h", "--output=source,fstype,size,used,avail,target", dir); out != "" {
		lines := strings.Split(out, "\n")
		m.Disk = strings.Join(strings.Fields(lines[len(lines)-1]), " ")
	}
	m.Device = blockDevice(dir)
	m.Fio = commandLine(ctx, "fio", "--version")
	if v := commandLine(ctx, "nbdkit", "--version"); v != "" {
		m.NBDKit = strings.Split(v, "\n")[0]
	}
	if m.Basalt = buildRevision(); m.Basalt == "" {
		m.Basalt = checkoutRevision(ctx)
	}
	m.LoadStart = LoadAvg()
	return m
}

// commandLine runs a short command and returns its trimmed output, or "".
func commandLine(ctx context.Context, name string, args ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// blockDevice names the disk that holds dir: "vda (virtio_blk, rotational)" or
// "nvme0n1 (Samsung SSD 980, non-rotational)".
func blockDevice(dir string) string {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return ""
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	path, err := filepath.EvalSymlinks(sys)
	if err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(path, "partition")); err == nil {
		path = filepath.Dir(path)
	}
	var facts []string
	model := strings.TrimSpace(readString(filepath.Join(path, "device", "model")))
	if model != "" {
		facts = append(facts, model)
	} else if drv, err := filepath.EvalSymlinks(filepath.Join(path, "device", "driver")); err == nil {
		facts = append(facts, filepath.Base(drv))
	}
	switch strings.TrimSpace(readString(filepath.Join(path, "queue", "rotational"))) {
	case "0":
		facts = append(facts, "non-rotational")
	case "1":
		facts = append(facts, "rotational per the kernel")
	}
	name := filepath.Base(path)
	if len(facts) == 0 {
		return name
	}
	return name + " (" + strings.Join(facts, ", ") + ")"
}

func readString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

func buildRevision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return revision(bi)
}

// revisionOf names the VCS revision another Go binary was built from, or its path
// when the binary does not record one.
func revisionOf(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return path
	}
	if rev := revision(bi); rev != "" {
		return rev + " (" + path + ")"
	}
	return path
}

func revision(bi *debug.BuildInfo) string {
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = " (with uncommitted changes)"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return ""
	}
	return rev + modified
}

// checkoutRevision names the commit of the git checkout in the working directory,
// for binaries built with -buildvcs=false (bench/run builds from that checkout).
func checkoutRevision(ctx context.Context) string {
	rev := commandLine(ctx, "git", "rev-parse", "--short=12", "HEAD")
	if rev == "" {
		return ""
	}
	rev += " (checkout)"
	if commandLine(ctx, "git", "status", "--porcelain", "--untracked-files=no") != "" {
		rev += " with uncommitted changes in the tree"
	}
	return rev
}
