package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/identity"
)

// certCommand is `basalt cert`: the cluster CA (internal/identity).
func certCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Make the cluster CA, issue and revoke certificates (docs/security.md)",
	}

	dirFlag := func(c *cobra.Command) *string {
		return c.Flags().String("dir", os.Getenv("BASALT_CA_DIR"), "the CA directory: ca.crt, ca.key, ca.crl (env BASALT_CA_DIR)")
	}
	needDir := func(d string) error {
		if d == "" {
			return errors.New("--dir is required: the directory holding the CA (ca.crt, ca.key)")
		}
		return nil
	}

	initCmd := &cobra.Command{Use: "init", Short: "Make a new cluster CA in --dir", Args: cobra.NoArgs}
	initDir := dirFlag(initCmd)
	cluster := initCmd.Flags().String("cluster", "", "cluster name, part of every identity (required)")
	initCmd.RunE = func(*cobra.Command, []string) error {
		if err := needDir(*initDir); err != nil {
			return err
		}
		if *cluster == "" {
			return errors.New("--cluster is required: a short name for this cluster, e.g. --cluster prod")
		}
		ca, err := identity.InitCA(*initDir, *cluster)
		if err != nil {
			return err
		}
		fmt.Printf("made the CA of cluster %q in %s\n", ca.Cluster, *initDir)
		fmt.Printf("  %s  (give to every node)\n  %s  (keep secret; needed only to issue and revoke)\n",
			filepath.Join(*initDir, identity.CACertFile), filepath.Join(*initDir, identity.CAKeyFile))
		fmt.Printf("next: basalt cert issue --dir %s --role admin\n", *initDir)
		return nil
	}

	issue := &cobra.Command{Use: "issue", Short: "Issue a certificate for a role and name", Args: cobra.NoArgs}
	issueDir := dirFlag(issue)
	role := issue.Flags().String("role", "", "role: mds, chunkserver, client, access, admin, etcd (required)")
	name := issue.Flags().String("name", "", "name: a chunkserver's id; any short name otherwise (default: the role, for mds, admin and etcd)")
	out := issue.Flags().String("out", "", "directory to write <base>.crt/.key (and a copy of ca.crt, ca.crl) into (default: --dir)")
	hosts := issue.Flags().String("host", "", "extra host names or IP addresses the certificate names, comma-separated")
	days := issue.Flags().Int("days", int(identity.LeafValidity/(24*time.Hour)), "days the certificate is valid")
	gnutls := issue.Flags().String("gnutls-dir", "", "also lay the certificate out in this directory as "+identity.GnuTLSCAFile+", "+
		identity.GnuTLSCertFile+", "+identity.GnuTLSKeyFile+": for nbds:// URIs (tls-certificates=DIR: nbdinfo, nbdcopy, fio) and qemu's tls-creds-x509 dir=DIR,endpoint=client")
	issue.RunE = func(*cobra.Command, []string) error {
		if err := needDir(*issueDir); err != nil {
			return err
		}
		r, err := identity.ParseRole(*role)
		if err != nil {
			return fmt.Errorf("--role: %w", err)
		}
		n := *name
		if n == "" {
			switch r {
			case identity.RoleMDS, identity.RoleAdmin, identity.RoleEtcd:
				n = string(r)
			case identity.RoleChunkserver:
				return errors.New("--name is required: a chunkserver's certificate names its id, e.g. --name 3")
			default:
				return fmt.Errorf("--name is required for role %s", r)
			}
		}
		if *days <= 0 {
			return errors.New("--days must be positive")
		}
		ca, err := identity.OpenCA(*issueDir)
		if err != nil {
			return err
		}
		dst := *out
		if dst == "" {
			dst = *issueDir
		}
		nb := time.Now().Add(-time.Hour)
		iss, crt, err := ca.IssueFiles(dst, "", r, n, identity.IssueOptions{
			Hosts: splitList(*hosts), NotBefore: nb, NotAfter: nb.Add(time.Duration(*days) * 24 * time.Hour),
		})
		if err != nil {
			return err
		}
		fmt.Printf("issued %s serial %s valid until %s\n  %s\n  %s\n", iss.Identity, iss.Cert.SerialNumber.Text(16),
			iss.Cert.NotAfter.UTC().Format(time.RFC3339), crt, strings.TrimSuffix(crt, ".crt")+".key")
		if *gnutls != "" {
			if err := identity.WriteGnuTLSClientDir(dst, iss.Identity.Base(), *gnutls); err != nil {
				return fmt.Errorf("--gnutls-dir: %w", err)
			}
			fmt.Printf("  %s (for nbds://...?tls-certificates=%s)\n", *gnutls, *gnutls)
		}
		return nil
	}

	revoke := &cobra.Command{Use: "revoke", Short: "Revoke a certificate (by serial or file); servers refuse it within a second of seeing the new ca.crl", Args: cobra.NoArgs}
	revokeDir := dirFlag(revoke)
	serial := revoke.Flags().String("serial", "", "serial number to revoke, hex as `basalt cert ls` shows it")
	certPath := revoke.Flags().String("cert", "", "certificate file to revoke")
	revoke.RunE = func(*cobra.Command, []string) error {
		if err := needDir(*revokeDir); err != nil {
			return err
		}
		if (*serial == "") == (*certPath == "") {
			return errors.New("give exactly one of --serial or --cert")
		}
		ca, err := identity.OpenCA(*revokeDir)
		if err != nil {
			return err
		}
		var sn *big.Int
		what := ""
		if *certPath != "" {
			c, err := identity.ReadCert(*certPath)
			if err != nil {
				return fmt.Errorf("--cert: %w", err)
			}
			if err := c.CheckSignatureFrom(ca.Cert); err != nil {
				return fmt.Errorf("--cert: %s was not issued by this CA", *certPath)
			}
			sn = c.SerialNumber
			if id, err := identity.Parse(c); err == nil {
				what = " (" + id.String() + ")"
			}
		} else {
			var ok bool
			if sn, ok = new(big.Int).SetString(strings.TrimPrefix(strings.ToLower(*serial), "0x"), 16); !ok {
				return fmt.Errorf("--serial: %q is not a hex serial number", *serial)
			}
		}
		if err := ca.Revoke(sn); err != nil {
			return err
		}
		fmt.Printf("revoked serial %s%s\nupdated %s: copy it to every node's TLS directory (servers re-read it within a second)\n",
			sn.Text(16), what, filepath.Join(*revokeDir, identity.CRLFile))
		return nil
	}

	ls := &cobra.Command{Use: "ls", Short: "List the certificates in --dir and the revoked serials", Args: cobra.NoArgs}
	lsDir := dirFlag(ls)
	ls.RunE = func(*cobra.Command, []string) error {
		if err := needDir(*lsDir); err != nil {
			return err
		}
		return listCerts(*lsDir)
	}

	cmd.AddCommand(initCmd, issue, revoke, ls)
	return cmd
}

// listCerts prints each *.crt of dir with its identity and state, then
// every revoked serial.
func listCerts(dir string) error {
	ca, err := identity.ReadCert(filepath.Join(dir, identity.CACertFile))
	if err != nil {
		return err
	}
	revoked, err := identity.ReadCRL(dir, []*x509.Certificate{ca})
	if err != nil {
		return err
	}
	isRevoked := map[string]bool{}
	for _, e := range revoked {
		isRevoked[e.SerialNumber.Text(16)] = true
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tIDENTITY\tSERIAL\tNOT AFTER\tSTATE")
	now := time.Now()
	for _, f := range files {
		c, err := identity.ReadCert(f)
		if err != nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\tunreadable: %v\n", filepath.Base(f), err)
			continue
		}
		who := "CA " + c.Subject.CommonName
		if id, err := identity.Parse(c); err == nil {
			who = id.String()
		}
		state := "ok"
		switch {
		case isRevoked[c.SerialNumber.Text(16)]:
			state = "revoked"
		case now.After(c.NotAfter):
			state = "expired"
		case now.Before(c.NotBefore):
			state = "not yet valid"
		case !c.IsCA && c.CheckSignatureFrom(ca) != nil:
			state = "not issued by this ca.crt"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", filepath.Base(f), who, c.SerialNumber.Text(16), c.NotAfter.UTC().Format(time.RFC3339), state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(revoked) > 0 {
		fmt.Println("\nrevoked serials:")
		for _, e := range revoked {
			fmt.Printf("  %s  %s\n", e.SerialNumber.Text(16), e.RevocationTime.UTC().Format(time.RFC3339))
		}
	}
	return nil
}
