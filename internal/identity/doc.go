// Package identity is basalt's cluster identity (docs/security.md): a
// cluster certificate authority, the certificates it issues, the revocation
// list it signs, and the mutually verified TLS 1.3 configurations every
// basalt connection is made with.
//
// # Identities
//
// Every daemon, access node, client and operator holds an x509 certificate
// issued by the cluster CA. Who it is lives in one URI SAN:
//
//	basalt://<cluster>/<role>/<name>
//
// role is one of mds, chunkserver, client, access (an NBD/iSCSI/NVMe-oF
// front end), admin and etcd; for a chunkserver, name is its decimal id
// (basalt://prod/chunkserver/7), so the control plane can check that a
// chunkserver speaks only for itself. Names are 1..64 characters of
// [A-Za-z0-9._-]. Parse turns a certificate into an Identity; a
// certificate without exactly one basalt URI SAN has no identity.
//
// Each leaf certificate is good for both ends of a connection (server and
// client auth) and also names localhost, 127.0.0.1 and ::1 plus any hosts
// given at issue time, so tools that check host names (etcd dialling its
// own gateway, curl) accept it. basalt itself never relies on host names:
// it verifies the chain to the cluster CA, the validity period, the
// revocation list, the cluster name and the peer's role.
//
// # A TLS directory
//
// A directory holds what one party needs, by file name:
//
//	ca.crt         the cluster CA certificate(s), PEM; more than one while the CA is rolled over
//	ca.key         the CA private key, PEM (only where certificates are issued; keep it offline)
//	ca.crl         the CA-signed revocation list (x509 CRL, DER; PEM is read too); absent: nothing revoked
//	<base>.crt     a leaf certificate, PEM
//	<base>.key     its private key, PEM, mode 0600
//
// <base> is the role for a certificate whose name equals its role
// (admin.crt for basalt://c/admin/admin) and <role>-<name> otherwise
// (chunkserver-3.crt, client-web1.crt); see Base.
//
// # Verification
//
// Config.ServerTLS and Config.ClientTLS build *tls.Config values with TLS
// 1.3 as the only version and a VerifyConnection (run on resumed sessions
// too) that (1) verifies the
// peer's chain to the CA pool at the current time, (2) refuses a serial in
// the CA's revocation list, (3) parses the identity and refuses another
// cluster's, (4) refuses a role not in the allowed set. Servers require a
// client certificate. The leaf key pair and ca.crl are re-read when their
// files change (checked at most once a second), so a renewed certificate
// or a new revocation takes effect without a restart; ca.crt is read once.
package identity
