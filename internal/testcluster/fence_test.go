package testcluster

import (
	"bytes"
	"context"
	"errors"
	"github.com/basalt-storage/basalt/internal/identity"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// cuttableMDS is an MDS connection that can be cut: from then on every call
// the client library makes fails as if the MDS were unreachable (a writer
// partitioned from the control plane, still reaching the chunkservers).
type cuttableMDS struct {
	api.MDSClient
	cut atomic.Bool
}

var errCut = status.Error(codes.Unavailable, "test: cut off from the MDS")

func (m *cuttableMDS) RenewSession(ctx context.Context, in *api.RenewSessionRequest, opts ...grpc.CallOption) (*api.RenewSessionResponse, error) {
	if m.cut.Load() {
		return nil, errCut
	}
	return m.MDSClient.RenewSession(ctx, in, opts...)
}

func (m *cuttableMDS) GetCopysets(ctx context.Context, in *api.GetCopysetsRequest, opts ...grpc.CallOption) (*api.GetCopysetsResponse, error) {
	if m.cut.Load() {
		return nil, errCut
	}
	return m.MDSClient.GetCopysets(ctx, in, opts...)
}

func (m *cuttableMDS) GetVolume(ctx context.Context, in *api.GetVolumeRequest, opts ...grpc.CallOption) (*api.GetVolumeResponse, error) {
	if m.cut.Load() {
		return nil, errCut
	}
	return m.MDSClient.GetVolume(ctx, in, opts...)
}

func (m *cuttableMDS) CloseSession(ctx context.Context, in *api.CloseSessionRequest, opts ...grpc.CallOption) (*api.CloseSessionResponse, error) {
	if m.cut.Load() {
		return nil, errCut
	}
	return m.MDSClient.CloseSession(ctx, in, opts...)
}

// TestEagerFencing (issue 15, hazard 2): writer A is cut off from the MDS
// while its lease is still valid; writer B takes over and writes to one
// copyset only. A's write to a copyset B never touched must be refused with
// FENCED — B's Open fenced every copyset — and B reads only its own data and
// what A wrote before the takeover. Before eager fencing A's write landed.
func TestEagerFencing(t *testing.T) {
	// A long lease, so that A's lease outlives the takeover however loaded
	// the machine is: the point is a writer whose lease is still valid.
	c := Start(t, Options{MDSFlags: []string{"--session-lease=120s"}})
	const size = 64 << 20
	chunk := int64(c.Pool.ChunkSize)
	vol := c.CreateVolume("takeover", size)
	n := c.Pool.CopysetCount
	// Chunk 0's copyset is the one B writes; chunk k's is another.
	k := int64(1)
	for api.CopysetOf(vol.Id, uint64(k), n) == api.CopysetOf(vol.Id, 0, n) {
		k++
	}

	mc, err := mdsclient.Dial(strings.Split(c.MDSAddr, ","), c.TLS(identity.RoleClient, "test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	cut := &cuttableMDS{MDSClient: mc}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := client.Open(ctx, client.Config{Volume: "takeover", MDSClient: cut, DataTLS: c.DataTLS(identity.RoleClient, "test"), ClientName: "writer-a"})
	if err != nil {
		t.Fatalf("writer A: open: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	a1 := bytes.Repeat([]byte("a1"), 32<<10)
	for _, off := range []int64{0, k * chunk} {
		if _, err := a.WriteAt(a1, off); err != nil {
			t.Fatalf("writer A: write at %d before the takeover: %v", off, err)
		}
	}

	cut.cut.Store(true) // A no longer reaches the MDS, and so never hears of B
	t0 := time.Now()
	b := c.Open("takeover", false)
	takeover := time.Since(t0)
	t.Logf("takeover: writer B's Open (epoch %d, %d copysets fenced) took %v", b.Epoch(), n, takeover)
	if b.Epoch() <= a.Epoch() {
		t.Fatalf("writer B has epoch %d, A %d", b.Epoch(), a.Epoch())
	}
	b1 := bytes.Repeat([]byte("b1"), 32<<10)
	if _, err := b.WriteAt(b1, 0); err != nil {
		t.Fatalf("writer B: write: %v", err)
	}

	if err := a.Err(); err != nil {
		t.Fatalf("test invalid: writer A stopped before its stale write (%v); its lease should still run", err)
	}
	a2 := bytes.Repeat([]byte("A2"), 32<<10)
	_, err = a.WriteAt(a2, k*chunk)
	if !errors.Is(err, api.ErrFenced) {
		t.Fatalf("writer A (cut off, lease valid): write to copyset %d, which B never wrote: got %v, want FENCED",
			api.CopysetOf(vol.Id, uint64(k), n), err)
	}

	got := make([]byte, len(a1))
	for _, w := range []struct {
		off  int64
		want []byte
	}{{0, b1}, {k * chunk, a1}} {
		if _, err := b.ReadAt(got, w.off); err != nil {
			t.Fatalf("writer B: read at %d: %v", w.off, err)
		}
		if !bytes.Equal(got, w.want) {
			t.Fatalf("writer B reads %q... at %d, want %q...", got[:8], w.off, w.want[:8])
		}
	}

	// Takeover times: a few more writers take over in turn.
	var times []time.Duration
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		v, err := client.Open(ctx, client.Config{MDS: []string{c.MDSAddr}, MDSTLS: c.TLS(identity.RoleClient, "test"),
			DataTLS: c.DataTLS(identity.RoleClient, "test"), Volume: "takeover", ClientName: "writer-next"})
		if err != nil {
			t.Fatalf("takeover %d: %v", i, err)
		}
		times = append(times, time.Since(t0))
		v.Close()
	}
	slices.Sort(times)
	t.Logf("takeover figures: first %v; then 5 more: min %v, median %v, max %v (%d copysets each)",
		takeover, times[0], times[2], times[4], n)
}
