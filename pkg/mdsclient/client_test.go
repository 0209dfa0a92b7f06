package mdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

// fakeMDS answers ListPools: as the active MDS (one pool named after it),
// as a standby naming the active one, or with a fixed error.
type fakeMDS struct {
	api.UnimplementedMDSServer
	name  string
	mu    sync.Mutex
	err   error // returned when set
	hang  bool  // answer nothing until the call's context ends
	calls atomic.Int32
}

func (f *fakeMDS) ListPools(ctx context.Context, _ *api.ListPoolsRequest) (*api.ListPoolsResponse, error) {
	f.calls.Add(1)
	if f.hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return &api.ListPoolsResponse{Pools: []*api.Pool{{Name: f.name}}}, nil
}

func (f *fakeMDS) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func serve(t *testing.T, f *fakeMDS) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	api.RegisterMDSServer(s, f)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

func standby(active string) error {
	return status.Error(codes.Unavailable, "not the active MDS; active is "+active)
}

func pool(t *testing.T, c *Client) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.ListPools(ctx, &api.ListPoolsRequest{})
	if err != nil {
		return "", err
	}
	return r.Pools[0].Name, nil
}

func TestFollowsTheActiveMDS(t *testing.T) {
	a, b, c3 := &fakeMDS{name: "a"}, &fakeMDS{name: "b"}, &fakeMDS{name: "c"}
	addrA, addrB, addrC := serve(t, a), serve(t, b), serve(t, c3)
	a.set(standby(addrC))
	b.set(standby(addrC))

	c, err := Dial([]string{addrA, testutil.FreeAddr(t) + "," + addrB, addrC}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := pool(t, c)
	if err != nil || got != "c" {
		t.Fatalf("ListPools = %q, %v; want the active MDS c", got, err)
	}
	if b.calls.Load() != 0 {
		t.Errorf("b was asked although a named c as active")
	}
	if c.Active() != addrC {
		t.Fatalf("Active = %s, want %s", c.Active(), addrC)
	}
	// The next call goes straight to c.
	before := a.calls.Load()
	if got, _ := pool(t, c); got != "c" || a.calls.Load() != before {
		t.Fatalf("second call: %q, a asked again: %v", got, a.calls.Load() != before)
	}

	// Failover: c becomes a standby naming a.
	c3.set(standby(addrA))
	a.set(nil)
	if got, err := pool(t, c); err != nil || got != "a" {
		t.Fatalf("after failover: %q, %v", got, err)
	}
	if c.Active() != addrA {
		t.Fatalf("Active = %s, want %s", c.Active(), addrA)
	}
}

func TestAnswersAreNotRetried(t *testing.T) {
	a, b := &fakeMDS{name: "a"}, &fakeMDS{name: "b"}
	a.set(status.Error(codes.NotFound, "pool does not exist"))
	c, err := Dial([]string{serve(t, a), serve(t, b)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = pool(t, c)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("err %v, want NotFound from a", err)
	}
	if b.calls.Load() != 0 {
		t.Fatal("a NotFound answer was retried on another MDS")
	}
}

func TestWaitsForAnActiveMDS(t *testing.T) {
	a := &fakeMDS{name: "a"}
	addrA := serve(t, a)
	a.set(status.Error(codes.Unavailable, "not the active MDS; no MDS is active yet"))
	c, err := Dial([]string{testutil.FreeAddr(t), addrA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// An election finishes after 500 ms: the call rides through it.
	time.AfterFunc(500*time.Millisecond, func() { a.set(nil) })
	start := time.Now()
	got, err := pool(t, c)
	if err != nil || got != "a" {
		t.Fatalf("ListPools = %q, %v", got, err)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("answered after %v, before any MDS was active", d)
	}

	// Nobody ever active: the caller's deadline ends the call.
	a.set(status.Error(codes.Unavailable, "not the active MDS; no MDS is active yet"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.ListPools(ctx, &api.ListPoolsRequest{})
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "no active MDS answered") {
		t.Fatalf("err %v, want DeadlineExceeded naming the last MDS error", err)
	}
}

// TestDeadlineDuringAnAttempt: the caller's deadline ends while an MDS that
// hangs holds the call; the error still names what the other MDS said.
func TestDeadlineDuringAnAttempt(t *testing.T) {
	a := &fakeMDS{name: "a", err: status.Error(codes.Unavailable, "not the active MDS; no MDS is active yet")}
	b := &fakeMDS{name: "b", hang: true}
	c, err := Dial([]string{serve(t, a), serve(t, b)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.ListPools(ctx, &api.ListPoolsRequest{})
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "no MDS is active yet") {
		t.Fatalf("err %v, want DeadlineExceeded with a's answer", err)
	}
	if b.calls.Load() == 0 {
		t.Fatal("b was never tried: the test did not end the deadline during an attempt")
	}
}

func TestDialAndClose(t *testing.T) {
	if _, err := Dial(nil, nil); !errors.Is(err, ErrNoAddresses) {
		t.Fatalf("Dial(nil, nil): %v", err)
	}
	if _, err := Dial([]string{" , "}, nil); !errors.Is(err, ErrNoAddresses) {
		t.Fatalf("Dial(blank): %v", err)
	}
	c, err := Dial([]string{testutil.FreeAddr(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := c.ListPools(context.Background(), &api.ListPoolsRequest{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestTLSMismatchFailsFast: a client without TLS against a TLS MDS, and a
// TLS client against an MDS without TLS, get an error that says what to do
// (FailedPrecondition, ErrTLSMismatch's text), not a deadline after
// retrying "server preface EOF" for the whole call.
func TestTLSMismatchFailsFast(t *testing.T) {
	ca, err := identity.InitCA(t.TempDir(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	load := func(role identity.Role, name string) *identity.Config {
		dir := t.TempDir()
		if _, _, err := ca.IssueFiles(dir, "", role, name, identity.IssueOptions{}); err != nil {
			t.Fatal(err)
		}
		id, err := identity.Load(dir, identity.Base(role, name))
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	srvID, cliID := load(identity.RoleMDS, "mds"), load(identity.RoleClient, "app")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvID.ServerTLS(identity.RoleClient))))
	api.RegisterMDSServer(s, &fakeMDS{name: "tls"})
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	tlsAddr := ln.Addr().String()
	plainAddr := serve(t, &fakeMDS{name: "plain"})

	for _, tc := range []struct {
		name, addr string
		cfg        *tls.Config
		want       string
	}{
		{"insecure client, TLS MDS", tlsAddr, nil, "--tls-dir"},
		{"TLS client, insecure MDS", plainAddr, cliID.ClientTLS(identity.RoleMDS), "--insecure"},
	} {
		c, err := Dial([]string{tc.addr}, tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		_, err = c.ListPools(ctx, &api.ListPoolsRequest{})
		cancel()
		c.Close()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want FailedPrecondition naming %s", tc.name, err, tc.want)
		}
	}
	// And matching modes work.
	c, err := Dial([]string{tlsAddr}, cliID.ClientTLS(identity.RoleMDS))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if r, err := c.ListPools(ctx, &api.ListPoolsRequest{}); err != nil || r.Pools[0].Name != "tls" {
		t.Fatalf("TLS client, TLS MDS: %v %v", r, err)
	}
}

// TestMovesOnFromAHungMDS: the MDS that answered last hangs (SIGSTOPped, its
// host frozen, cut off by a partition that drops packets) while another is
// active, and every caller's deadline is shorter than AttemptTimeout. A later
// call must reach the other MDS instead of waiting out its deadline on the
// hung one each time: before, chunkservers' heartbeats and clients' lease
// renewals failed for as long as the old active MDS hung.
func TestMovesOnFromAHungMDS(t *testing.T) {
	a := &fakeMDS{name: "a", hang: true} // first: where calls start
	b := &fakeMDS{name: "b"}
	c, err := Dial([]string{serve(t, a), serve(t, b)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := c.ListPools(ctx, &api.ListPoolsRequest{})
		cancel()
		if err == nil {
			if got := r.Pools[0].Name; got != "b" {
				t.Fatalf("call %d answered by %q, want b", i+1, got)
			}
			t.Logf("call %d reached b", i+1)
			return
		}
		t.Logf("call %d: %v", i+1, err)
	}
	t.Fatalf("5 calls with a 2 s deadline all waited on the hung MDS a; b was asked %d times", b.calls.Load())
}

// A call whose caller gave it almost no time says nothing about the MDS: it
// must not send the next call (with time enough) to a hung standby.
func TestShortDeadlineKeepsHealthyActive(t *testing.T) {
	a := &fakeMDS{name: "a"}             // the active MDS, healthy
	b := &fakeMDS{name: "b", hang: true} // a hung standby
	c, err := Dial([]string{serve(t, a), serve(t, b)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if _, err := c.ListPools(ctx, &api.ListPoolsRequest{}); err != nil {
		t.Fatal(err) // a answers: the connection is up
	}
	cancel()
	// One caller with a nearly spent deadline.
	ctx, cancel = context.WithTimeout(context.Background(), time.Microsecond)
	_, err = c.ListPools(ctx, &api.ListPoolsRequest{})
	cancel()
	t.Logf("short call: %v", err)
	// Another caller, 2 s: a answers in well under that.
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	r, err := c.ListPools(ctx, &api.ListPoolsRequest{})
	cancel()
	if err != nil {
		t.Fatalf("a healthy active MDS; the call after a short-deadline one failed: %v (b asked %d times)", err, b.calls.Load())
	}
	if r.Pools[0].Name != "a" {
		t.Fatalf("answered by %q", r.Pools[0].Name)
	}
}
