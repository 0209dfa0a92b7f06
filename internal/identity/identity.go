package identity

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Role is what a certificate holder may do in the cluster.
type Role string

// The roles.
const (
	RoleMDS         Role = "mds"         // a metadata service
	RoleChunkserver Role = "chunkserver" // a chunkserver; its name is its id
	RoleClient      Role = "client"      // a library client (opens sessions, does IO)
	RoleAccess      Role = "access"      // an NBD/iSCSI/NVMe-oF front end (a client that serves others)
	RoleAdmin       Role = "admin"       // an operator: pools, volumes, status
	RoleEtcd        Role = "etcd"        // an etcd server the MDS uses
)

// Roles lists every role, in the order `basalt cert` documents them.
var Roles = []Role{RoleMDS, RoleChunkserver, RoleClient, RoleAccess, RoleAdmin, RoleEtcd}

// Scheme is the URI scheme of an identity SAN.
const Scheme = "basalt"

var (
	// ErrNoIdentity: the certificate has no basalt:// URI SAN (or more than one).
	ErrNoIdentity = errors.New("identity: certificate has no basalt identity")
	// ErrBadIdentity: a basalt:// URI SAN that is malformed (unknown role, bad name).
	ErrBadIdentity = errors.New("identity: malformed basalt identity")
	// ErrWrongCluster: the peer belongs to another cluster.
	ErrWrongCluster = errors.New("identity: certificate is for another cluster")
	// ErrRoleNotAllowed: the peer's role may not make this connection.
	ErrRoleNotAllowed = errors.New("identity: role not allowed here")
	// ErrRevoked: the peer's certificate serial is on the CA's revocation list.
	ErrRevoked = errors.New("identity: certificate revoked")
	// ErrUntrusted: the peer's chain does not verify to the cluster CA (wrong CA, expired, not yet valid).
	ErrUntrusted = errors.New("identity: certificate not trusted")
)

// Identity is who a certificate names.
type Identity struct {
	Cluster string
	Role    Role
	Name    string
}

// URI is the identity as its SAN: basalt://cluster/role/name.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: Scheme, Host: id.Cluster, Path: "/" + string(id.Role) + "/" + id.Name}
}

func (id Identity) String() string { return id.URI().String() }

// ChunkserverID is the id a chunkserver identity names; ok is false for any
// other role.
func (id Identity) ChunkserverID() (uint64, bool) {
	if id.Role != RoleChunkserver {
		return 0, false
	}
	n, err := strconv.ParseUint(id.Name, 10, 64)
	return n, err == nil && n > 0
}

// Validate checks the cluster, role and name.
func (id Identity) Validate() error {
	if !validName(id.Cluster) {
		return fmt.Errorf("%w: cluster name %q (want 1..64 of A-Z a-z 0-9 . _ -)", ErrBadIdentity, id.Cluster)
	}
	if !knownRole(id.Role) {
		return fmt.Errorf("%w: role %q (want one of %s)", ErrBadIdentity, id.Role, roleList())
	}
	if !validName(id.Name) {
		return fmt.Errorf("%w: name %q (want 1..64 of A-Z a-z 0-9 . _ -)", ErrBadIdentity, id.Name)
	}
	if id.Role == RoleChunkserver {
		if _, ok := id.ChunkserverID(); !ok {
			return fmt.Errorf("%w: a chunkserver's name is its id, a number > 0, not %q", ErrBadIdentity, id.Name)
		}
	}
	return nil
}

// Base is the file base name of the identity's certificate and key in a
// TLS directory: the role when the name equals it, else role-name.
func (id Identity) Base() string { return Base(id.Role, id.Name) }

// Base is the file base name for role and name (see Identity.Base).
func Base(role Role, name string) string {
	if name == string(role) {
		return string(role)
	}
	return string(role) + "-" + name
}

// Parse returns the identity a certificate carries in its basalt:// URI SAN.
func Parse(cert *x509.Certificate) (Identity, error) {
	var found *url.URL
	for _, u := range cert.URIs {
		if u.Scheme != Scheme {
			continue
		}
		if found != nil {
			return Identity{}, fmt.Errorf("%w: more than one basalt URI", ErrBadIdentity)
		}
		found = u
	}
	if found == nil {
		return Identity{}, ErrNoIdentity
	}
	return parseURI(found)
}

func parseURI(u *url.URL) (Identity, error) {
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 2 || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return Identity{}, fmt.Errorf("%w: %q is not basalt://cluster/role/name", ErrBadIdentity, u)
	}
	id := Identity{Cluster: u.Host, Role: Role(parts[0]), Name: parts[1]}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// ParseRole reads a role name as given on a command line.
func ParseRole(s string) (Role, error) {
	if r := Role(s); knownRole(r) {
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q (want one of %s)", s, roleList())
}

func knownRole(r Role) bool {
	for _, k := range Roles {
		if k == r {
			return true
		}
	}
	return false
}

func roleList() string {
	s := make([]string, len(Roles))
	for i, r := range Roles {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
