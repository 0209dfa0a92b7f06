package access_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
)

// A volume's CHAP lives in the MDS: an admin sets it with `basalt volume
// chap set`, and two iSCSI portals (two access nodes) over the same MDS
// let libiscsi's iscsi-inq in with the right secret (and mutual CHAP) and
// refuse a wrong one; `chap clear` brings the portals' own rule (here: none)
// back; a non-admin may not set it; `chap show` never prints a secret.
func TestTargetCHAPAcrossAccessNodes(t *testing.T) {
	testutil.RequireTool(t, "iscsi-inq")
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	c.CreateVolume("vol", 16<<20)
	id := c.Identity(identity.RoleAccess, "access-chap")
	var portals []string
	for i := range 2 {
		node, err := access.Start(access.Config{
			MDS: strings.Split(c.MDSAddr, ","), MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
			ClientName: fmt.Sprintf("access-chap-%d", i),
			ISCSI:      access.ISCSIConfig{Listen: "127.0.0.1:0", Cluster: "c"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { node.Close() })
		portals = append(portals, node.ISCSIPortal().String())
	}
	target := iscsi.TargetName("c", "vol")
	dir := t.TempDir()
	writeFile := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secret, mutualSecret = "alice-secret-0123", "target-secret-456"
	secretFile, mutualFile := writeFile("secret", secret), writeFile("mutual", mutualSecret)
	cli := func(cert string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		args = append(args, "--mds", c.MDSAddr, "--tls-dir", c.TLSDir, "--tls-cert", cert)
		cmd := exec.CommandContext(ctx, c.Binary, args...)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	admin := c.Issue(identity.RoleAdmin, "admin")
	inq := func(portal, userinfo, query string) (string, error) {
		url := "iscsi://" + userinfo + portal + "/" + target + "/0" + query
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "iscsi-inq", "-i", "iqn.2026-11.io.basalt.test:chap", url)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		out = bytes.TrimSpace(out)
		if len(out) > 2000 {
			out = out[len(out)-2000:]
		}
		return string(out), err
	}
	// eventually waits (the nodes' copies live DefaultCHAPTTL) until login
	// through every portal gives what check wants.
	eventually := func(what string, check func(portal string) error) {
		t.Helper()
		for _, p := range portals {
			c.Eventually(90*time.Second, what+" through "+p, func(context.Context) error { return check(p) })
		}
	}
	refused := func(userinfo, query string) func(string) error {
		return func(p string) error {
			out, err := inq(p, userinfo, query)
			if err == nil || !strings.Contains(out, "Authentication failure(513)") {
				return fmt.Errorf("iscsi-inq %s: %v: %s; want an authentication failure", userinfo, err, out)
			}
			return nil
		}
	}
	served := func(userinfo, query string) func(string) error {
		return func(p string) error {
			out, err := inq(p, userinfo, query)
			if err != nil {
				return fmt.Errorf("iscsi-inq %s: %v: %s", userinfo, err, out)
			}
			return nil
		}
	}

	// No CHAP anywhere yet: the portals let anyone in.
	eventually("a login without CHAP", served("", ""))

	// A non-admin may not set it (the CLI refuses the certificate before
	// the MDS would; TestTargetCHAP in internal/mds has the MDS refuse it).
	if out, err := cli(c.Issue(identity.RoleAccess, "access-chap"), "volume", "chap", "set", "vol",
		"--user", "mallory", "--secret-file", secretFile); err == nil || !strings.Contains(out, "admin is needed") {
		t.Fatalf("an access identity set a volume's CHAP: %v: %s", err, out)
	}
	if out, err := cli(admin, "volume", "chap", "set", "vol", "--user", "alice", "--secret-file", secretFile,
		"--mutual-user", "tgt", "--mutual-secret-file", mutualFile); err != nil {
		t.Fatalf("chap set: %v: %s", err, out)
	}
	eventually("a login without CHAP refused", refused("", ""))
	eventually("the right secret", served("alice%"+secret+"@", ""))
	eventually("mutual CHAP", served("alice%"+secret+"@", "?target_user=tgt&target_password="+mutualSecret))
	for _, p := range portals {
		if err := refused("alice%alice-secret-0124@", "")(p); err != nil {
			t.Errorf("a wrong secret: %v", err)
		}
		if err := refused("bob%"+secret+"@", "")(p); err != nil {
			t.Errorf("a wrong user: %v", err)
		}
		if out, err := inq(p, "alice%"+secret+"@", "?target_user=tgt&target_password=not-the-target-1"); err == nil {
			t.Errorf("libiscsi accepted a target answering mutual CHAP with another secret: %s", out)
		}
	}
	out, err := cli(admin, "volume", "chap", "show", "vol")
	if err != nil || !strings.Contains(out, "alice") || strings.Contains(out, secret) || strings.Contains(out, mutualSecret) {
		t.Errorf("chap show: %v: %q, want the users and no secret", err, out)
	}
	out, err = cli(admin, "volume", "chap", "show", "vol", "-o", "json")
	if err != nil || strings.Contains(out, secret) || strings.Contains(out, mutualSecret) {
		t.Errorf("chap show -o json: %v: %q, want no secret", err, out)
	}

	if out, err := cli(admin, "volume", "chap", "clear", "vol"); err != nil {
		t.Fatalf("chap clear: %v: %s", err, out)
	}
	eventually("a login without CHAP after clear", served("", ""))
	if n := c.CountLog(c.MDS, secret) + c.CountLog(c.MDS, mutualSecret); n != 0 {
		t.Errorf("the MDS logged a CHAP secret (%d lines)", n)
	}
}
