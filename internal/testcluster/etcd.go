package testcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// Etcd is an external etcd cluster of real etcd processes on loopback, for
// several MDS to share (docs/design.md §8).
type Etcd struct {
	Endpoints []string
	Procs     []*exec.Cmd
	// TLSDir holds the CA the members' certificates come from; give it to
	// Start (Options.TLSDir) so the MDS trust them and they trust the MDS.
	TLSDir string
}

// StartEtcd starts an n-member etcd cluster from /usr/bin/etcd (Debian's
// etcd-server) and waits until it answers. It skips the test when etcd is not
// installed. The members are killed by t.Cleanup.
func StartEtcd(t testing.TB, n int) *Etcd {
	t.Helper()
	bin := testutil.RequireTool(t, "etcd")
	dir := t.TempDir()
	// Clients (the MDS) connect over TLS with client certificates of the
	// cluster CA. Peer traffic stays on loopback in plain HTTP: it is
	// etcd's own, and the test does not attack it.
	tlsDir := filepath.Join(dir, "tls")
	ensureCA(t, tlsDir)
	type member struct{ name, client, peer string }
	var ms []member
	var initial []string
	var need []identity.Need
	for i := 0; i < n; i++ {
		m := member{fmt.Sprintf("e%d", i+1),
			"https://" + testutil.FreeAddr(t), "http://" + testutil.FreeAddr(t)}
		ms = append(ms, m)
		initial = append(initial, m.name+"="+m.peer)
		need = append(need, identity.Need{Role: identity.RoleEtcd, Name: m.name})
	}
	if err := identity.EnsureCerts(tlsDir, "test", need); err != nil {
		t.Fatal(err)
	}
	e := &Etcd{TLSDir: tlsDir}
	t.Cleanup(func() {
		for _, cmd := range e.Procs {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	for _, m := range ms {
		logf, err := os.Create(filepath.Join(dir, m.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--name", m.name, "--data-dir", filepath.Join(dir, m.name),
			"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
			"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "basalt-test", "--logger", "zap", "--log-outputs", "stderr",
			"--cert-file", filepath.Join(tlsDir, identity.Base(identity.RoleEtcd, m.name)+".crt"),
			"--key-file", filepath.Join(tlsDir, identity.Base(identity.RoleEtcd, m.name)+".key"),
			"--trusted-ca-file", filepath.Join(tlsDir, identity.CACertFile),
			"--client-crl-file", filepath.Join(tlsDir, identity.CRLFile),
			"--client-cert-auth")
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start etcd: %v", err)
		}
		e.Procs = append(e.Procs, cmd)
		e.Endpoints = append(e.Endpoints, strings.TrimPrefix(m.client, "https://"))
	}
	id, err := identity.Load(tlsDir, identity.Base(identity.RoleEtcd, ms[0].name))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second,
		TLS: id.ClientTLS(identity.RoleEtcd)})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := cli.Put(ctx, "/basalt-test/ping", "1")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd cluster not ready after 60 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("etcd: %d members at %s", n, strings.Join(e.Endpoints, ","))
	return e
}
