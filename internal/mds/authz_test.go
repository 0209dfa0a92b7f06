package mds

import (
	"context"
	"crypto/tls"
	"errors"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// TestEveryRPCHasARule: an RPC added to the API without a line in rpcRoles
// would be refused to everyone; this names it at once. A rule for an RPC
// that does not exist is a typo.
func TestEveryRPCHasARule(t *testing.T) {
	methods := map[string]bool{}
	for _, m := range api.MDS_ServiceDesc.Methods {
		methods[m.MethodName] = true
		if _, ok := rpcRoles[m.MethodName]; !ok {
			t.Errorf("RPC %s has no authorization rule in rpcRoles (authz.go)", m.MethodName)
		}
	}
	for name := range rpcRoles {
		if !methods[name] {
			t.Errorf("rpcRoles names %s, which is not an RPC of the MDS service", name)
		}
	}
}

func TestNewRefusesToStartWithoutTLS(t *testing.T) {
	_, err := New(Config{Listen: "127.0.0.1:0", DataDir: t.TempDir()})
	if !errors.Is(err, ErrNoTLS) {
		t.Fatalf("New without TLS = %v, want ErrNoTLS", err)
	}
	ca, err := identity.InitCA(t.TempDir(), "c")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := ca.IssueFiles(dir, "", identity.RoleClient, "x", identity.IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	id, err := identity.Load(dir, "client-x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), TLS: id}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("New with a client certificate = %v, want ErrInvalidArgument", err)
	}
}

// secured is an MDS with TLS whose certificates all live in one
// directory with the CA, so a revocation reaches it at once.
type secured struct {
	t    *testing.T
	ca   *identity.CA
	dir  string
	addr string
}

func startSecured(t *testing.T, cfg Config) *secured {
	t.Helper()
	if testing.Short() {
		t.Skip("starts an MDS with etcd; skipped with -short")
	}
	dir := t.TempDir()
	ca, err := identity.InitCA(dir, "sec")
	if err != nil {
		t.Fatal(err)
	}
	x := &secured{t: t, ca: ca, dir: dir}
	cfg.TLS = x.id(identity.RoleMDS, "mds")
	r := startMDS(t, cfg)
	t.Cleanup(func() { r.stop(t) })
	waitActive(t, r, 60*time.Second)
	x.addr = r.s.Addr()
	return x
}

func (x *secured) id(role identity.Role, name string) *identity.Config {
	x.t.Helper()
	if err := identity.EnsureCerts(x.dir, "sec", []identity.Need{{Role: role, Name: name}}); err != nil {
		x.t.Fatal(err)
	}
	id, err := identity.Load(x.dir, identity.Base(role, name))
	if err != nil {
		x.t.Fatal(err)
	}
	return id
}

// as dials the MDS as role/name.
func (x *secured) as(role identity.Role, name string) *mdsclient.Client {
	x.t.Helper()
	c, err := mdsclient.Dial([]string{x.addr}, x.id(role, name).ClientTLS(identity.RoleMDS))
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() { c.Close() })
	return c
}

// raw dials the MDS once, without mdsclient's retries.
func (x *secured) raw(creds credentials.TransportCredentials) api.MDSClient {
	x.t.Helper()
	cc, err := grpc.NewClient(x.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() { cc.Close() })
	return api.NewMDSClient(cc)
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestControlPlaneAuthorization(t *testing.T) {
	x := startSecured(t, Config{MaxSessionsPerClient: 3})
	ctx := ctxT(t)

	// Without a certificate there is no connection at all.
	_, err := x.raw(insecure.NewCredentials()).ListPools(shortCtx(t), &api.ListPoolsRequest{})
	if err == nil {
		t.Fatal("a plaintext client was served")
	}
	noCert := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})
	if _, err := x.raw(noCert).ListPools(shortCtx(t), &api.ListPoolsRequest{}); err == nil {
		t.Fatal("a TLS client without a certificate was served")
	}

	// Chunkservers register as the id their certificate names, and only so.
	cs := map[int]*mdsclient.Client{}
	for i := 1; i <= 3; i++ {
		cs[i] = x.as(identity.RoleChunkserver, strconv.Itoa(i))
	}
	if _, err := cs[2].RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Id: 1, Zone: "z2", Addr: "evil:1"}); err == nil {
		t.Fatal("chunkserver 2 registered as chunkserver 1")
	} else {
		wantCode(t, "chunkserver 2 registering as 1", err, codes.PermissionDenied)
	}
	for i := 1; i <= 3; i++ {
		z := "z" + strconv.Itoa(i)
		r, err := cs[i].RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Zone: z, Server: "h" + z, Addr: "cs" + z + ":1", DataDir: "/d" + z})
		if err != nil {
			t.Fatalf("chunkserver %d registers: %v", i, err)
		}
		if r.Id != uint64(i) {
			t.Fatalf("chunkserver %d got id %d, not the one its certificate names", i, r.Id)
		}
	}
	// A new data directory under an id in use is refused: it would be a member without the data.
	_, err = cs[1].RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Zone: "z1", Server: "hz1", Addr: "csz1:1", DataDir: "/other"})
	wantCode(t, "a second data directory for id 1", err, codes.AlreadyExists)
	// Re-registering its own id (a restart) is fine.
	if _, err := cs[1].RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Id: 1, Zone: "z1", Server: "hz1", Addr: "csz1:1", DataDir: "/dz1"}); err != nil {
		t.Fatalf("chunkserver 1 re-registers: %v", err)
	}
	_, err = cs[2].RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Id: 1, Zone: "z1", Addr: "evil:1"})
	wantCode(t, "chunkserver 2 re-registering id 1's address", err, codes.PermissionDenied)
	_, err = cs[2].Heartbeat(ctx, &api.HeartbeatRequest{Id: 1, DiskState: api.DiskState_DISK_STATE_IO_ERROR})
	wantCode(t, "chunkserver 2 heartbeating as 1", err, codes.PermissionDenied)
	if _, err := cs[1].Heartbeat(ctx, &api.HeartbeatRequest{Id: 1}); err != nil {
		t.Fatalf("chunkserver 1 heartbeats: %v", err)
	}
	admin := x.as(identity.RoleAdmin, "admin")
	list, err := admin.ListChunkServers(ctx, &api.ListChunkServersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Chunkservers {
		if c.Id == 1 && (c.Addr != "csz1:1" || c.DiskState == api.DiskState_DISK_STATE_IO_ERROR) {
			t.Fatalf("chunkserver 1 changed by another: addr %s, disk %v", c.Addr, c.DiskState)
		}
	}
	// A client may not register or heartbeat at all.
	web1 := x.as(identity.RoleClient, "web1")
	_, err = web1.Heartbeat(ctx, &api.HeartbeatRequest{Id: 1})
	wantCode(t, "a client heartbeating", err, codes.PermissionDenied)

	// An access node speaks only for the node it registered.
	a1, a2 := x.as(identity.RoleAccess, "a1"), x.as(identity.RoleAccess, "a2")
	an, err := a1.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: "an1:4420", Name: "a1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a2.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: "an1:4420", Name: "a2"})
	wantCode(t, "access node a2 taking a1's address", err, codes.PermissionDenied)
	_, err = a2.AccessNodeHeartbeat(ctx, &api.AccessNodeHeartbeatRequest{Id: an.Id})
	wantCode(t, "access node a2 heartbeating as a1", err, codes.PermissionDenied)
	if _, err := a1.AccessNodeHeartbeat(ctx, &api.AccessNodeHeartbeatRequest{Id: an.Id}); err != nil {
		t.Fatalf("access node a1 heartbeats: %v", err)
	}
	_, err = web1.RegisterAccessNode(ctx, &api.RegisterAccessNodeRequest{Addr: "an9:4420"})
	wantCode(t, "a client registering an access node", err, codes.PermissionDenied)

	// Administration is the admin's.
	if _, err := admin.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err = web1.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "w", Size: 1 << 20})
	wantCode(t, "client CreateVolume", err, codes.PermissionDenied)
	_, err = web1.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "v"})
	wantCode(t, "client DeleteVolume", err, codes.PermissionDenied)
	_, err = web1.CreatePool(ctx, &api.CreatePoolRequest{Name: "q"})
	wantCode(t, "client CreatePool", err, codes.PermissionDenied)
	_, err = cs[1].DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "v"})
	wantCode(t, "chunkserver DeleteVolume", err, codes.PermissionDenied)
	_, err = web1.ClusterStatus(ctx, &api.ClusterStatusRequest{})
	wantCode(t, "client ClusterStatus", err, codes.PermissionDenied)
	if _, err := web1.GetVolume(ctx, &api.GetVolumeRequest{Name: "v"}); err != nil {
		t.Fatalf("client GetVolume: %v", err)
	}

	// Sessions belong to who opened them.
	open, err := web1.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v", Client: "web1"})
	if err != nil {
		t.Fatal(err)
	}
	web2 := x.as(identity.RoleClient, "web2")
	_, err = web2.CloseSession(ctx, &api.CloseSessionRequest{SessionId: open.SessionId})
	wantCode(t, "another client's CloseSession", err, codes.PermissionDenied)
	_, err = web2.RenewSession(ctx, &api.RenewSessionRequest{SessionId: open.SessionId})
	wantCode(t, "another client's RenewSession", err, codes.PermissionDenied)
	if _, err := web1.RenewSession(ctx, &api.RenewSessionRequest{SessionId: open.SessionId}); err != nil {
		t.Fatalf("the owner renews: %v", err)
	}
	// So the volume is still open for writing, and cannot be deleted.
	_, err = admin.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "v"})
	wantCode(t, "delete of a volume open for writing", err, codes.FailedPrecondition)

	// A cap on open sessions per identity.
	var readers []uint64
	for i := 0; i < 2; i++ {
		r, err := web1.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v", ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r.SessionId)
	}
	_, err = web1.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v", ReadOnly: true})
	wantCode(t, "a session past the cap", err, codes.ResourceExhausted)
	r, err := web2.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "v", ReadOnly: true})
	if err != nil {
		t.Fatalf("another identity under its own cap: %v", err)
	}
	readers = append(readers, r.SessionId)

	// The owner closes its session; an admin may close anyone's (to
	// detach a volume); then the admin may delete the volume.
	if _, err := web1.CloseSession(ctx, &api.CloseSessionRequest{SessionId: open.SessionId}); err != nil {
		t.Fatal(err)
	}
	for _, id := range readers {
		if _, err := admin.CloseSession(ctx, &api.CloseSessionRequest{SessionId: id}); err != nil {
			t.Fatalf("admin closes session %d: %v", id, err)
		}
	}
	if _, err := admin.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "v"}); err != nil {
		t.Fatalf("admin DeleteVolume: %v", err)
	}
}

// TestRevokedClientIsCutOff: after `basalt cert revoke`, the client can
// neither call over the connection it has nor make a new one; others can.
func TestRevokedClientIsCutOff(t *testing.T) {
	x := startSecured(t, Config{})
	web1 := x.as(identity.RoleClient, "web1")
	if _, err := web1.ListPools(shortCtx(t), &api.ListPoolsRequest{}); err != nil {
		t.Fatalf("before revocation: %v", err)
	}
	cert, err := identity.ReadCert(x.id(identity.RoleClient, "web1").CertFile())
	if err != nil {
		t.Fatal(err)
	}
	if err := x.ca.Revoke(cert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	// The MDS re-reads ca.crl within a second of it changing.
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := web1.ListPools(shortCtx(t), &api.ListPoolsRequest{})
		if status := codeOf(err); status == codes.Unauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked client's open connection still gets: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fresh, err := mdsclient.Dial([]string{x.addr}, x.id(identity.RoleClient, "web1").ClientTLS(identity.RoleMDS))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if _, err := fresh.ListPools(shortCtx(t), &api.ListPoolsRequest{}); err == nil {
		t.Fatal("a revoked client made a new connection")
	}
	if _, err := x.as(identity.RoleClient, "web2").ListPools(shortCtx(t), &api.ListPoolsRequest{}); err != nil {
		t.Fatalf("another client: %v", err)
	}
}
