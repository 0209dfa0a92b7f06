package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
)

// NVMe/TCP attach. The node plugin's front end also serves NVMe/TCP on a
// loopback port; NodeStageVolume connects the host's kernel to the volume's
// subsystem (nvme connect) and uses the namespace's block device. Unlike
// kernel NBD, the device grows in place: when the volume grows, the target
// sends a Namespace Attribute Changed notice and the kernel rescans
// (internal/frontend/nvmf, resize.go), so a mounted file system can be grown
// online.

// nvmeTCP reports whether this host's kernel can be an NVMe/TCP host: nvme-cli
// is installed and the nvme-tcp module is loaded (or loads now).
func nvmeTCP() bool {
	if _, err := exec.LookPath("nvme"); err != nil {
		return false
	}
	if _, err := os.Stat("/sys/module/nvme_tcp"); err != nil {
		if _, err := exec.Command("modprobe", "nvme-tcp").CombinedOutput(); err != nil {
			return false
		}
	}
	_, err := os.Stat("/dev/nvme-fabrics")
	return err == nil
}

// sysNVMeSubsystems is where the kernel lists NVMe subsystems.
const sysNVMeSubsystems = "/sys/class/nvme-subsystem"

var nsDevice = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

// nvmeNamespaceDevice finds the block device of namespace 1 of the subsystem
// nqn under the sysfs directory root (sysNVMeSubsystems): the multipath head
// nvmeXn1 the subsystem directory lists, or, without native multipath, the
// namespace of its controller. "" when the kernel shows none (yet).
func nvmeNamespaceDevice(root, nqn string) string {
	subs, _ := os.ReadDir(root)
	for _, s := range subs {
		dir := filepath.Join(root, s.Name())
		b, err := os.ReadFile(filepath.Join(dir, "subsysnqn"))
		if err != nil || strings.TrimSpace(string(b)) != nqn {
			continue
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if nsDevice.MatchString(e.Name()) && strings.HasSuffix(e.Name(), "n1") {
				return e.Name()
			}
		}
		// No multipath head: the namespace hangs under the controller.
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "nvme") || nsDevice.MatchString(e.Name()) {
				continue
			}
			cents, _ := os.ReadDir(filepath.Join(dir, e.Name()))
			for _, c := range cents {
				if nsDevice.MatchString(c.Name()) && strings.HasSuffix(c.Name(), "n1") {
					return c.Name()
				}
			}
		}
	}
	return ""
}

// nvmeSubsystemGone: the kernel lists no subsystem nqn any more.
func nvmeSubsystemGone(root, nqn string) bool {
	subs, _ := os.ReadDir(root)
	for _, s := range subs {
		b, err := os.ReadFile(filepath.Join(root, s.Name(), "subsysnqn"))
		if err == nil && strings.TrimSpace(string(b)) == nqn {
			return false
		}
	}
	return true
}

// attachNVMf connects the kernel to the volume's subsystem on the plugin's
// own NVMe/TCP target and waits for the namespace's block device.
func (n *Node) attachNVMf(ctx context.Context, st *stageState) error {
	return attachNVMfAt(ctx, st, n.nvmfAddr, n.hostNQN)
}

// hostNQNFile is where nvme-cli keeps the host's NQN.
const hostNQNFile = "/etc/nvme/hostnqn"

// nodeHostNQN is the host NQN a node plugin registers and connects as: the
// configured one, else nvme-cli's /etc/nvme/hostnqn when it holds one; ""
// (unknown) otherwise. The MDS checks a configured one.
func nodeHostNQN(configured, file string, log *slog.Logger) string {
	if configured != "" {
		return configured
	}
	b, err := os.ReadFile(file)
	if err != nil {
		log.Warn("csi: no host NQN: access nodes cannot tell this node's kernel from another's, so a fenced one could write again after reconnecting; give --hostnqn or write "+file, "err", err)
		return ""
	}
	nqn := strings.TrimSpace(string(b))
	if !strings.HasPrefix(nqn, "nqn.") || len(nqn) > 223 || strings.ContainsAny(nqn, " \t\n") {
		log.Warn("csi: no host NQN in "+file+"; registering none", "content", nqn)
		return ""
	}
	return nqn
}

// attachNVMfAt connects the kernel to the volume's subsystem at the target
// addr (host:port), as hostNQN ("": nvme-cli's default), and waits for the
// namespace's block device.
func attachNVMfAt(ctx context.Context, st *stageState, addr, hostNQN string) error {
	return attachNVMfPaths(ctx, st, []string{addr}, hostNQN)
}

// attachNVMfPaths connects the kernel to the volume's subsystem on every
// path (host:port; several access nodes: native NVMe multipath makes one
// device of them, the MDS says which path is optimized) and waits for the
// namespace's block device. A path that refuses is logged in the error only
// when none connects.
func attachNVMfPaths(ctx context.Context, st *stageState, paths []string, hostNQN string) error {
	st.NQN = nvmf.VolumeNQNPrefix + st.Volume
	if dev := nvmeNamespaceDevice(sysNVMeSubsystems, st.NQN); dev == "" {
		var errs []error
		for _, addr := range paths {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return fmt.Errorf("NVMe/TCP target address %q: %w", addr, err)
			}
			// -l: give up on a lost target after 60 s instead of nvme-cli's 10
			// minutes, so an unstage after the plugin restarted does not hang.
			args := []string{"connect", "-t", "tcp", "-a", host, "-s", port, "-n", st.NQN, "-l", "60"}
			if hostNQN != "" {
				args = append(args, "-q", hostNQN)
			}
			if _, err := run(ctx, "nvme", args...); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == len(paths) {
			_ = detachNVMf(context.Background(), st)
			return errors.Join(errs...)
		}
	}
	st.Method = ProtocolNVMf
	deadline := time.Now().Add(60 * time.Second)
	for {
		if dev := nvmeNamespaceDevice(sysNVMeSubsystems, st.NQN); dev != "" {
			if _, err := os.Stat("/dev/" + dev); err == nil {
				st.Device = "/dev/" + dev
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = detachNVMf(context.Background(), st)
			return fmt.Errorf("connected to %s but no namespace device appeared within 60 s", st.NQN)
		}
		select {
		case <-ctx.Done():
			_ = detachNVMf(context.Background(), st)
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// detachNVMf disconnects every controller of the volume's subsystem and
// waits until the kernel lists it no more.
func detachNVMf(ctx context.Context, st *stageState) error {
	if nvmeSubsystemGone(sysNVMeSubsystems, st.NQN) {
		return nil
	}
	if _, err := run(ctx, "nvme", "disconnect", "-n", st.NQN); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for !nvmeSubsystemGone(sysNVMeSubsystems, st.NQN) {
		if time.Now().After(deadline) {
			return fmt.Errorf("subsystem %s still listed 60 s after nvme disconnect", st.NQN)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// tcpAddr returns the first TCP address of addrs as host:port, or "".
func tcpAddr(addrs []net.Addr) string {
	for _, a := range addrs {
		if t, ok := a.(*net.TCPAddr); ok {
			return net.JoinHostPort(t.IP.String(), strconv.Itoa(t.Port))
		}
	}
	return ""
}

// discoveryPaths parses `nvme discover`'s text output: the host:port of
// every record of subsystem nqn, in the order listed.
func discoveryPaths(out, nqn string) []string {
	var paths []string
	rec := map[string]string{}
	flush := func() {
		if rec["subnqn"] == nqn && rec["traddr"] != "" && rec["trsvcid"] != "" {
			paths = append(paths, net.JoinHostPort(rec["traddr"], rec["trsvcid"]))
		}
		rec = map[string]string{}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "=====Discovery Log Entry") {
			flush()
			continue
		}
		if k, v, ok := strings.Cut(l, ":"); ok {
			rec[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	flush()
	return paths
}

// nvmfPaths asks the discovery controller at addr (host:port; any access
// node of the cluster) for the volume's subsystem's paths: one per live
// access node exporting it.
func nvmfPaths(ctx context.Context, addr, hostNQN, nqn string) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("NVMe/TCP discovery address %q: %w", addr, err)
	}
	args := []string{"discover", "-t", "tcp", "-a", host, "-s", port}
	if hostNQN != "" {
		args = append(args, "-q", hostNQN)
	}
	out, err := run(ctx, "nvme", args...)
	if err != nil {
		return nil, err
	}
	paths := discoveryPaths(out, nqn)
	if len(paths) == 0 {
		return nil, fmt.Errorf("the discovery log at %s lists no path to %s", addr, nqn)
	}
	return paths, nil
}
