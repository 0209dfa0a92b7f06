package testcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// TestCARotation rolls the cluster CA on a live cluster the way
// docs/security.md ("Rotating keys") tells an operator to, under a verified
// workload: (1) a new CA is added to ca.crt (a bundle) and every process
// restarted in turn; (2) every certificate is reissued by the new CA, which
// the running processes pick up without a restart; (3) the old CA is
// removed from ca.crt and every process restarted again. No acknowledged
// write is lost, IO goes on, and a certificate of the removed CA is then
// refused by the MDS and by every chunkserver.
func TestCARotation(t *testing.T) {
	c := Start(t, Options{Copysets: 4})
	c.CreateVolume("rot", 32<<20)
	oldCA := c.CA()
	caCrt := filepath.Join(c.TLSDir, identity.CACertFile)

	// A client process (re)started now: it reads the TLS directory afresh.
	open := func() *client.Volume {
		t.Helper()
		id, err := identity.Load(c.TLSDir, identity.Base(identity.RoleClient, "test"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		v, err := client.Open(ctx, client.Config{MDS: strings.Split(c.MDSAddr, ","), MDSTLS: id.ClientTLS(identity.RoleMDS),
			DataTLS: id.ClientTLS(identity.RoleChunkserver), Volume: "rot", ClientName: t.Name()})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { v.Close() })
		return v
	}
	redialAdmin := func() {
		t.Helper()
		id, err := identity.Load(c.TLSDir, "admin")
		if err != nil {
			t.Fatal(err)
		}
		api, err := mdsclient.Dial(strings.Split(c.MDSAddr, ","), id.ClientTLS(identity.RoleMDS))
		if err != nil {
			t.Fatal(err)
		}
		c.API.Close()
		c.API = api
	}

	c.Identity(identity.RoleClient, "test") // issued by the old CA, like every other
	v := open()
	w := StartWorkload(t, v, WorkloadOptions{Seed: 14})
	t.Cleanup(w.Stop)
	// restartAll restarts the MDS, then each chunkserver, waiting for the
	// cluster to be healthy in between; then the client and the admin tool
	// restart too (they read ca.crt at start, like the daemons).
	restartAll := func(step string) {
		t.Helper()
		for _, p := range c.MDSs {
			c.Stop(p)
			c.Start(p)
		}
		redialAdmin()
		c.WaitHealthy(120 * time.Second)
		for _, p := range c.CS {
			serving := c.CountLog(p, "chunkserver serving")
			c.Stop(p)
			c.Start(p)
			c.Eventually(120*time.Second, p.Name+" serving again ("+step+")", func(context.Context) error {
				if c.CountLog(p, "chunkserver serving") == serving {
					return fmt.Errorf("%s not serving yet", p.Name)
				}
				return nil
			})
			c.WaitHealthy(120 * time.Second)
		}
		w.Reopen(open())
		w.AwaitProgress(c, "IO after "+step)
	}
	w.AwaitProgress(c, "the workload to start")

	// 1. The new CA, trusted beside the old one.
	newDir := t.TempDir()
	newCA, err := identity.InitCA(newDir, "test")
	if err != nil {
		t.Fatal(err)
	}
	oldPEM, err := os.ReadFile(caCrt)
	if err != nil {
		t.Fatal(err)
	}
	newPEM, err := os.ReadFile(filepath.Join(newDir, identity.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, caCrt, append(append([]byte(nil), oldPEM...), newPEM...))
	restartAll("trusting both CAs")

	// 2. Every certificate reissued by the new CA, in place; its CRL too.
	ents, err := os.ReadDir(c.TLSDir)
	if err != nil {
		t.Fatal(err)
	}
	reissued := 0
	for _, e := range ents {
		base, ok := strings.CutSuffix(e.Name(), ".crt")
		if !ok || e.Name() == identity.CACertFile {
			continue
		}
		cert, err := identity.ReadCert(filepath.Join(c.TLSDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		who, err := identity.Parse(cert)
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		iss, err := newCA.Issue(who.Role, who.Name, identity.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The key first: a process reloads when the certificate changes.
		writeAtomic(t, filepath.Join(c.TLSDir, base+".key"), iss.KeyPEM)
		writeAtomic(t, filepath.Join(c.TLSDir, base+".crt"), iss.CertPEM)
		reissued++
	}
	crl, err := os.ReadFile(filepath.Join(newDir, identity.CRLFile))
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(c.TLSDir, identity.CRLFile), crl)
	t.Logf("reissued %d certificates from the new CA", reissued)
	// New connections now present the new certificates: make some.
	redialAdmin()
	c.WaitHealthy(120 * time.Second)
	w.AwaitProgress(c, "IO after reissuing every certificate")

	// 3. The old CA removed; the new one's key takes its place.
	writeAtomic(t, caCrt, newPEM)
	key, err := os.ReadFile(filepath.Join(newDir, identity.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(c.TLSDir, identity.CAKeyFile), key)
	c.ca = newCA
	restartAll("the old CA removed")
	w.Stop()
	w.Verify(open())

	// A certificate of the removed CA is refused everywhere.
	evil := t.TempDir()
	if _, _, err := oldCA.IssueFiles(evil, "", identity.RoleClient, "test", identity.IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	// It trusts both CAs, so only the servers' judgement decides.
	writeAtomic(t, filepath.Join(evil, identity.CACertFile), append(append([]byte(nil), oldPEM...), newPEM...))
	_ = os.Remove(filepath.Join(evil, identity.CRLFile))
	old, err := identity.Load(evil, identity.Base(identity.RoleClient, "test"))
	if err != nil {
		t.Fatal(err)
	}
	mc, err := mdsclient.Dial(strings.Split(c.MDSAddr, ","), old.ClientTLS(identity.RoleMDS))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_, err = mc.ListPools(ctx, &api.ListPoolsRequest{})
	cancel()
	mc.Close()
	if err == nil {
		t.Fatal("the MDS served a certificate of the removed CA")
	}
	for _, p := range c.CS {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		conn, err := transport.Dial(ctx, p.Addr, transport.ConnConfig{Security: transport.Security{
			Mode: transport.ModeAuthenticated, TLS: old, Allow: []identity.Role{identity.RoleChunkserver}}})
		cancel()
		if err == nil {
			conn.Close()
			t.Fatalf("%s accepted a certificate of the removed CA", p.Name)
		}
		if !errors.Is(err, transport.ErrHandshake) {
			t.Errorf("%s: %v, want a refused handshake", p.Name, err)
		}
	}
}

// writeAtomic replaces path with data (a temporary file renamed over it).
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
