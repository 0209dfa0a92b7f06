package csi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// stageState is what a NodeStageVolume made, at STATE/volumes/NAME/stage.json.
type stageState struct {
	Volume      string `json:"volume"`
	StagingPath string `json:"staging_path"`
	Device      string `json:"device"`              // /dev/nvmeXnY, /dev/nbdN or /dev/loopN
	Method      string `json:"method"`              // nvmf, nbd, iscsi or nbdfuse
	NQN         string `json:"nqn,omitempty"`       // nvmf: the volume's subsystem
	Portal      string `json:"portal,omitempty"`    // iscsi: the target's portal, host:port
	Target      string `json:"target,omitempty"`    // iscsi: the volume's target name
	NBDIoctl    bool   `json:"nbd_ioctl,omitempty"` // nbd: configured by ioctl (NBD_SET_SIZE works)
	FuseDir     string `json:"fuse_dir,omitempty"`  // nbdfuse's mount point
	FusePID     int    `json:"fuse_pid,omitempty"`
	Block       bool   `json:"block"`
	FsType      string `json:"fs_type,omitempty"`
	ReadOnly    bool   `json:"read_only,omitempty"`
	// Targets are the paths NodePublishVolume bind-mounted the volume on.
	Targets []string `json:"targets,omitempty"`
}

// run runs a command and returns its output; a failure carries the last
// lines of the output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		s := string(out)
		if len(s) > 2000 {
			s = s[len(s)-2000:]
		}
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(s))
	}
	return string(out), nil
}

// kernelNBD: the nbd module is loaded and nbd-client is installed.
func kernelNBD() bool {
	if _, err := os.Stat("/dev/nbd0"); err != nil {
		return false
	}
	_, err := exec.LookPath("nbd-client")
	return err == nil
}

// attachNBD connects a free /dev/nbdN to the export: at the node plugin's
// own front end, or at the NBD server of an access node (Config.NBDTarget).
func (n *Node) attachNBD(ctx context.Context, st *stageState) error {
	if t := n.d.cfg.NBDTarget; t != "" {
		return attachNBDAt(ctx, st, t)
	}
	return attachNBDAt(ctx, st, "unix:"+n.sock)
}

// attachNBDAt connects a free /dev/nbdN to the export at server: host:port
// (an access node's `basalt nbd` listener, which must let plaintext in:
// nbd-client cannot do TLS), or unix:PATH.
func attachNBDAt(ctx context.Context, st *stageState, server string) error {
	var at []string
	if path, ok := strings.CutPrefix(server, "unix:"); ok {
		at = []string{"-unix", path}
	} else {
		host, port, err := net.SplitHostPort(server)
		if err != nil {
			return fmt.Errorf("NBD server %q: want host:port or unix:PATH", server)
		}
		at = []string{host, port}
	}
	for i := 0; ; i++ {
		dev := fmt.Sprintf("/dev/nbd%d", i)
		if _, err := os.Stat(dev); err != nil {
			return fmt.Errorf("no free NBD device (tried /dev/nbd0..%d)", i-1)
		}
		if _, err := os.Stat(fmt.Sprintf("/sys/block/nbd%d/pid", i)); err == nil {
			continue // in use
		}
		// -nonetlink: an ioctl-configured device takes NBD_SET_SIZE while
		// connected (a netlink one refuses every ioctl), which is how
		// NodeExpandVolume tells the kernel the volume grew.
		args := append(slices.Clone(at), dev, "-N", st.Volume, "-b", "4096", "-t", "60", "-nonetlink")
		if st.ReadOnly {
			args = append(args, "-readonly")
		}
		if _, err := run(ctx, "nbd-client", args...); err != nil {
			if _, e := os.Stat(fmt.Sprintf("/sys/block/nbd%d/pid", i)); e == nil {
				continue // raced with another attach
			}
			return err
		}
		st.Device, st.Method, st.NBDIoctl = dev, ProtocolNBD, true
		return waitNBDStarted(ctx, i)
	}
}

// waitNBDStarted waits until /dev/nbdN is serving. With -nonetlink,
// nbd-client returns when its daemon forks, before that daemon's NBD_DO_IT
// starts the device: until then the kernel shows it as 0 bytes, so blkid
// found no file system on an ext4 volume, and the blank check that followed
// (the device up by then) refused to format it (CI rehearsal, 2026-12-07).
// Started: the kernel lists the daemon's pid and the size.
func waitNBDStarted(ctx context.Context, i int) error {
	dev := fmt.Sprintf("/sys/block/nbd%d", i)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		_, err := os.Stat(dev + "/pid")
		size, _ := os.ReadFile(dev + "/size")
		if err == nil && strings.TrimSpace(string(size)) != "0" && len(size) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("/dev/nbd%d not started by nbd-client (no pid or size in %s): %w", i, dev, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// attachNbdfuse serves the export as a file with nbdfuse and puts a loop
// device over it.
func (n *Node) attachNbdfuse(ctx context.Context, st *stageState, dir string) error {
	st.FuseDir = filepath.Join(dir, "fuse")
	if err := os.MkdirAll(st.FuseDir, 0o755); err != nil {
		return err
	}
	uri := "nbd+unix:///" + st.Volume + "?socket=" + n.sock
	args := []string{st.FuseDir, uri}
	if st.ReadOnly {
		args = append([]string{"--readonly"}, args...)
	}
	cmd := exec.Command("nbdfuse", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true} // a Ctrl-C to the plugin is not one to nbdfuse
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("nbdfuse: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.fuse[st.Volume] = fuseProc{cmd: cmd, exited: exited}
	st.FusePID = cmd.Process.Pid
	img := filepath.Join(st.FuseDir, "nbd")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if fi, err := os.Stat(img); err == nil && fi.Size() > 0 {
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("nbdfuse exited: %s", strings.TrimSpace(stderr.String()))
		case <-ctx.Done():
			n.stopFuse(st)
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stopFuse(st)
			return fmt.Errorf("nbdfuse did not serve %s within 60 s", img)
		}
	}
	args = []string{"-f", "--show"}
	if st.ReadOnly {
		args = append(args, "-r")
	}
	out, err := run(ctx, "losetup", append(args, img)...)
	if err != nil {
		n.stopFuse(st)
		return err
	}
	st.Device, st.Method = strings.TrimSpace(out), ProtocolNbdfuse
	return nil
}

// stopFuse unmounts nbdfuse's directory and waits for it to exit.
func (n *Node) stopFuse(st *stageState) {
	if st.FuseDir != "" {
		if isMountPoint(st.FuseDir) {
			if _, err := run(context.Background(), "fusermount3", "-u", st.FuseDir); err != nil {
				n.d.log.Info("fusermount3 -u", "dir", st.FuseDir, "err", err)
			}
		}
	}
	if p, ok := n.fuse[st.Volume]; ok {
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		delete(n.fuse, st.Volume)
	}
	// An nbdfuse an earlier run of the plugin started is not our child: the
	// unmount above made it exit.
}

// detach undoes attach.
func (n *Node) detach(ctx context.Context, st *stageState) error {
	switch st.Method {
	case ProtocolNVMf:
		if err := detachNVMf(ctx, st); err != nil {
			return err
		}
	case ProtocolNBD:
		if _, err := run(ctx, "nbd-client", "-d", st.Device); err != nil {
			return err
		}
	case ProtocolISCSI:
		if err := detachISCSI(ctx, st); err != nil {
			return err
		}
	case ProtocolNbdfuse:
		if st.Device != "" && loopBacked(st.Device) {
			if _, err := run(ctx, "losetup", "-d", st.Device); err != nil {
				return err
			}
			// losetup -d only marks it for autoclear; wait until it let go.
			deadline := time.Now().Add(30 * time.Second)
			for loopBacked(st.Device) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
		}
		n.stopFuse(st)
	}
	if n == nil { // a standalone attach (UnstageDevice): no front end here
		return nil
	}
	// The export's backend closes once its last connection is gone; wait, so
	// that the volume's session is closed when Unstage returns (a
	// DeleteVolume right after must not find it in use).
	deadline := time.Now().Add(60 * time.Second)
	for !n.front.ExportIdle(st.Volume) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the export of %q did not close within 60 s of the detach", st.Volume)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// loopBacked: the loop device still has a backing file.
func loopBacked(dev string) bool {
	_, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	return err == nil
}

// deviceSize is a block device's size in bytes.
func deviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, 2)
}

// hasFS reports the file system type on dev, "" for none.
func hasFS(ctx context.Context, dev string) (string, error) {
	out, err := exec.CommandContext(ctx, "blkid", "-p", "-s", "TYPE", "-o", "value", dev).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", nil // nothing found
	}
	if err != nil {
		return "", fmt.Errorf("blkid %s: %w", dev, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// blank reports whether the first MiB of dev reads as zeroes: a fresh
// volume. mkfs runs only on a blank device, so a read error or a file system
// blkid does not know never gets formatted over.
func blank(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return false, fmt.Errorf("reading %s: %w", dev, err)
	}
	for _, b := range buf[:n] {
		if b != 0 {
			return false, nil
		}
	}
	return true, nil
}

func mkfs(ctx context.Context, fsType, dev string) error {
	var err error
	switch fsType {
	case "ext4":
		// Lazy init and no discard: a fresh volume reads as zeroes already.
		_, err = run(ctx, "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", dev)
	case "xfs":
		_, err = run(ctx, "mkfs.xfs", "-q", "-K", dev)
	default:
		err = fmt.Errorf("cannot make file system %q", fsType)
	}
	return err
}

// ext4Size is the size of the ext4 file system on dev (dumpe2fs -h).
func ext4Size(ctx context.Context, dev string) (int64, error) {
	out, err := run(ctx, "dumpe2fs", "-h", dev)
	if err != nil {
		return 0, err
	}
	var count, size int64
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch strings.TrimSpace(k) {
		case "Block count":
			count = n
		case "Block size":
			size = n
		}
	}
	if count == 0 || size == 0 {
		return 0, fmt.Errorf("dumpe2fs -h %s: no block count or size", dev)
	}
	return count * size, nil
}

// growExt4Offline grows an unmounted ext4 to its device when the volume grew
// since it was made (Kubernetes expands while no pod uses the volume: the
// driver's expansion is OFFLINE). Online growth needs CAP_SYS_RESOURCE.
func growExt4Offline(ctx context.Context, dev string) error {
	fs, err := ext4Size(ctx, dev)
	if err != nil {
		return err
	}
	size, err := deviceSize(dev)
	if err != nil {
		return err
	}
	if size-fs < 4<<20 { // less than a few block groups' worth: nothing to do
		return nil
	}
	out, err := exec.CommandContext(ctx, "e2fsck", "-f", "-p", dev).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) { // 1: errors corrected
		return fmt.Errorf("e2fsck -f -p %s: %v: %s", dev, err, strings.TrimSpace(string(out)))
	}
	_, err = run(ctx, "resize2fs", dev)
	return err
}

// growFS grows the file system mounted at path on dev to the device's size.
func growFS(ctx context.Context, fsType, dev, path string) error {
	switch fsType {
	case "ext4":
		_, err := run(ctx, "resize2fs", dev)
		return err
	case "xfs":
		_, err := run(ctx, "xfs_growfs", path)
		return err
	}
	return fmt.Errorf("cannot grow file system %q", fsType)
}

// isMountPoint: path is the mount point of some mount (per /proc/self/mountinfo).
func isMountPoint(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	path = filepath.Clean(path)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMount(f[4]) == path {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmount unmounts path if something is mounted there.
func unmount(ctx context.Context, path string) error {
	for isMountPoint(path) {
		if err := unix.Unmount(path, 0); err != nil {
			if _, err := run(ctx, "umount", path); err != nil {
				return err
			}
		}
	}
	return nil
}

func readState(path string) (*stageState, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var st stageState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &st, nil
}

// writeState writes atomically: temp file, rename.
func writeState(path string, st *stageState) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
