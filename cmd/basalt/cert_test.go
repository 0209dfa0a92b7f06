package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/identity"
)

func runCert(t *testing.T, args ...string) error {
	t.Helper()
	cmd := certCommand()
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.Execute()
}

func TestCertCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	out := t.TempDir()
	if err := runCert(t, "init", "--dir", dir, "--cluster", "demo"); err != nil {
		t.Fatal(err)
	}
	if err := runCert(t, "issue", "--dir", dir, "--role", "admin"); err != nil {
		t.Fatal(err)
	}
	if err := runCert(t, "issue", "--dir", dir, "--role", "chunkserver", "--name", "2", "--out", out); err != nil {
		t.Fatal(err)
	}
	admin, err := identity.Load(dir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	if id := admin.Identity(); id.String() != "basalt://demo/admin/admin" {
		t.Fatalf("admin identity %s", id)
	}
	cs, err := identity.Load(out, "chunkserver-2")
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := cs.Identity().ChunkserverID(); !ok || n != 2 {
		t.Fatalf("chunkserver identity %s", cs.Identity())
	}
	if err := runCert(t, "revoke", "--dir", dir, "--cert", cs.CertFile()); err != nil {
		t.Fatal(err)
	}
	ca, _ := identity.OpenCA(dir)
	if l, _ := ca.Revoked(); len(l) != 1 {
		t.Fatalf("revoked: %v", l)
	}
	if err := runCert(t, "ls", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"init", "--dir", dir, "--cluster", "demo"}, "already exists"},
		{[]string{"init", "--cluster", "x"}, "--dir is required"},
		{[]string{"init", "--dir", t.TempDir()}, "--cluster is required"},
		{[]string{"issue", "--dir", dir, "--role", "chunkserver"}, "--name is required"},
		{[]string{"issue", "--dir", dir, "--role", "chunkserver", "--name", "x"}, "id, a number"},
		{[]string{"issue", "--dir", dir, "--role", "root", "--name", "x"}, "unknown role"},
		{[]string{"issue", "--dir", t.TempDir(), "--role", "admin"}, "missing"},
		{[]string{"revoke", "--dir", dir}, "exactly one"},
		{[]string{"revoke", "--dir", dir, "--serial", "zz"}, "not a hex serial"},
	} {
		err := runCert(t, bad.args...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("cert %v = %v, want an error containing %q", bad.args, err, bad.want)
		}
	}
	if err := runCert(t, "issue", "--dir", t.TempDir(), "--role", "admin"); !errors.Is(err, identity.ErrNoCA) {
		t.Errorf("issue without a CA = %v, want ErrNoCA", err)
	}
}
