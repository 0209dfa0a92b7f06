package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// iSCSI attach, for a node whose kernel has neither NVMe/TCP nor NBD: the
// node plugin's front end also serves iSCSI on a loopback portal (one target
// per volume, iqn.2026-11.io.basalt:csi:VOLUME, LUN 0; docs/iscsi.md) and
// NodeStageVolume logs open-iscsi in to the volume's target (iscsiadm, with
// the host's iscsid) and uses LUN 0's SCSI disk.

// iscsiCluster is the cluster part of the node plugin's own target names.
const iscsiCluster = "csi"

// sysISCSISessions is where the kernel lists iSCSI sessions.
const sysISCSISessions = "/sys/class/iscsi_session"

// iscsiKernel reports whether this host can be an iSCSI initiator: iscsiadm
// is installed and the iscsi_tcp module is loaded (or loads now). iscsiadm
// also needs the host's iscsid running; without it the login fails and
// says so.
func iscsiKernel() bool {
	if _, err := exec.LookPath("iscsiadm"); err != nil {
		return false
	}
	if _, err := os.Stat("/sys/module/iscsi_tcp"); err != nil {
		if _, err := exec.Command("modprobe", "iscsi_tcp").CombinedOutput(); err != nil {
			return false
		}
	}
	_, err := os.Stat("/sys/module/iscsi_tcp")
	return err == nil
}

// iscsiSessionDevice finds, under the sysfs directory root
// (sysISCSISessions), the session logged in to target and LUN 0's block
// device in it: found says whether there is a session, dev is "" while its
// disk has not appeared.
func iscsiSessionDevice(root, target string) (dev string, found bool) {
	sessions, _ := os.ReadDir(root)
	for _, s := range sessions {
		dir := filepath.Join(root, s.Name())
		b, err := os.ReadFile(filepath.Join(dir, "targetname"))
		if err != nil || strings.TrimSpace(string(b)) != target {
			continue
		}
		// session → its SCSI target → H:C:T:0 → block/sdX.
		blocks, _ := filepath.Glob(filepath.Join(dir, "device", "target*", "*:0", "block", "*"))
		if len(blocks) > 0 {
			return filepath.Base(blocks[0]), true
		}
		return "", true
	}
	return "", false
}

// initiatorNameFile is where open-iscsi keeps the host's initiator name,
// the one iscsid logs in as.
const initiatorNameFile = "/etc/iscsi/initiatorname.iscsi"

// nodeInitiatorIQN is the iSCSI initiator name a node plugin registers: the
// configured one, else the InitiatorName of open-iscsi's file when it holds
// one; "" (unknown) otherwise. The MDS checks a configured one.
func nodeInitiatorIQN(configured, file string, log *slog.Logger) string {
	if configured != "" {
		return configured
	}
	b, err := os.ReadFile(file)
	if err != nil {
		log.Warn("csi: no iSCSI initiator name: access nodes cannot tell this node's kernel from another's, so a fenced one could write again after logging in again; give --initiator-iqn or mount the host's "+file, "err", err)
		return ""
	}
	for line := range strings.Lines(string(b)) {
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "InitiatorName=")
		if !ok {
			continue
		}
		p := strings.ToLower(name[:min(len(name), 4)])
		if (p != "iqn." && p != "eui." && p != "naa.") || len(name) <= 4 || len(name) > 223 || strings.ContainsAny(name, " \t") {
			break
		}
		return name
	}
	log.Warn("csi: no iSCSI initiator name in "+file+"; registering none", "content", strings.TrimSpace(string(b)))
	return ""
}

// iscsiNode is iscsiadm's node selector for the stage's target and portal.
func iscsiNode(st *stageState) []string {
	return []string{"-m", "node", "-T", st.Target, "-p", st.Portal}
}

// attachISCSIAt logs in to the volume's target at portal (host:port) and
// waits for LUN 0's disk.
func attachISCSIAt(ctx context.Context, st *stageState, portal, target string) error {
	st.Portal, st.Target = portal, target
	if _, found := iscsiSessionDevice(sysISCSISessions, target); !found {
		if _, err := run(ctx, "iscsiadm", append(iscsiNode(st), "-o", "new")...); err != nil {
			return err
		}
		// A lost portal fails IO after 60 s (open-iscsi's default 120), and
		// the node record does not log in again at the next boot.
		for _, kv := range [][2]string{{"node.session.timeo.replacement_timeout", "60"}, {"node.startup", "manual"}} {
			if _, err := run(ctx, "iscsiadm", append(iscsiNode(st), "-o", "update", "-n", kv[0], "-v", kv[1])...); err != nil {
				_ = detachISCSI(context.Background(), st)
				return err
			}
		}
		if _, err := run(ctx, "iscsiadm", append(iscsiNode(st), "--login")...); err != nil {
			_ = detachISCSI(context.Background(), st)
			return err
		}
	}
	st.Method = ProtocolISCSI
	deadline := time.Now().Add(60 * time.Second)
	for {
		if dev, _ := iscsiSessionDevice(sysISCSISessions, target); dev != "" {
			if _, err := os.Stat("/dev/" + dev); err == nil {
				st.Device = "/dev/" + dev
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = detachISCSI(context.Background(), st)
			return fmt.Errorf("logged in to %s but no disk appeared within 60 s", target)
		}
		select {
		case <-ctx.Done():
			_ = detachISCSI(context.Background(), st)
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// detachISCSI logs out of the stage's target, deletes its node record and
// waits until the kernel lists the session no more.
func detachISCSI(ctx context.Context, st *stageState) error {
	if _, found := iscsiSessionDevice(sysISCSISessions, st.Target); found {
		if _, err := run(ctx, "iscsiadm", append(iscsiNode(st), "--logout")...); err != nil {
			return err
		}
	}
	// Exit status 21: no such record (deleted already, or never made).
	if _, err := run(ctx, "iscsiadm", append(iscsiNode(st), "-o", "delete")...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 21 {
			return err
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, found := iscsiSessionDevice(sysISCSISessions, st.Target); !found {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("session to %s still listed 60 s after the logout", st.Target)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// rescanSCSI asks the kernel to read the SCSI disk's capacity again.
func rescanSCSI(dev string) error {
	return os.WriteFile(filepath.Join("/sys/block", filepath.Base(dev), "device", "rescan"), []byte("1"), 0)
}
