package mds

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/basalt-storage/basalt/internal/identity"
)

// Roles that may read the topology, pools and volumes.
var readers = []identity.Role{identity.RoleChunkserver, identity.RoleClient, identity.RoleAccess, identity.RoleAdmin}

// Roles that open, renew and close volume sessions (each only its own). A
// chunkserver may: it can host an NBD front end in process (--nbd-socket),
// and it holds the data of its replicas anyway.
var sessionRoles = []identity.Role{identity.RoleClient, identity.RoleAccess, identity.RoleAdmin, identity.RoleChunkserver}

var admin = []identity.Role{identity.RoleAdmin}

// rpcRoles is the one authorization table of the MDS API: each RPC and the
// roles that may call it. An RPC that is not here is refused, whoever
// calls (TestEveryRPCHasARule keeps the table complete). Handlers add the
// checks that depend on the request:
//   - RegisterChunkServer and Heartbeat: only for the id the chunkserver's
//     certificate names (checkChunkserver);
//   - RenewSession: only the identity that opened the session;
//     CloseSession: that identity or an admin (checkSessionOwner);
//   - OpenVolume: at most MaxSessionsPerClient open sessions per identity.
var rpcRoles = map[string][]identity.Role{
	"RegisterChunkServer": {identity.RoleChunkserver},
	"Heartbeat":           {identity.RoleChunkserver},
	"ListChunkServers":    readers,
	"GetCopysets":         readers,
	"ListPools":           readers,
	"GetVolume":           readers,
	"ListVolumes":         readers,
	"CreatePool":          admin,
	"CreateVolume":        admin,
	"ResizeVolume":        admin,
	"DeleteVolume":        admin,
	"SetVolumeMeta":       admin,
	"SetVolumeHost":       admin,
	"OpenVolume":          sessionRoles,
	"RenewSession":        sessionRoles,
	"CloseSession":        sessionRoles,
	"ClusterStatus":       admin,
	"RegisterAccessNode":  {identity.RoleAccess}, // an address another identity registered is refused
	"AccessNodeHeartbeat": {identity.RoleAccess}, // only as the node its identity registered
	"SetNVMfSubsystem":    admin,
	"ListANA":             {identity.RoleAccess, identity.RoleAdmin},
	// Persistent reservations: the front ends serve them (`basalt iscsi`
	// and `basalt nvmf` may run with a client certificate; a client may
	// write the volumes anyway); an admin may read and clear them.
	"GetReservation":   {identity.RoleClient, identity.RoleAccess, identity.RoleAdmin},
	"ApplyReservation": {identity.RoleClient, identity.RoleAccess, identity.RoleAdmin},
	// iSCSI target CHAP: set by an admin; read, secrets included, by the
	// access nodes that check logins (`basalt iscsi` may run with a client
	// certificate, which may read and write every volume's data anyway, so
	// the secret lends it nothing it lacks).
	"SetTargetCHAP": admin,
	"GetTargetCHAP": {identity.RoleClient, identity.RoleAccess, identity.RoleAdmin},
	// The CSI driver: its node plugin registers its node; its controller
	// (an admin, since it also creates and deletes volumes) attaches.
	"RegisterNode": {identity.RoleAccess, identity.RoleAdmin},
	"AttachVolume": admin,
	"DetachVolume": admin,
}

type callerKey struct{}

// caller is the verified identity of the RPC's peer; ok is false on an
// Insecure MDS, where nothing is checked.
func caller(ctx context.Context) (identity.Identity, bool) {
	id, ok := ctx.Value(callerKey{}).(identity.Identity)
	return id, ok
}

// authorize is the first interceptor: it finds the peer's identity (the
// TLS handshake verified it: chain, revocation, cluster) and refuses the
// call unless rpcRoles lets that role make it.
func (s *Server) authorize(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if s.cfg.Insecure {
		return h(ctx, req)
	}
	method := methodName(info.FullMethod)
	id, err := s.peerIdentity(ctx)
	if err != nil {
		s.m.rpcs.WithLabelValues(method, "Unauthenticated").Inc()
		return nil, toStatus(err)
	}
	roles, ok := rpcRoles[method]
	if !ok || !slices.Contains(roles, id.Role) {
		s.m.rpcs.WithLabelValues(method, "PermissionDenied").Inc()
		s.log.Warn("RPC refused", "method", method, "caller", id.String())
		if !ok {
			return nil, toStatus(fmt.Errorf("%w: %s has no authorization rule", ErrPermissionDenied, method))
		}
		return nil, toStatus(fmt.Errorf("%w: %s may not call %s (allowed: %v)", ErrPermissionDenied, id, method, roles))
	}
	return h(context.WithValue(ctx, callerKey{}, id), req)
}

// peerIdentity is the verified identity of the connection's peer. The
// handshake checked the revocation list; a gRPC connection lives long, so
// it is checked again on every call.
func (s *Server) peerIdentity(ctx context.Context) (identity.Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return identity.Identity{}, fmt.Errorf("%w: no peer", ErrUnauthenticated)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return identity.Identity{}, fmt.Errorf("%w: not a TLS connection with a client certificate", ErrUnauthenticated)
	}
	if err := s.cfg.TLS.CheckRevoked(ti.State.PeerCertificates[0]); err != nil {
		return identity.Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	id, err := identity.PeerIdentity(ti.State)
	if err != nil {
		return identity.Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	return id, nil
}

// checkChunkserver refuses a chunkserver that speaks for another id. It
// returns the id the caller's certificate names (0 on an Insecure MDS).
func checkChunkserver(ctx context.Context, reqID uint64, what string) (uint64, error) {
	id, ok := caller(ctx)
	if !ok {
		return 0, nil
	}
	cs, ok := id.ChunkserverID()
	if !ok {
		return 0, fmt.Errorf("%w: %s is not a chunkserver", ErrPermissionDenied, id)
	}
	if reqID != 0 && reqID != cs {
		return 0, fmt.Errorf("%w: %s may not %s as chunkserver %d", ErrPermissionDenied, id, what, reqID)
	}
	return cs, nil
}

// sessionOwner is who a new session belongs to ("" on an Insecure MDS).
func sessionOwner(ctx context.Context) string {
	if id, ok := caller(ctx); ok {
		return id.String()
	}
	return ""
}

// checkSessionOwner refuses a caller that is not the session's owner
// (an admin may too, when adminToo).
func checkSessionOwner(ctx context.Context, sess sessionRecord, what string, adminToo bool) error {
	id, ok := caller(ctx)
	if !ok || id.String() == sess.Owner || adminToo && id.Role == identity.RoleAdmin {
		return nil
	}
	return fmt.Errorf("%w: %s may not %s session %d: it belongs to another identity", ErrPermissionDenied, id, what, sess.ID)
}

// checkAccessNodeOwner refuses a caller other than the identity that
// registered the access node (a node registered on an Insecure MDS has no
// owner and is taken over by the first identity that registers it).
func checkAccessNodeOwner(ctx context.Context, rec accessNodeRecord) error {
	id, ok := caller(ctx)
	if !ok || rec.Owner == "" || id.String() == rec.Owner {
		return nil
	}
	return fmt.Errorf("%w: %s may not speak for access node %d (%s): another identity registered it", ErrPermissionDenied, id, rec.ID, rec.Addr)
}

func methodName(full string) string {
	for i := len(full) - 1; i >= 0; i-- {
		if full[i] == '/' {
			return full[i+1:]
		}
	}
	return full
}
