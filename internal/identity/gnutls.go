package identity

import (
	"fmt"
	"os"
	"path/filepath"
)

// File names of a client's credentials in a GnuTLS-style directory: libnbd
// reads them from tls-certificates=DIR (nbds:// URIs for nbdinfo, nbdcopy,
// nbdfuse and fio's nbd engine) and qemu from
// --object tls-creds-x509,dir=DIR,endpoint=client.
const (
	GnuTLSCAFile   = "ca-cert.pem"
	GnuTLSCertFile = "client-cert.pem"
	GnuTLSKeyFile  = "client-key.pem"
)

// WriteGnuTLSClientDir copies the CA certificate(s) and the certificate
// <base> of dir into out under the GnuTLS names (the key with mode 0600),
// creating out (0700) if needed.
func WriteGnuTLSClientDir(dir, base, out string) error {
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		from, to string
		mode     os.FileMode
	}{
		{CACertFile, GnuTLSCAFile, 0o644},
		{base + ".crt", GnuTLSCertFile, 0o644},
		{base + ".key", GnuTLSKeyFile, 0o600},
	} {
		b, err := os.ReadFile(filepath.Join(dir, f.from))
		if err != nil {
			return fmt.Errorf("identity: GnuTLS client directory: %w", err)
		}
		if err := writeFileAtomic(filepath.Join(out, f.to), b, f.mode); err != nil {
			return err
		}
	}
	return nil
}
