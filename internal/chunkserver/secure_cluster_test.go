package chunkserver

import (
	"bytes"
	"context"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/mds"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// TestSecureClusterCapabilities runs the whole chain on real servers: the
// real MDS signs each session's capability and hands its keys to the
// chunkservers in heartbeats; three chunkservers whose data planes
// authenticate every connection replicate among themselves as the
// chunkservers their certificates name; the client library attaches its
// capability and writes and reads. An attacker holding a valid client
// certificate but no capability then sends issue 14's read at epoch 2^64-1
// to every copyset's leader: DENIED, nothing fenced, the writer goes on.
func TestSecureClusterCapabilities(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test with etcd: -short")
	}
	ca, err := identity.InitCA(t.TempDir(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	var cs []*identity.Config
	for i := 1; i <= 3; i++ {
		cs = append(cs, tlsParty(t, ca, identity.RoleChunkserver, strconv.Itoa(i)))
	}
	app := tlsParty(t, ca, identity.RoleClient, "app")
	mallory := tlsParty(t, ca, identity.RoleClient, "mallory")

	admin := tlsParty(t, ca, identity.RoleAdmin, "admin")
	mdsID := tlsParty(t, ca, identity.RoleMDS, "mds")
	addr := startRealMDSWith(t, func(c *mds.Config) { c.TLS, c.Insecure = mdsID, false })
	n := 0
	tc := startNodes(t, addr, func(c *Config) { c.TLS = cs[n%3]; n++ })
	for i, node := range tc.nodes {
		if id := node.cs.ID(); id != uint64(i+1) {
			t.Skipf("the MDS gave node %d id %d; the test's certificates name 1..3", i, id)
		}
	}
	cl, err := mdsclient.Dial([]string{addr}, admin.ClientTLS(identity.RoleMDS))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wholeTestMDS)
	defer cancel()
	tc.waitFor("pool creation", func() bool {
		r, err := cl.CreatePool(ctx, &api.CreatePoolRequest{Name: "default", Replicas: 3, ChunkSize: mChunk, CopysetCount: 4})
		if err != nil {
			return false
		}
		tc.pool = r.GetPool()
		return true
	})
	if _, err := cl.CreateVolume(ctx, &api.CreateVolumeRequest{Name: "v", Size: mVolSize, Pool: "default"}); err != nil {
		t.Fatal(err)
	}
	tc.waitFor("copysets healthy", func() bool {
		st, err := cl.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		return err == nil && st.GetCopysetsHealthy() == 4
	})
	v, err := client.Open(ctx, client.Config{MDS: []string{addr}, MDSTLS: app.ClientTLS(identity.RoleMDS), Volume: "v", ClientName: "app",
		DataTLS: app.ClientTLS(identity.RoleChunkserver), IOTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	want := make([]byte, mVolSize)
	rand.New(rand.NewSource(14)).Read(want)
	if _, err := v.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}

	tc.sec = transport.Security{Mode: transport.ModeAuthenticated, TLS: mallory}
	for c := uint32(0); c < 4; c++ {
		var off uint64
		for api.CopysetOf(v.ID(), off/mChunk, 4) != c {
			off += mChunk
		}
		r, err := tc.do(api.Header{Op: api.OpRead, Volume: v.ID(), Epoch: ^uint64(0), Offset: off, Length: 4096, Copyset: c},
			nil, make([]byte, 4096))
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != api.StatusDenied {
			t.Fatalf("copyset %d: read at epoch 2^64-1 without a capability: %v, want DENIED", c, r.Status)
		}
	}
	if _, err := v.WriteAt(want[:mChunk], mChunk); err != nil {
		t.Fatalf("the writer after the attack: %v", err)
	}
	copy(want[mChunk:2*mChunk], want[:mChunk])
	got := make([]byte, mVolSize)
	if _, err := v.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data read back differs")
	}
}
