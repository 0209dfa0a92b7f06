package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func init() { reloadEvery = 0 } // tests see file changes at once

func newCA(t *testing.T, cluster string) *CA {
	t.Helper()
	ca, err := InitCA(t.TempDir(), cluster)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// party issues role/name from ca into its own directory and loads it.
func party(t *testing.T, ca *CA, role Role, name string, opt IssueOptions) (*Config, *Issued) {
	t.Helper()
	dir := t.TempDir()
	iss, _, err := ca.IssueFiles(dir, "", role, name, opt)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(dir, Base(role, name))
	if err != nil {
		t.Fatal(err)
	}
	return cfg, iss
}

func TestIssueAndParse(t *testing.T) {
	ca := newCA(t, "prod")
	iss, err := ca.Issue(RoleChunkserver, "7", IssueOptions{Hosts: []string{"10.0.0.7", "cs7.example"}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := Parse(iss.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Identity{Cluster: "prod", Role: RoleChunkserver, Name: "7"}); id != want {
		t.Fatalf("identity %+v, want %+v", id, want)
	}
	if n, ok := id.ChunkserverID(); !ok || n != 7 {
		t.Fatalf("ChunkserverID = %d, %v", n, ok)
	}
	if got := id.String(); got != "basalt://prod/chunkserver/7" {
		t.Fatalf("URI %q", got)
	}
	if len(iss.Cert.IPAddresses) != 3 || len(iss.Cert.DNSNames) != 2 {
		t.Fatalf("hosts: %v %v", iss.Cert.IPAddresses, iss.Cert.DNSNames)
	}
	for _, bad := range []struct {
		role Role
		name string
	}{{RoleChunkserver, "x"}, {RoleChunkserver, "0"}, {"root", "a"}, {RoleClient, ""}, {RoleClient, "a/b"}, {RoleClient, strings.Repeat("a", 65)}} {
		if _, err := ca.Issue(bad.role, bad.name, IssueOptions{}); !errors.Is(err, ErrBadIdentity) {
			t.Errorf("Issue(%q, %q) = %v, want ErrBadIdentity", bad.role, bad.name, err)
		}
	}
	if Base(RoleAdmin, "admin") != "admin" || Base(RoleChunkserver, "3") != "chunkserver-3" {
		t.Fatal("Base")
	}
	// A certificate without a basalt URI has no identity.
	if _, err := Parse(ca.Cert); !errors.Is(err, ErrBadIdentity) && !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("Parse(CA) = %v", err)
	}
}

func TestInitRefusesToOverwriteAndOpenCA(t *testing.T) {
	ca := newCA(t, "c1")
	if _, err := InitCA(ca.dir, "c1"); !errors.Is(err, ErrCAExists) {
		t.Fatalf("second InitCA = %v, want ErrCAExists", err)
	}
	again, err := OpenCA(ca.dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Cluster != "c1" || !again.Cert.Equal(ca.Cert) {
		t.Fatalf("OpenCA: %q", again.Cluster)
	}
	if _, err := OpenCA(t.TempDir()); !errors.Is(err, ErrNoCA) {
		t.Fatalf("OpenCA(empty) = %v, want ErrNoCA", err)
	}
	if fi, err := os.Stat(filepath.Join(ca.dir, CAKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key mode: %v %v", fi.Mode(), err)
	}
}

func TestLoadErrorsSayWhatToDo(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir, "admin"); err == nil || !strings.Contains(err.Error(), "basalt cert init") {
		t.Fatalf("Load(empty) = %v", err)
	}
	ca := newCA(t, "c1")
	if _, err := Load(ca.dir, "admin"); err == nil || !strings.Contains(err.Error(), "basalt cert issue") {
		t.Fatalf("Load(no cert) = %v", err)
	}
	// A certificate from another CA does not load against this ca.crt.
	other := newCA(t, "c1")
	if _, _, err := other.IssueFiles(t.TempDir(), "", RoleAdmin, "admin", IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	iss, _ := other.Issue(RoleAdmin, "admin", IssueOptions{})
	os.WriteFile(filepath.Join(ca.dir, "admin.crt"), iss.CertPEM, 0o644)
	os.WriteFile(filepath.Join(ca.dir, "admin.key"), iss.KeyPEM, 0o600)
	if _, err := Load(ca.dir, "admin"); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("Load(foreign cert) = %v, want ErrUntrusted", err)
	}
	// An expired own certificate is refused at load, not at the first peer.
	old := time.Now().Add(-48 * time.Hour)
	if _, _, err := ca.IssueFiles(ca.dir, "", RoleClient, "old", IssueOptions{NotBefore: old, NotAfter: old.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(ca.dir, "client-old"); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("Load(expired) = %v, want ErrUntrusted", err)
	}
}

// handshake connects client to server over a real socket and returns the
// identities each saw and the server's and the client's errors.
func handshake(t *testing.T, srv, cli *tls.Config) (srvSaw, cliSaw Identity, srvErr, cliErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		err error
		id  Identity
	}
	done := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- res{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		tc := tls.Server(c, srv)
		if err := tc.Handshake(); err != nil {
			done <- res{err: err}
			return
		}
		id, err := PeerIdentity(tc.ConnectionState())
		if err == nil {
			_, err = tc.Write([]byte{1}) // carries the session ticket
		}
		done <- res{err, id}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	tc := tls.Client(c, cli)
	cliErr = tc.Handshake()
	if cliErr == nil {
		cliSaw, cliErr = PeerIdentity(tc.ConnectionState())
		lastResumed = tc.ConnectionState().DidResume
	}
	if cliErr == nil {
		// In TLS 1.3 the server judges the client's certificate after the
		// client has finished; the verdict arrives with the first read.
		_, cliErr = io.ReadFull(tc, make([]byte, 1))
	}
	r := <-done
	return r.id, cliSaw, r.err, cliErr
}

func TestMutualTLS(t *testing.T) {
	ca := newCA(t, "prod")
	mds, _ := party(t, ca, RoleMDS, "mds", IssueOptions{})
	admin, _ := party(t, ca, RoleAdmin, "admin", IssueOptions{})
	cs, _ := party(t, ca, RoleChunkserver, "2", IssueOptions{})
	old := time.Now().Add(-48 * time.Hour)
	// Load refuses an expired certificate, so load it while valid-looking:
	// issue it valid, load, then swap in the expired one (the reloader
	// refuses nothing about its own certificate's dates).
	expired, _ := party(t, ca, RoleAdmin, "late", IssueOptions{})
	if _, _, err := ca.IssueFiles(expired.dir, "", RoleAdmin, "late", IssueOptions{NotBefore: old, NotAfter: old.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	future, _ := party(t, ca, RoleAdmin, "early", IssueOptions{})
	soon := time.Now().Add(24 * time.Hour)
	if _, _, err := ca.IssueFiles(future.dir, "", RoleAdmin, "early", IssueOptions{NotBefore: soon, NotAfter: soon.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	foreignCA := newCA(t, "prod") // same cluster name, another key
	foreign, _ := party(t, foreignCA, RoleAdmin, "admin", IssueOptions{})
	// Same CA key, another cluster name: only possible by misusing a CA,
	// but the cluster check must still hold.
	otherCluster := *ca
	otherCluster.Cluster = "staging"
	stranger, _ := party(t, &otherCluster, RoleAdmin, "admin", IssueOptions{})

	srv := mds.ServerTLS(RoleAdmin, RoleClient)
	for _, tc := range []struct {
		name    string
		cli     *tls.Config
		srvWant error // nil: accepted
		cliWant error
	}{
		{"admin", admin.ClientTLS(RoleMDS), nil, nil},
		// The client judges the server first (its certificate comes first
		// in TLS 1.3); the server then sees the client's alert.
		{"wrong CA", foreign.ClientTLS(), errAny, ErrUntrusted},
		{"wrong role", cs.ClientTLS(RoleMDS), ErrRoleNotAllowed, nil},
		{"server has wrong role", admin.ClientTLS(RoleChunkserver), errAny, ErrRoleNotAllowed},
		{"expired", expired.ClientTLS(RoleMDS), ErrUntrusted, nil},
		{"not yet valid", future.ClientTLS(RoleMDS), ErrUntrusted, nil},
		{"other cluster", stranger.ClientTLS(), errAny, ErrWrongCluster},
		{"no client certificate", &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}, errAny, nil},
		{"TLS 1.2 client", func() *tls.Config {
			c := admin.ClientTLS()
			c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			return c
		}(), errAny, errAny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvSaw, cliSaw, srvErr, cliErr := handshake(t, srv, tc.cli)
			check := func(side string, got, want error) {
				t.Helper()
				switch {
				case want == nil && got != nil:
					t.Fatalf("%s: %v, want success", side, got)
				case want == errAny && got == nil, want != nil && want != errAny && !errors.Is(got, want):
					t.Fatalf("%s: %v, want %v", side, got, want)
				}
			}
			check("server", srvErr, tc.srvWant)
			switch {
			case tc.cliWant != nil:
				check("client", cliErr, tc.cliWant)
			case tc.srvWant != nil && cliErr == nil:
				t.Fatal("client: handshake succeeded although the server refused it")
			case tc.srvWant == nil:
				check("client", cliErr, nil)
			}
			if tc.srvWant == nil && tc.cliWant == nil {
				if srvSaw != admin.Identity() || cliSaw != mds.Identity() {
					t.Fatalf("identities: server saw %v, client saw %v", srvSaw, cliSaw)
				}
			}
		})
	}
}

var errAny = errors.New("any error")

// lastResumed is whether the last successful client handshake resumed a session.
var lastResumed bool

func TestRevokedPeerIsRefusedEvenOnResumption(t *testing.T) {
	ca := newCA(t, "prod")
	// The MDS reads the CA's own directory, so it sees ca.crl as the CA writes it.
	if _, _, err := ca.IssueFiles(ca.dir, "", RoleMDS, "mds", IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	mds, err := Load(ca.dir, "mds")
	if err != nil {
		t.Fatal(err)
	}
	client, iss := party(t, ca, RoleClient, "web1", IssueOptions{})
	srv := mds.ServerTLS(RoleClient)
	cli := client.ClientTLS(RoleMDS)
	cli.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	cli.ServerName = "mds" // the cache key; each handshake listens on a new port
	for i := 0; i < 2; i++ {
		if _, _, srvErr, cliErr := handshake(t, srv, cli); srvErr != nil || cliErr != nil {
			t.Fatalf("before revocation: server %v, client %v", srvErr, cliErr)
		}
	}
	if !lastResumed {
		t.Fatal("the second connection did not resume its session; the test would not cover resumption")
	}
	if err := ca.Revoke(iss.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	if err := ca.Revoke(iss.Cert.SerialNumber); err != nil { // idempotent
		t.Fatal(err)
	}
	if l, _ := ca.Revoked(); len(l) != 1 {
		t.Fatalf("revoked list: %v", l)
	}
	_, _, srvErr, cliErr := handshake(t, srv, cli)
	if !errors.Is(srvErr, ErrRevoked) || cliErr == nil {
		t.Fatalf("after revocation: server %v, client %v; want ErrRevoked", srvErr, cliErr)
	}
	// Another client of the same CA still gets in.
	other, _ := party(t, ca, RoleClient, "web2", IssueOptions{})
	if _, _, srvErr, cliErr := handshake(t, srv, other.ClientTLS(RoleMDS)); srvErr != nil || cliErr != nil {
		t.Fatalf("unrevoked client: server %v, client %v", srvErr, cliErr)
	}
}

func TestForgedCRLIsIgnored(t *testing.T) {
	ca := newCA(t, "prod")
	if _, _, err := ca.IssueFiles(ca.dir, "", RoleMDS, "mds", IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	mds, err := Load(ca.dir, "mds")
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := party(t, ca, RoleAdmin, "admin", IssueOptions{})
	// Someone without the CA key writes a CRL revoking the admin: it is not
	// signed by the CA, so the old (empty) list stays.
	rogue := newCA(t, "prod")
	rogue.dir = ca.dir
	if err := rogue.writeCRL(nil); err != nil {
		t.Fatal(err)
	}
	if _, _, srvErr, cliErr := handshake(t, mds.ServerTLS(), admin.ClientTLS()); srvErr != nil || cliErr != nil {
		t.Fatalf("server %v, client %v", srvErr, cliErr)
	}
	if _, err := ReadCRL(ca.dir, []*x509.Certificate{ca.Cert}); err == nil {
		t.Fatal("ReadCRL accepted a CRL from another CA")
	}
}

func TestRenewedCertificateIsPickedUp(t *testing.T) {
	ca := newCA(t, "prod")
	mds, _ := party(t, ca, RoleMDS, "mds", IssueOptions{})
	admin, first := party(t, ca, RoleAdmin, "admin", IssueOptions{})
	second, _, err := ca.IssueFiles(admin.dir, "", RoleAdmin, "admin", IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Revoke(first.Cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	// The MDS has its own copy of ca.crl: distribute it as an operator would.
	crl, _ := os.ReadFile(filepath.Join(ca.dir, CRLFile))
	os.WriteFile(filepath.Join(mds.dir, CRLFile), crl, 0o644)
	srvSaw, _, srvErr, cliErr := handshake(t, mds.ServerTLS(RoleAdmin), admin.ClientTLS(RoleMDS))
	if srvErr != nil || cliErr != nil {
		t.Fatalf("server %v, client %v", srvErr, cliErr)
	}
	if srvSaw != second.Identity || admin.current().Leaf.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatal("the renewed certificate was not used")
	}
}
