package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// reloadEvery bounds how often the leaf key pair and ca.crl are checked for changes.
var reloadEvery = time.Second

// Config is one party's view of a TLS directory: the CA pool it trusts,
// its own certificate and key, and the revocation list. It is safe for
// concurrent use; the *tls.Config values it returns share it.
type Config struct {
	dir, base string
	self      Identity
	cas       []*x509.Certificate
	roots     *x509.CertPool

	mu        sync.Mutex // guards the fields below
	cert      *tls.Certificate
	certStamp stamp
	revoked   map[string]bool // serial (hex) → revoked
	crlStamp  stamp
	checked   time.Time // last time the files were stat'ed
}

// stamp identifies a version of a file without reading it.
type stamp struct {
	fi  os.FileInfo
	err error
}

func (s stamp) same(o stamp) bool {
	if s.fi == nil || o.fi == nil {
		return s.fi == nil && o.fi == nil && errors.Is(s.err, os.ErrNotExist) == errors.Is(o.err, os.ErrNotExist)
	}
	return os.SameFile(s.fi, o.fi) && s.fi.ModTime().Equal(o.fi.ModTime()) && s.fi.Size() == o.fi.Size()
}

func stampOf(path string) stamp {
	fi, err := os.Stat(path)
	return stamp{fi, err}
}

// Load reads dir/ca.crt, dir/<base>.crt, dir/<base>.key and dir/ca.crl.
// base is a file base name as Base returns (for example "admin",
// "chunkserver-3"). It fails, saying which file and why, when a file is
// missing, the certificate does not verify to the CA, or it has expired.
func Load(dir, base string) (*Config, error) {
	cas, err := readCerts(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("%w (make one with `basalt cert init --dir %s --cluster NAME`)", err, dir)
	}
	c := &Config{dir: dir, base: base, cas: cas, roots: x509.NewCertPool()}
	for _, ca := range cas {
		c.roots.AddCert(ca)
	}
	cert, st, err := c.readKeyPair()
	if err != nil {
		return nil, err
	}
	if _, err := c.verifyChain(cert.Leaf, time.Now()); err != nil {
		return nil, fmt.Errorf("%s: %w", c.certPath(), err)
	}
	self, err := Parse(cert.Leaf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.certPath(), err)
	}
	c.self, c.cert, c.certStamp = self, cert, st
	crlSt := stampOf(filepath.Join(dir, CRLFile))
	revoked, err := c.readCRL()
	if err != nil {
		return nil, err
	}
	c.revoked, c.crlStamp, c.checked = revoked, crlSt, time.Now()
	return c, nil
}

// Identity is who this party's own certificate names.
func (c *Config) Identity() Identity { return c.self }

// Dir is the TLS directory.
func (c *Config) Dir() string { return c.dir }

// CAFile is the path of ca.crt, for tools that take paths (etcd).
func (c *Config) CAFile() string { return filepath.Join(c.dir, CACertFile) }

// CertFile is the path of this party's certificate.
func (c *Config) CertFile() string { return c.certPath() }

// KeyFile is the path of this party's private key.
func (c *Config) KeyFile() string { return filepath.Join(c.dir, c.base+".key") }

// CRLFile is the path of the revocation list.
func (c *Config) CRLFile() string { return filepath.Join(c.dir, CRLFile) }

func (c *Config) certPath() string { return filepath.Join(c.dir, c.base+".crt") }

func (c *Config) readKeyPair() (*tls.Certificate, stamp, error) {
	st := stampOf(c.certPath())
	cert, err := tls.LoadX509KeyPair(c.certPath(), c.KeyFile())
	if err != nil {
		return nil, st, fmt.Errorf("load %s / %s: %w (issue one with `basalt cert issue --dir %s ...`)", c.certPath(), c.KeyFile(), err, c.dir)
	}
	return &cert, st, nil
}

func (c *Config) readCRL() (map[string]bool, error) {
	entries, err := ReadCRL(c.dir, c.cas)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.CRLFile(), err)
	}
	m := make(map[string]bool, len(entries))
	for _, e := range entries {
		m[e.SerialNumber.Text(16)] = true
	}
	return m, nil
}

// refresh re-reads the key pair and the CRL when their files changed, at
// most once per reloadEvery. A file that fails to load keeps the old
// version (and logs why): a half-copied file must not lock the cluster out.
func (c *Config) refresh() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if now.Sub(c.checked) < reloadEvery {
		return
	}
	c.checked = now
	if st := stampOf(c.certPath()); !st.same(c.certStamp) {
		cert, st, err := c.readKeyPair()
		if err == nil {
			var id Identity
			id, err = Parse(cert.Leaf)
			if err == nil && id != c.self {
				err = fmt.Errorf("new certificate names %s, not %s", id, c.self)
			}
		}
		if err != nil {
			slog.Warn("identity: keeping the old certificate", "file", c.certPath(), "err", err)
		} else {
			c.cert = cert
			slog.Info("identity: certificate reloaded", "file", c.certPath(), "serial", cert.Leaf.SerialNumber.Text(16), "not_after", cert.Leaf.NotAfter)
		}
		c.certStamp = st
	}
	if st := stampOf(c.CRLFile()); !st.same(c.crlStamp) {
		revoked, err := c.readCRL()
		if err != nil {
			slog.Warn("identity: keeping the old revocation list", "file", c.CRLFile(), "err", err)
		} else {
			c.revoked = revoked
			slog.Info("identity: revocation list reloaded", "file", c.CRLFile(), "revoked", len(revoked))
		}
		c.crlStamp = st
	}
}

func (c *Config) current() *tls.Certificate {
	c.refresh()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cert
}

func (c *Config) isRevoked(cert *x509.Certificate) bool {
	c.refresh()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.revoked[cert.SerialNumber.Text(16)]
}

func (c *Config) verifyChain(leaf *x509.Certificate, now time.Time) ([][]*x509.Certificate, error) {
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots:       c.roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUntrusted, err)
	}
	return chains, nil
}

// Verify checks a peer's certificates as presented in a handshake (leaf
// first) and returns its identity: chain to the CA at the current time,
// not revoked, this cluster, one of allow (any role if allow is empty).
func (c *Config) Verify(peer []*x509.Certificate, allow []Role) (Identity, error) {
	if len(peer) == 0 {
		return Identity{}, fmt.Errorf("%w: the peer sent no certificate", ErrUntrusted)
	}
	leaf := peer[0]
	// The CA signs leaves directly; intermediates the peer sends are ignored.
	if _, err := c.verifyChain(leaf, time.Now()); err != nil {
		return Identity{}, err
	}
	if c.isRevoked(leaf) {
		return Identity{}, fmt.Errorf("%w: serial %s", ErrRevoked, leaf.SerialNumber.Text(16))
	}
	id, err := Parse(leaf)
	if err != nil {
		return Identity{}, err
	}
	if id.Cluster != c.self.Cluster {
		return Identity{}, fmt.Errorf("%w: %s, this is %q", ErrWrongCluster, id, c.self.Cluster)
	}
	if len(allow) > 0 && !slices.Contains(allow, id.Role) {
		return Identity{}, fmt.Errorf("%w: %s (allowed: %v)", ErrRoleNotAllowed, id, allow)
	}
	return id, nil
}

// ServerTLS is a TLS 1.3 server configuration that requires a client
// certificate verified by Verify with the allowed roles (any if none).
func (c *Config) ServerTLS(allow ...Role) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		MaxVersion:     tls.VersionTLS13,
		ClientAuth:     tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.current(), nil },
		// VerifyConnection, unlike VerifyPeerCertificate, also runs on
		// resumed sessions, so a revoked peer cannot resume its way in.
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := c.Verify(cs.PeerCertificates, allow)
			return err
		},
	}
}

// ClientTLS is a TLS 1.3 client configuration that presents this party's
// certificate and accepts a server only if Verify passes with the allowed
// roles (any if none). Host names are not checked: the identity is.
func (c *Config) ClientTLS(allow ...Role) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		// The standard host-name check is replaced by Verify, which checks
		// the chain, the revocation list, the cluster and the role.
		InsecureSkipVerify:   true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.current(), nil },
		// VerifyConnection, unlike VerifyPeerCertificate, also runs on
		// resumed sessions, so a revoked peer cannot resume its way in.
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := c.Verify(cs.PeerCertificates, allow)
			return err
		},
	}
}

// PeerIdentity is the identity of the peer of a finished handshake made
// with ServerTLS or ClientTLS (which verified it).
func PeerIdentity(cs tls.ConnectionState) (Identity, error) {
	if len(cs.PeerCertificates) == 0 {
		return Identity{}, fmt.Errorf("%w: no peer certificate", ErrUntrusted)
	}
	return Parse(cs.PeerCertificates[0])
}

// ErrNoCert: LoadRole found no certificate of the role in the directory,
// or more than one and no base was given.
var ErrNoCert = errors.New("identity: no certificate for this role")

// LoadRole loads dir like Load, finding the certificate by role when base
// is "": <role>.crt if present, else the one <role>-*.crt in dir. The
// loaded certificate must be of that role.
func LoadRole(dir, base string, role Role) (*Config, error) {
	if base == "" {
		if _, err := os.Stat(filepath.Join(dir, string(role)+".crt")); err == nil {
			base = string(role)
		} else {
			m, _ := filepath.Glob(filepath.Join(dir, string(role)+"-*.crt"))
			switch len(m) {
			case 0:
				return nil, fmt.Errorf("%w: no %s.crt or %s-*.crt in %s (issue one: basalt cert issue --dir CA_DIR --role %s --name N --out %s)",
					ErrNoCert, role, role, dir, role, dir)
			case 1:
				base = strings.TrimSuffix(filepath.Base(m[0]), ".crt")
			default:
				return nil, fmt.Errorf("%w: %d %s certificates in %s; name one with --tls-cert", ErrNoCert, len(m), role, dir)
			}
		}
	}
	c, err := Load(dir, base)
	if err != nil {
		return nil, err
	}
	if c.self.Role != role {
		return nil, fmt.Errorf("%w: %s names %s, a %s is needed here", ErrRoleNotAllowed, c.certPath(), c.self, role)
	}
	return c, nil
}

// CheckRevoked refuses a certificate on the current revocation list. A
// handshake checks it once; servers of long-lived connections (gRPC) call
// it per request too, so a revocation also ends connections made before it.
func (c *Config) CheckRevoked(cert *x509.Certificate) error {
	if c.isRevoked(cert) {
		return fmt.Errorf("%w: serial %s", ErrRevoked, cert.SerialNumber.Text(16))
	}
	return nil
}
