package mds

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/api"
)

// A volume's iSCSI target CHAP: an admin sets, shows and clears it; the
// access nodes (and clients, which `basalt iscsi` may run as) read it,
// secrets included; nobody else does either; bad credentials are refused
// without the secret in the error; it goes with the volume.
func TestTargetCHAP(t *testing.T) {
	x := startSecured(t, Config{})
	ctx := ctxT(t)
	for i := 1; i <= 3; i++ {
		z := "z" + strconv.Itoa(i)
		if _, err := x.as(identity.RoleChunkserver, strconv.Itoa(i)).RegisterChunkServer(ctx,
			&api.RegisterChunkServerRequest{Zone: z, Server: "h" + z, Addr: "cs" + z + ":1", DataDir: "/d" + z}); err != nil {
			t.Fatal(err)
		}
	}
	admin := x.as(identity.RoleAdmin, "admin")
	if _, err := admin.CreatePool(ctx, &api.CreatePoolRequest{Name: "p", CopysetCount: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	access, client := x.as(identity.RoleAccess, "a1"), x.as(identity.RoleClient, "web1")
	cs := x.as(identity.RoleChunkserver, "1")

	get := func(who string, c api.MDSClient) *api.TargetCHAP {
		t.Helper()
		r, err := c.GetTargetCHAP(ctx, &api.GetTargetCHAPRequest{Volume: "v"})
		if err != nil {
			t.Fatalf("%s GetTargetCHAP: %v", who, err)
		}
		return r.Chap
	}
	if c := get("access", access); c != nil {
		t.Fatalf("a new volume has CHAP %v", c)
	}
	want := &api.TargetCHAP{User: "alice", Secret: []byte("alice-secret-0123"), MutualUser: "tgt", MutualSecret: []byte("target-secret-456")}
	set := &api.SetTargetCHAPRequest{Volume: "v", Chap: want}

	// Only an admin sets or clears; a chunkserver may not read.
	_, err := client.SetTargetCHAP(ctx, set)
	wantCode(t, "client SetTargetCHAP", err, codes.PermissionDenied)
	_, err = access.SetTargetCHAP(ctx, set)
	wantCode(t, "access SetTargetCHAP", err, codes.PermissionDenied)
	_, err = cs.GetTargetCHAP(ctx, &api.GetTargetCHAPRequest{Volume: "v"})
	wantCode(t, "chunkserver GetTargetCHAP", err, codes.PermissionDenied)
	if _, err := admin.SetTargetCHAP(ctx, set); err != nil {
		t.Fatal(err)
	}
	for who, c := range map[string]api.MDSClient{"access": access, "client": client, "admin": admin} {
		got := get(who, c)
		if got.GetUser() != want.User || !bytes.Equal(got.Secret, want.Secret) ||
			got.MutualUser != want.MutualUser || !bytes.Equal(got.MutualSecret, want.MutualSecret) {
			t.Fatalf("%s reads %v, want what was set", who, got)
		}
	}
	_, err = client.SetTargetCHAP(ctx, &api.SetTargetCHAPRequest{Volume: "v"})
	wantCode(t, "client clearing", err, codes.PermissionDenied)

	// Refused: each error names the rule, never the secret.
	for what, bad := range map[string]*api.TargetCHAP{
		"no user":                {Secret: []byte("alice-secret-0123")},
		"short secret":           {User: "alice", Secret: []byte("short-11chr")},
		"long secret":            {User: "alice", Secret: bytes.Repeat([]byte("s"), 256)},
		"control character":      {User: "al\nice", Secret: []byte("alice-secret-0123")},
		"mutual user, no secret": {User: "alice", Secret: []byte("alice-secret-0123"), MutualUser: "tgt"},
		"mutual secret, no user": {User: "alice", Secret: []byte("alice-secret-0123"), MutualSecret: []byte("target-secret-456")},
		"mutual secret the same": {User: "alice", Secret: []byte("alice-secret-0123"), MutualUser: "tgt", MutualSecret: []byte("alice-secret-0123")},
		"short mutual secret":    {User: "alice", Secret: []byte("alice-secret-0123"), MutualUser: "tgt", MutualSecret: []byte("tgt")},
	} {
		_, err := admin.SetTargetCHAP(ctx, &api.SetTargetCHAPRequest{Volume: "v", Chap: bad})
		wantCode(t, what, err, codes.InvalidArgument)
		if s := status.Convert(err).Message(); strings.Contains(s, "secret-0123") || strings.Contains(s, "short-11") {
			t.Fatalf("%s: the error quotes the secret: %s", what, s)
		}
	}
	if got := get("access", access); got.GetUser() != "alice" {
		t.Fatalf("a refused set changed the record: %v", got)
	}
	_, err = admin.SetTargetCHAP(ctx, &api.SetTargetCHAPRequest{Volume: "nope", Chap: want})
	wantCode(t, "a volume that does not exist", err, codes.NotFound)

	// One-way CHAP replaces it; clear removes it.
	if _, err := admin.SetTargetCHAP(ctx, &api.SetTargetCHAPRequest{Volume: "v",
		Chap: &api.TargetCHAP{User: "bob", Secret: []byte("bob-secret-89ab")}}); err != nil {
		t.Fatal(err)
	}
	if got := get("access", access); got.GetUser() != "bob" || got.MutualUser != "" || len(got.MutualSecret) != 0 {
		t.Fatalf("after a one-way set: %v", got)
	}
	if _, err := admin.SetTargetCHAP(ctx, &api.SetTargetCHAPRequest{Volume: "v"}); err != nil {
		t.Fatal(err)
	}
	if got := get("access", access); got != nil {
		t.Fatalf("after clear: %v", got)
	}

	// The record goes with the volume: a new volume of the same name has none.
	if _, err := admin.SetTargetCHAP(ctx, set); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := get("access", access); got != nil {
		t.Fatalf("a new volume named as a deleted one has its CHAP: %v", got)
	}
}
