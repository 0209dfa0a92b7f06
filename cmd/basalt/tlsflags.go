package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/identity"
)

// playgroundTLSDir is where `basalt playground` (default --dir) keeps its
// CA and certificates; operator commands use it when nothing else is given.
var playgroundTLSDir = filepath.Join("basalt-data", "tls")

// tlsFlags are --tls-dir, --tls-cert and --insecure: the identity a
// command connects (or serves) with. docs/security.md.
type tlsFlags struct {
	role     identity.Role
	also     []identity.Role // roles accepted when no certificate of role is in the directory
	dir      *string
	cert     *string
	insecure *bool
	operator bool // default to the playground's directory
}

func addTLSFlags(cmd *cobra.Command, role identity.Role, also ...identity.Role) *tlsFlags {
	f := &tlsFlags{role: role, also: also}
	f.dir = cmd.Flags().String("tls-dir", os.Getenv("BASALT_TLS_DIR"),
		fmt.Sprintf("directory with ca.crt, ca.crl and this %s's certificate and key (env BASALT_TLS_DIR)", role))
	f.cert = cmd.Flags().String("tls-cert", "",
		fmt.Sprintf("base name of the certificate in --tls-dir (default: %s.crt, or the one %s-*.crt)", role, role))
	f.insecure = cmd.Flags().Bool("insecure", false,
		"no TLS, no authentication: for tests only (docs/security.md); the other side must be --insecure too")
	return f
}

// addOperatorTLSFlags is addTLSFlags for admin commands: without --tls-dir
// they use the playground's directory, if there is one here.
func addOperatorTLSFlags(cmd *cobra.Command) *tlsFlags {
	f := addTLSFlags(cmd, identity.RoleAdmin)
	f.operator = true
	return f
}

// errNoTLS says how to get certificates.
var errNoTLS = errors.New("no --tls-dir: basalt connections are mutually authenticated. " +
	"Make a CA and certificates: `basalt cert init --dir ca --cluster NAME` then " +
	"`basalt cert issue --dir ca --role ROLE --name N --out DIR` and pass --tls-dir DIR " +
	"(`basalt playground` makes its own in basalt-data/tls); --insecure only for tests")

// load returns the identity, or nil with --insecure.
func (f *tlsFlags) load() (*identity.Config, error) {
	if *f.insecure {
		if *f.dir != "" && os.Getenv("BASALT_TLS_DIR") != *f.dir {
			return nil, errors.New("--insecure and --tls-dir exclude each other")
		}
		return nil, nil
	}
	dir := *f.dir
	if dir == "" && f.operator {
		if _, err := os.Stat(filepath.Join(playgroundTLSDir, identity.Base(f.role, string(f.role))+".crt")); err == nil {
			dir = playgroundTLSDir
		}
	}
	if dir == "" {
		return nil, errNoTLS
	}
	c, err := identity.LoadRole(dir, *f.cert, f.role)
	if errors.Is(err, identity.ErrNoCert) && *f.cert == "" {
		for _, r := range f.also {
			if c2, err2 := identity.LoadRole(dir, "", r); err2 == nil {
				return c2, nil
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--tls-dir: %w", err)
	}
	return c, nil
}

// mdsTLS is the TLS configuration for dialing the MDS (nil with --insecure).
func (f *tlsFlags) mdsTLS() (*tls.Config, error) {
	c, err := f.load()
	if err != nil || c == nil {
		return nil, err
	}
	return c.ClientTLS(identity.RoleMDS), nil
}
