package e2e

// NBD over TLS (NBD_OPT_STARTTLS; docs/security.md, "Access plane"), judged
// by real clients against a playground whose TCP listener requires TLS:
// libnbd's nbdinfo, nbdcopy and fio with nbds:// URIs, qemu-img with
// tls-creds-x509; and the attacks a client can make, refused while the
// server keeps serving the others and no data changes.

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// runErr runs a command and returns its combined output and error.
func runErr(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func nbdsURI(p *pg, certDir string) string {
	return "nbds://" + p.st.NBD + "/" + p.st.Volume + "?tls-certificates=" + certDir
}

// qemuNBD is qemu's --object and image options for the volume over TLS
// with the client certificates in dir; size > 0 limits the image (raw
// driver) to its first size bytes.
func qemuNBD(p *pg, dir string, size int) (object, opts string) {
	host, port, _ := net.SplitHostPort(p.st.NBD)
	object = "tls-creds-x509,id=tls0,endpoint=client,dir=" + dir
	opts = "driver=nbd,host=" + host + ",port=" + port + ",export=" + p.st.Volume + ",tls-creds=tls0"
	if size > 0 {
		opts = "driver=raw,size=" + strconv.Itoa(size) + ",file." + strings.ReplaceAll(opts, ",", ",file.")
	}
	return object, opts
}

func randomFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// readVolume copies the whole volume out over TLS with nbdcopy.
func readVolume(t *testing.T, p *pg, certDir string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.img")
	run(t, 5*time.Minute, "nbdcopy", nbdsURI(p, certDir), out)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	return b
}

func TestNBDOverTLS(t *testing.T) {
	testutil.RequireTools(t, "nbdinfo", "nbdcopy", "qemu-img")
	const volSize = 64 << 20
	p := startPlayground(t, "64MiB", "--nbd-tls-policy", "require")
	bin := testcluster.Binary(t)
	good := p.st.NBDClientDir
	tmp := t.TempDir()

	// nbdinfo: the handshake says TLS.
	if out := run(t, time.Minute, "nbdinfo", nbdsURI(p, good)); !strings.Contains(out, "with TLS") || !strings.Contains(out, "export-size: "+strconv.Itoa(volSize)) {
		t.Fatalf("nbdinfo over TLS:\n%s", out)
	}

	// nbdcopy in and out.
	want := make([]byte, volSize)
	a := randomFile(t, filepath.Join(tmp, "a.img"), 32<<20)
	run(t, 5*time.Minute, "nbdcopy", filepath.Join(tmp, "a.img"), nbdsURI(p, good))
	copy(want, a)
	if got := readVolume(t, p, good); !bytes.Equal(got, want) {
		t.Fatal("nbdcopy over TLS: the volume does not read back what was copied in")
	}

	// qemu-img in (the first 16 MiB) and a compare through qemu's own client.
	b := randomFile(t, filepath.Join(tmp, "b.img"), 16<<20)
	obj, opts := qemuNBD(p, good, 0)
	run(t, 5*time.Minute, "qemu-img", "convert", "-n", "-f", "raw", "--object", obj,
		"--target-image-opts", filepath.Join(tmp, "b.img"), opts)
	copy(want, b)
	obj, opts = qemuNBD(p, good, 16<<20)
	if out := run(t, 5*time.Minute, "qemu-img", "compare", "--object", obj, "--image-opts", opts,
		"driver=file,filename="+filepath.Join(tmp, "b.img")); !strings.Contains(out, "identical") {
		t.Fatalf("qemu-img compare over TLS:\n%s", out)
	}
	if got := readVolume(t, p, good); !bytes.Equal(got, want) {
		t.Fatal("after qemu-img over TLS the volume does not hold what was written")
	}

	// stillServes: the good client still gets in, the playground runs, and
	// the volume is unchanged.
	stillServes := func(after string) {
		t.Helper()
		select {
		case <-p.exited:
			t.Fatalf("the playground exited after %s", after)
		default:
		}
		if out, err := runErr(time.Minute, "nbdinfo", nbdsURI(p, good)); err != nil {
			t.Fatalf("after %s a valid client is refused: %v\n%s", after, err, out)
		}
	}
	refused := func(what string, args ...string) string {
		t.Helper()
		out, err := runErr(time.Minute, args[0], args[1:]...)
		if err == nil {
			t.Fatalf("%s: %s succeeded:\n%s", what, args[0], out)
		}
		if strings.TrimSpace(out) == "" {
			t.Errorf("%s: %s failed without saying why", what, args[0])
		}
		logf(t, "%s: %s refused: %s", what, args[0], strings.TrimSpace(out))
		stillServes(what)
		return out
	}
	writeAttempt := filepath.Join(tmp, "evil.img")
	randomFile(t, writeAttempt, 1<<20)

	// 1. Plaintext against a listener that requires TLS.
	out := refused("plaintext nbdinfo", "nbdinfo", p.st.NBDURI)
	if !strings.Contains(out, "TLS") {
		t.Errorf("plaintext refusal does not mention TLS: %s", out)
	}
	refused("plaintext nbdcopy", "nbdcopy", writeAttempt, p.st.NBDURI)
	refused("plaintext qemu-img", "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", writeAttempt, p.st.NBDURI)

	// 2. TLS without a client certificate (only the CA, to trust the server).
	noCert := filepath.Join(tmp, "nocert")
	os.MkdirAll(noCert, 0o700)
	caPEM, _ := os.ReadFile(filepath.Join(good, identity.GnuTLSCAFile))
	os.WriteFile(filepath.Join(noCert, identity.GnuTLSCAFile), caPEM, 0o644)
	refused("no client certificate", "nbdcopy", writeAttempt, nbdsURI(p, noCert))

	// 3. A certificate of another CA (same cluster name), trusting our server.
	other := filepath.Join(tmp, "otherca")
	run(t, time.Minute, bin, "cert", "init", "--dir", other, "--cluster", "playground")
	foreign := filepath.Join(tmp, "foreign")
	run(t, time.Minute, bin, "cert", "issue", "--dir", other, "--role", "client", "--name", "evil",
		"--out", filepath.Join(tmp, "foreign-out"), "--gnutls-dir", foreign)
	os.WriteFile(filepath.Join(foreign, identity.GnuTLSCAFile), caPEM, 0o644)
	refused("another CA's certificate", "nbdcopy", writeAttempt, nbdsURI(p, foreign))

	// 4. A daemon's certificate of this cluster: the role may not attach.
	daemon := filepath.Join(tmp, "daemon")
	if err := identity.WriteGnuTLSClientDir(p.st.TLSDir, "chunkserver-1", daemon); err != nil {
		t.Fatal(err)
	}
	refused("a chunkserver's certificate", "nbdcopy", writeAttempt, nbdsURI(p, daemon))

	// 5. A revoked certificate: works, is revoked, is refused within the
	// CRL reload (about a second; polled).
	victimOut, victim := filepath.Join(tmp, "victim-out"), filepath.Join(tmp, "victim")
	run(t, time.Minute, bin, "cert", "issue", "--dir", p.st.TLSDir, "--role", "client", "--name", "victim",
		"--out", victimOut, "--gnutls-dir", victim)
	run(t, time.Minute, "nbdinfo", nbdsURI(p, victim))
	// A connection made before the revocation: qemu-io reads, then idles
	// (its sleeps), attached with the victim's certificate.
	obj, opts = qemuNBD(p, victim, 0)
	qargs := []string{"--object", obj, "--image-opts", opts, "-c", "read 0 4k"}
	for range 240 {
		qargs = append(qargs, "-c", "sleep 500", "-c", "read 0 4k")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	from := logSize(p)
	live := exec.CommandContext(ctx, "qemu-io", qargs...)
	live.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	liveDone := make(chan struct{})
	go func() { live.Wait(); close(liveDone) }()
	t.Cleanup(func() { live.Process.Kill(); <-liveDone })
	victimID := "basalt://playground/client/victim"
	waitLog(t, p, from, "qemu-io attached with the victim's certificate", "nbd: client connected", victimID)
	run(t, time.Minute, bin, "cert", "revoke", "--dir", p.st.TLSDir, "--cert", filepath.Join(victimOut, "client-victim.crt"))
	waitLog(t, p, from, "the front end cut the revoked certificate's open connection", "no longer accepted", victimID)
	select {
	case <-liveDone:
		t.Fatal("qemu-io ended before its connection was cut")
	default:
	}
	live.Process.Kill()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := runErr(time.Minute, "nbdinfo", nbdsURI(p, victim)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a revoked certificate still attaches 90 s after the revocation")
		}
		time.Sleep(500 * time.Millisecond)
	}
	refused("a revoked certificate", "nbdcopy", writeAttempt, nbdsURI(p, victim))

	if got := readVolume(t, p, good); !bytes.Equal(got, want) {
		t.Fatal("the volume changed during the refused attempts")
	}
}

// logSize is the playground log's length now, for waitLog.
func logSize(p *pg) int {
	b, _ := os.ReadFile(p.logPath)
	return len(b)
}

// waitLog polls the playground's log, from byte offset from on, until a
// line holds every one of want.
func waitLog(t *testing.T, p *pg, from int, what string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		b, _ := os.ReadFile(p.logPath)
		if len(b) < from {
			from = 0
		}
		for _, line := range strings.Split(string(b[from:]), "\n") {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(line, w)
			}
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no log line with %q within 90 s", what, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFioOverTLS: fio's nbd engine speaks nbds:// through libnbd, but it
// does not let the URI name a certificate directory (tls-certificates
// needs nbd_set_uri_allow_local_file, which fio does not call): libnbd
// then reads $HOME/.pki/libnbd, and for root only /etc/pki/libnbd. So fio
// runs as an unprivileged user with HOME in a temporary directory.
func TestFioOverTLS(t *testing.T) {
	testutil.RequireTools(t, "fio")
	if os.Geteuid() == 0 {
		if _, err := exec.LookPath("setpriv"); err != nil {
			t.Skip("as root libnbd reads certificates only from /etc/pki/libnbd, and setpriv (to run fio unprivileged) is missing")
		}
	}
	p := startPlayground(t, "64MiB", "--nbd-tls-policy", "require")
	home := t.TempDir()
	pki := filepath.Join(home, ".pki", "libnbd")
	if err := identity.WriteGnuTLSClientDir(p.st.TLSDir, identity.Base(identity.RoleClient, "nbd"), pki); err != nil {
		t.Fatal(err)
	}
	args := []string{"--name=tls", "--ioengine=nbd", "--uri=nbds://" + p.st.NBD + "/" + p.st.Volume,
		"--rw=randwrite", "--bs=4k", "--size=16m", "--iodepth=8", "--verify=crc32c", "--do_verify=1",
		"--verify_state_save=0", "--output-format=normal"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fio", args...)
	cmd.Dir = home
	cmd.Env = append(os.Environ(), "HOME="+home)
	if os.Geteuid() == 0 {
		for d := filepath.Dir(filepath.Dir(home)); ; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err != nil || fi.Mode().Perm()&0o001 == 0 {
				t.Skipf("fio must run unprivileged here (libnbd reads root's certificates only from /etc/pki/libnbd), but it cannot enter %s (%v): set TMPDIR to a directory others may enter", d, err)
			}
			if d == filepath.Dir(d) {
				break
			}
		}
		// The unprivileged user must read the certificates and write in HOME.
		for _, d := range []string{filepath.Dir(home), home, filepath.Join(home, ".pki"), pki} {
			os.Chmod(d, 0o777)
		}
		for _, f := range []string{identity.GnuTLSCAFile, identity.GnuTLSCertFile, identity.GnuTLSKeyFile} {
			os.Chmod(filepath.Join(pki, f), 0o644)
		}
		cmd = exec.CommandContext(ctx, "setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "fio"}, args...)...)
		cmd.Dir, cmd.Env = home, append(os.Environ(), "HOME="+home)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	if err != nil || !strings.Contains(out, "err= 0") || strings.Contains(out, "verify: bad") {
		t.Fatalf("fio over nbds:// failed (%v):\n%s", err, tail(out, 40))
	}
	logf(t, "fio over TLS:\n%s", tail(out, 6))
}
