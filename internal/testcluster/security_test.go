package testcluster

import (
	"context"
	"crypto/tls"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// TestControlPlaneRefusesStrangers attacks the MDS of a real cluster the way
// issue 14 describes, over real sockets: no certificate, a chunkserver's
// certificate speaking for another id, a client's certificate administering
// or closing another's session, a revoked client. Each is refused, and the
// cluster's state is unchanged; the admin can do what the client could not.
func TestControlPlaneRefusesStrangers(t *testing.T) {
	c := Start(t, Options{Copysets: 3})
	c.CreateVolume("vol", 64<<20)
	v := c.Open("vol", false) // the "test" client's writer session
	if _, err := v.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	mds := strings.Split(c.MDSAddr, ",")[0]
	call := func(creds credentials.TransportCredentials) error {
		cc, err := grpc.NewClient(mds, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err = api.NewMDSClient(cc).ListVolumes(ctx, &api.ListVolumesRequest{})
		return err
	}
	// 1. No certificate: no connection.
	if err := call(insecure.NewCredentials()); err == nil {
		t.Fatal("plaintext ListVolumes was served")
	}
	if err := call(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})); err == nil {
		t.Fatal("ListVolumes without a client certificate was served")
	}
	// A certificate from another CA with the same cluster name.
	other, err := identity.InitCA(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	odir := t.TempDir()
	if _, _, err := other.IssueFiles(odir, "", identity.RoleAdmin, "admin", identity.IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	oid, err := identity.Load(odir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	if err := call(credentials.NewTLS(oid.ClientTLS())); err == nil {
		t.Fatal("an admin certificate of another CA was served")
	}

	dial := func(tc *tls.Config) *mdsclient.Client {
		mc, err := mdsclient.Dial(strings.Split(c.MDSAddr, ","), tc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mc.Close() })
		return mc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := func(what string, err error, code codes.Code) {
		t.Helper()
		if status.Code(err) != code {
			t.Fatalf("%s: %v, want %v", what, err, code)
		}
	}

	// 2. Chunkserver 2's certificate speaks for chunkserver 1.
	before := c.Status()
	var addr1 string
	for _, s := range before.Chunkservers {
		if s.Id == 1 {
			addr1 = s.Addr
		}
	}
	cs2 := dial(c.TLS(identity.RoleChunkserver, "2"))
	_, err = cs2.RegisterChunkServer(ctx, &api.RegisterChunkServerRequest{Id: 1, Zone: "zone1", Server: "host1", Addr: "127.0.0.1:1"})
	want("chunkserver 2 re-registering id 1", err, codes.PermissionDenied)
	_, err = cs2.Heartbeat(ctx, &api.HeartbeatRequest{Id: 1, Addr: "127.0.0.1:1", DiskState: api.DiskState_DISK_STATE_IO_ERROR})
	want("chunkserver 2 heartbeating as 1", err, codes.PermissionDenied)

	// 3. A client administers, or ends another's session.
	web := dial(c.TLS(identity.RoleClient, "web"))
	_, err = web.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "vol"})
	want("client DeleteVolume", err, codes.PermissionDenied)
	_, err = web.CreatePool(ctx, &api.CreatePoolRequest{Name: "mine", Replicas: 1})
	want("client CreatePool", err, codes.PermissionDenied)
	db := dial(c.TLS(identity.RoleClient, "db"))
	theirs, err := db.OpenVolume(ctx, &api.OpenVolumeRequest{Name: "vol", ReadOnly: true, Client: "db"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = web.CloseSession(ctx, &api.CloseSessionRequest{SessionId: theirs.SessionId})
	want("client closing another's session", err, codes.PermissionDenied)
	_, err = web.RenewSession(ctx, &api.RenewSessionRequest{SessionId: theirs.SessionId})
	want("client renewing another's session", err, codes.PermissionDenied)
	if _, err := db.RenewSession(ctx, &api.RenewSessionRequest{SessionId: theirs.SessionId}); err != nil {
		t.Fatalf("the owner renews its session: %v", err)
	}
	if _, err := db.CloseSession(ctx, &api.CloseSessionRequest{SessionId: theirs.SessionId}); err != nil {
		t.Fatalf("the owner closes its session: %v", err)
	}

	// Nothing changed: chunkserver 1's address and disk state, the writer.
	after := c.Status()
	for _, s := range after.Chunkservers {
		if s.Id == 1 && (s.Addr != addr1 || s.DiskState != api.DiskState_DISK_STATE_OK) {
			t.Fatalf("chunkserver 1 changed by another's certificate: addr %s (was %s), disk %v", s.Addr, addr1, s.DiskState)
		}
	}
	if _, err := v.WriteAt(make([]byte, 4096), 4096); err != nil {
		t.Fatalf("the writer lost its session: %v", err)
	}

	// 4. A revoked client cannot connect.
	webCert, err := identity.ReadCert(filepath.Join(c.TLSDir, "client-web.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CA().Revoke(webCert.SerialNumber); err != nil {
		t.Fatal(err)
	}
	webTLS := c.TLS(identity.RoleClient, "web")
	c.Eventually(60*time.Second, "the revoked client refused", func(context.Context) error {
		if err := call(credentials.NewTLS(webTLS)); err == nil {
			return errString("still served")
		}
		return nil
	})

	// 5. The admin can.
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.API.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "vol"}); err != nil {
		t.Fatalf("admin DeleteVolume: %v", err)
	}
	for _, p := range append(c.MDSs, c.CS...) {
		if _, exited := p.ExitCode(); exited {
			t.Fatalf("%s exited", p.Name)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestDaemonsRefuseToStartWithoutTLS: without --tls-dir (and without
// --insecure) a daemon exits at once and says how to make certificates.
func TestDaemonsRefuseToStartWithoutTLS(t *testing.T) {
	bin := Binary(t)
	for _, args := range [][]string{
		{"mds", "--listen", testutil.FreeAddr(t), "--data-dir", t.TempDir()},
		{"chunkserver", "--data", t.TempDir(), "--mds", testutil.FreeAddr(t)},
		{"nbd", "--mds", testutil.FreeAddr(t), "--listen", testutil.FreeAddr(t)},
		{"status", "--mds", testutil.FreeAddr(t)},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = t.TempDir() // no basalt-data/tls here
		cmd.Env = append(cmd.Environ(), "BASALT_TLS_DIR=")
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "basalt cert init") {
			t.Errorf("basalt %s: err %v, output %q; want a refusal naming `basalt cert init`", args[0], err, out)
		}
	}
}
