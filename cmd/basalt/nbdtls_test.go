package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/identity"
)

// TestNBDTLSPolicyFlags: bad policies and a policy with --insecure are
// refused before anything starts.
func TestNBDTLSPolicyFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure", "--tls-policy", "require"}, "not with --insecure"},
		{[]string{"--insecure", "--socket", "x", "--socket-tls-policy", "allow"}, "not with --insecure"},
		{[]string{"--insecure", "--tls-policy", "sometimes"}, "not with --insecure"},
	} {
		cmd := nbdCommand()
		cmd.SetArgs(append([]string{"--mds", "127.0.0.1:1"}, c.args...))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("basalt nbd %v: %v, want an error with %q", c.args, err, c.want)
		}
	}
	dir := t.TempDir()
	if err := identity.EnsureCerts(dir, "t", []identity.Need{{Role: identity.RoleAccess, Name: "fe"}}); err != nil {
		t.Fatal(err)
	}
	cmd := nbdCommand()
	cmd.SetArgs([]string{"--mds", "127.0.0.1:1", "--tls-dir", dir, "--tls-policy", "sometimes"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--tls-policy") {
		t.Errorf("basalt nbd --tls-policy sometimes: %v, want a --tls-policy error", err)
	}
}

// TestCertIssueGnuTLSDir: --gnutls-dir lays the certificate out under the
// names libnbd and qemu read, the key private.
func TestCertIssueGnuTLSDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	g := filepath.Join(t.TempDir(), "g")
	if err := runCert(t, "init", "--dir", dir, "--cluster", "demo"); err != nil {
		t.Fatal(err)
	}
	if err := runCert(t, "issue", "--dir", dir, "--role", "client", "--name", "vm1", "--gnutls-dir", g); err != nil {
		t.Fatal(err)
	}
	for f, base := range map[string]string{identity.GnuTLSCAFile: "ca.crt", identity.GnuTLSCertFile: "client-vm1.crt", identity.GnuTLSKeyFile: "client-vm1.key"} {
		got, err := os.ReadFile(filepath.Join(g, f))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(filepath.Join(dir, base))
		if string(got) != string(want) {
			t.Errorf("%s is not %s", f, base)
		}
	}
	if fi, err := os.Stat(filepath.Join(g, identity.GnuTLSKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode: %v %v", fi.Mode(), err)
	}
}
