package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// File names in a TLS directory (see the package doc).
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
	CRLFile    = "ca.crl"
)

// Default validity periods.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 365 * 24 * time.Hour
)

var (
	// ErrCAExists: InitCA found a CA key already in the directory.
	ErrCAExists = errors.New("identity: a CA already exists in this directory")
	// ErrNoCA: the directory has no CA (ca.crt, or ca.key where one is needed).
	ErrNoCA = errors.New("identity: no CA in this directory")
)

// CA is a cluster certificate authority: its certificate and signing key.
type CA struct {
	Cert    *x509.Certificate
	Cluster string
	key     crypto.Signer
	dir     string
}

// InitCA makes a new CA for cluster in dir (created if missing): ca.crt,
// ca.key (0600) and an empty ca.crl. It refuses to overwrite a CA.
func InitCA(dir, cluster string) (*CA, error) {
	if !validName(cluster) {
		return nil, fmt.Errorf("%w: cluster name %q (want 1..64 of A-Z a-z 0-9 . _ -)", ErrBadIdentity, cluster)
	}
	if _, err := os.Stat(filepath.Join(dir, CAKeyFile)); err == nil {
		return nil, fmt.Errorf("%w: %s", ErrCAExists, filepath.Join(dir, CAKeyFile))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"basalt"}, CommonName: "basalt CA " + cluster},
		URIs:                  []*urlT{{Scheme: Scheme, Host: cluster, Path: "/ca"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := marshalKey(key)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(dir, CACertFile), pemBlock("CERTIFICATE", der), 0o644); err != nil {
		return nil, err
	}
	ca := &CA{Cert: cert, Cluster: cluster, key: key, dir: dir}
	if err := ca.writeCRL(nil); err != nil {
		return nil, err
	}
	return ca, nil
}

// OpenCA loads the CA (certificate and key) from dir.
func OpenCA(dir string) (*CA, error) {
	certs, err := readCerts(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s is missing (the CA key is needed to issue or revoke)", ErrNoCA, filepath.Join(dir, CAKeyFile))
	} else if err != nil {
		return nil, err
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CAKeyFile), err)
	}
	// ca.crt may hold old CAs during a roll-over; the signing one matches ca.key.
	for _, c := range certs {
		if publicKeysEqual(c.PublicKey, key.Public()) {
			cluster, err := caCluster(c)
			if err != nil {
				return nil, err
			}
			return &CA{Cert: c, Cluster: cluster, key: key, dir: dir}, nil
		}
	}
	return nil, fmt.Errorf("%w: no certificate in %s matches %s", ErrNoCA, CACertFile, CAKeyFile)
}

// IssueOptions shape one certificate.
type IssueOptions struct {
	Hosts     []string  // extra DNS names or IP addresses, besides localhost
	NotBefore time.Time // zero: an hour ago (clock skew)
	NotAfter  time.Time // zero: NotBefore + LeafValidity
}

// Issued is a certificate the CA made, with its key.
type Issued struct {
	Identity Identity
	Cert     *x509.Certificate
	CertPEM  []byte
	KeyPEM   []byte
}

// Issue makes a certificate and key for role/name in this CA's cluster.
func (ca *CA) Issue(role Role, name string, opt IssueOptions) (*Issued, error) {
	id := Identity{Cluster: ca.Cluster, Role: role, Name: name}
	if err := id.Validate(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	nb := opt.NotBefore
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour)
	}
	na := opt.NotAfter
	if na.IsZero() {
		na = nb.Add(LeafValidity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"basalt " + ca.Cluster}, CommonName: string(role) + "/" + name},
		URIs:         []*urlT{id.URI()},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    nb,
		NotAfter:     na,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range opt.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := marshalKey(key)
	if err != nil {
		return nil, err
	}
	return &Issued{Identity: id, Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: keyPEM}, nil
}

// IssueFiles issues role/name and writes <base>.crt and <base>.key into
// dir (base defaults to Base(role, name)); it also copies ca.crt (and
// ca.crl) there when dir is not the CA's own directory. It returns the
// certificate path.
func (ca *CA) IssueFiles(dir, base string, role Role, name string, opt IssueOptions) (*Issued, string, error) {
	iss, err := ca.Issue(role, name, opt)
	if err != nil {
		return nil, "", err
	}
	if base == "" {
		base = Base(role, name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	if err := writeFileAtomic(filepath.Join(dir, base+".key"), iss.KeyPEM, 0o600); err != nil {
		return nil, "", err
	}
	crt := filepath.Join(dir, base+".crt")
	if err := writeFileAtomic(crt, iss.CertPEM, 0o644); err != nil {
		return nil, "", err
	}
	if !sameDir(dir, ca.dir) {
		for _, f := range []string{CACertFile, CRLFile} {
			b, err := os.ReadFile(filepath.Join(ca.dir, f))
			if errors.Is(err, os.ErrNotExist) {
				continue
			} else if err != nil {
				return nil, "", err
			}
			if err := writeFileAtomic(filepath.Join(dir, f), b, 0o644); err != nil {
				return nil, "", err
			}
		}
	}
	return iss, crt, nil
}

// Revoke adds serial to the CA's revocation list (ca.crl, re-signed). It
// is idempotent.
func (ca *CA) Revoke(serial *big.Int) error {
	list, err := ReadCRL(ca.dir, []*x509.Certificate{ca.Cert})
	if err != nil {
		return err
	}
	for _, e := range list {
		if e.SerialNumber.Cmp(serial) == 0 {
			return nil
		}
	}
	list = append(list, x509.RevocationListEntry{SerialNumber: serial, RevocationTime: time.Now().UTC()})
	return ca.writeCRL(list)
}

// Revoked lists the serials in the CA's revocation list.
func (ca *CA) Revoked() ([]x509.RevocationListEntry, error) {
	return ReadCRL(ca.dir, []*x509.Certificate{ca.Cert})
}

func (ca *CA) writeCRL(entries []x509.RevocationListEntry) error {
	number, err := randomSerial()
	if err != nil {
		return err
	}
	now := time.Now()
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number:                    number,
		ThisUpdate:                now.Add(-time.Hour),
		NextUpdate:                now.Add(CAValidity),
		RevokedCertificateEntries: entries,
	}, ca.Cert, ca.key)
	if err != nil {
		return err
	}
	// DER, as etcd's --client-crl-file and openssl crl -inform DER read it.
	return writeFileAtomic(filepath.Join(ca.dir, CRLFile), der, 0o644)
}

// ReadCRL reads dir/ca.crl and checks it is signed by one of cas. A missing
// file is an empty list.
func ReadCRL(dir string, cas []*x509.Certificate) ([]x509.RevocationListEntry, error) {
	b, err := os.ReadFile(filepath.Join(dir, CRLFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return parseCRL(b, cas)
}

func parseCRL(b []byte, cas []*x509.Certificate) ([]x509.RevocationListEntry, error) {
	der := b
	if blk, _ := pem.Decode(b); blk != nil {
		der = blk.Bytes
	}
	crl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CRLFile, err)
	}
	for _, ca := range cas {
		if crl.CheckSignatureFrom(ca) == nil {
			return crl.RevokedCertificateEntries, nil
		}
	}
	return nil, fmt.Errorf("%s: not signed by the cluster CA", CRLFile)
}

// caCluster reads the cluster name from a CA certificate's basalt://cluster/ca URI.
func caCluster(c *x509.Certificate) (string, error) {
	for _, u := range c.URIs {
		if u.Scheme == Scheme && u.Path == "/ca" && validName(u.Host) {
			return u.Host, nil
		}
	}
	return "", fmt.Errorf("%w: CA certificate %q names no basalt cluster", ErrNoCA, c.Subject.CommonName)
}

// Need names a certificate EnsureCerts should make.
type Need struct {
	Role Role
	Name string
}

// EnsureCerts makes a CA for cluster in dir unless one is there, and
// issues into dir each needed certificate whose <base>.crt is missing. It
// is how a single-machine setup (the playground, test clusters) gets a
// whole cluster's identities in one directory; a real deployment keeps
// the CA key elsewhere and gives each node only its own certificate.
func EnsureCerts(dir, cluster string, need []Need) error {
	ca, err := OpenCA(dir)
	if errors.Is(err, ErrNoCA) {
		ca, err = InitCA(dir, cluster)
	}
	if err != nil {
		return err
	}
	for _, n := range need {
		if _, err := os.Stat(filepath.Join(dir, Base(n.Role, n.Name)+".crt")); err == nil {
			continue
		}
		if _, _, err := ca.IssueFiles(dir, "", n.Role, n.Name, IssueOptions{}); err != nil {
			return err
		}
	}
	return nil
}
