package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/api"
)

// party issues role/name from ca into a directory of its own and loads it.
func party(t testing.TB, ca *identity.CA, role identity.Role, name string) *identity.Config {
	t.Helper()
	dir := t.TempDir()
	if _, _, err := ca.IssueFiles(dir, "", role, name, identity.IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := identity.Load(dir, identity.Base(role, name))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newCA(t testing.TB, cluster string) *identity.CA {
	t.Helper()
	ca, err := identity.InitCA(t.TempDir(), cluster)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// peerRecorder echoes requests and records the peer each frame came from.
type peerRecorder struct {
	mu    sync.Mutex
	peers []identity.Identity
	anon  int
}

func (p *peerRecorder) ServeFrame(rw ReplyWriter, h api.Header, payload []byte) {
	id, ok := PeerOf(rw)
	p.mu.Lock()
	if ok {
		p.peers = append(p.peers, id)
	} else {
		p.anon++
	}
	p.mu.Unlock()
	out := append([]byte(nil), payload...)
	rw.Reply(h, out, nil)
}

func (p *peerRecorder) frames() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.peers) + p.anon
}

// TestSecureModes: in both secure modes a client and a chunkserver prove
// who they are before the first frame, each side learns the other's
// identity, and frames of every size go through (a 1 MiB one spans many TLS
// records in ModeEncrypted).
func TestSecureModes(t *testing.T) {
	ca := newCA(t, "c1")
	srvID := party(t, ca, identity.RoleChunkserver, "7")
	cliID := party(t, ca, identity.RoleClient, "app")
	for _, mode := range []Mode{ModeAuthenticated, ModeEncrypted} {
		t.Run(mode.String(), func(t *testing.T) {
			rec := &peerRecorder{}
			_, addr := startServer(t, ServerConfig{Security: Security{Mode: mode, TLS: srvID,
				Allow: []identity.Role{identity.RoleClient, identity.RoleChunkserver}}}, rec)
			c, err := Dial(context.Background(), addr, ConnConfig{Security: Security{Mode: mode, TLS: cliID,
				Allow: []identity.Role{identity.RoleChunkserver}}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if p, ok := c.Peer(); !ok || p.Name != "7" || p.Role != identity.RoleChunkserver {
				t.Fatalf("client sees server %v %v", p, ok)
			}
			for _, n := range []int{0, 1, 4096, 1 << 20} {
				payload := bytes.Repeat([]byte{byte(n)}, n)
				call := &Call{Header: api.Header{Op: api.OpWrite, Length: uint32(n)}, Payload: payload, ReadBuf: make([]byte, n)}
				if err := c.Do(context.Background(), call); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(call.ReadBuf[:call.Reply.PayloadLen], payload) {
					t.Fatalf("%d-byte echo differs", n)
				}
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if rec.anon != 0 || len(rec.peers) != 4 || rec.peers[0].Role != identity.RoleClient || rec.peers[0].Name != "app" {
				t.Fatalf("server saw peers %v and %d anonymous frames", rec.peers, rec.anon)
			}
		})
	}
}

// TestHandshakeRefusals: a connection that does not prove an acceptable
// identity is closed before any of its frames is served — an attacker
// sending plain frames, a certificate of another cluster's CA, a role the
// server does not serve.
func TestHandshakeRefusals(t *testing.T) {
	ca := newCA(t, "c1")
	srvID := party(t, ca, identity.RoleChunkserver, "1")
	other := party(t, newCA(t, "c1"), identity.RoleClient, "mallory") // same cluster name, another CA
	admin := party(t, ca, identity.RoleAdmin, "admin")
	cli := party(t, ca, identity.RoleClient, "app")
	rec := &peerRecorder{}
	srv := Security{Mode: ModeEncrypted, TLS: srvID, Allow: []identity.Role{identity.RoleClient}}
	_, addr := startServer(t, ServerConfig{Security: srv, HandshakeTimeout: time.Second}, rec)

	// Plain frames, as today's clients (or an attacker) send them.
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var hb [api.HeaderSize]byte
	h := api.Header{Op: api.OpRead, Volume: 1, Offset: 0, Length: 4096, Epoch: ^uint64(0), ID: 1}
	h.Encode(hb[:])
	for range 4 {
		_, _ = nc.Write(hb[:])
	}
	// The server closes (EOF, or a reset: it did not read all we sent).
	_ = nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadAll(nc); isTimeout(err) {
		t.Fatalf("plain client: %v (want the server to close)", err)
	}
	nc.Close()

	cases := []struct {
		name string
		sec  Security
	}{
		{"another CA", Security{Mode: ModeEncrypted, TLS: other}},
		{"role not served", Security{Mode: ModeEncrypted, TLS: admin}},
	}
	for _, tc := range cases {
		c, err := Dial(context.Background(), addr, ConnConfig{Security: tc.sec})
		if err == nil {
			c.Close()
			t.Errorf("%s: connected", tc.name)
			continue
		}
		if !errors.Is(err, ErrHandshake) {
			t.Errorf("%s: %v, want ErrHandshake", tc.name, err)
		}
	}
	if n := rec.frames(); n != 0 {
		t.Fatalf("the server served %d frames of unauthenticated connections", n)
	}
	// And the right client gets in.
	c, err := Dial(context.Background(), addr, ConnConfig{Security: Security{Mode: ModeEncrypted, TLS: cli}})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// TestServerRaisesTheMode: a client that asks for the authenticated mode
// from a server that requires encryption gets an encrypted connection (so
// clients follow the cluster's mode without being told it), and a plaintext
// frame sent on the raw socket after that handshake is refused: the
// connection closes and no frame is served.
func TestServerRaisesTheMode(t *testing.T) {
	ca := newCA(t, "c1")
	srvID := party(t, ca, identity.RoleChunkserver, "1")
	cli := party(t, ca, identity.RoleClient, "app")
	rec := &peerRecorder{}
	_, addr := startServer(t, ServerConfig{Security: Security{Mode: ModeEncrypted, TLS: srvID,
		Allow: []identity.Role{identity.RoleClient}}}, rec)
	asked := Security{Mode: ModeAuthenticated, TLS: cli, Allow: []identity.Role{identity.RoleChunkserver}}

	// The library's way: the connection works, encrypted.
	c, err := Dial(context.Background(), addr, ConnConfig{Security: asked})
	if err != nil {
		t.Fatal(err)
	}
	call := &Call{Header: api.Header{Op: api.OpWrite, Length: 5}, Payload: []byte("hello"), ReadBuf: make([]byte, 5)}
	if err := c.Do(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	c.Close()
	served := rec.frames()

	// By hand: the handshake hands back TLS, not the raw socket.
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fc, _, err := ClientHandshake(context.Background(), nc, asked)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fc.(*tls.Conn); !ok {
		t.Fatalf("the handshake returned %T, want the TLS connection (encrypted mode)", fc)
	}
	// An attacker on the path (or a confused client) writes a plaintext
	// frame on the raw socket after the handshake.
	var hb [api.HeaderSize]byte
	h := api.Header{Op: api.OpRead, Volume: 1, Length: 4096, Epoch: ^uint64(0), ID: 1}
	h.Encode(hb[:])
	_, _ = nc.Write(hb[:])
	// The server answers with at most a TLS alert and closes.
	_ = nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadAll(nc); isTimeout(err) {
		t.Fatalf("plaintext frame on an encrypted connection: %v (want the server to close)", err)
	}
	if n := rec.frames(); n != served {
		t.Fatalf("the server served %d plaintext frames of an encrypted connection", n-served)
	}
}

// waitClosed waits (up to 60 s) until the server closes nc.
func waitClosed(t *testing.T, nc net.Conn, what string) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	var b [1]byte
	if _, err := nc.Read(b[:]); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		t.Fatalf("%s: connection not closed by the server: %v", what, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestListenerLimits: a connection that stalls in its handshake or in the
// middle of a frame (slow loris) is closed, and connections over MaxConns
// are closed as they are accepted.
func TestListenerLimits(t *testing.T) {
	ca := newCA(t, "c1")
	srvID := party(t, ca, identity.RoleChunkserver, "1")
	rec := &peerRecorder{}
	_, secAddr := startServer(t, ServerConfig{Security: Security{Mode: ModeAuthenticated, TLS: srvID},
		HandshakeTimeout: 200 * time.Millisecond}, rec)
	_, addr := startServer(t, ServerConfig{FrameTimeout: 200 * time.Millisecond, MaxConns: 2}, rec)

	idle, err := net.Dial("tcp", secAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	waitClosed(t, idle, "no handshake")

	// Half a header, then nothing.
	loris, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer loris.Close()
	_, _ = loris.Write(make([]byte, api.HeaderSize/2))
	waitClosed(t, loris, "half a header")

	// A header announcing 64 MiB, and a few bytes of it.
	loris2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer loris2.Close()
	var hb [api.HeaderSize]byte
	big := api.Header{Op: api.OpWrite, Length: 4096, PayloadLen: api.MaxPayload, ID: 1}
	big.Encode(hb[:])
	_, _ = loris2.Write(append(hb[:], 1, 2, 3))
	waitClosed(t, loris2, "a stalled payload")

	// An idle connection between frames stays (a client's cached connection).
	c1 := dial(t, addr)
	c2 := dial(t, addr)
	call := &Call{Header: api.Header{Op: api.OpWrite}, Payload: []byte("x"), ReadBuf: make([]byte, 1)}
	if err := c1.Do(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	// A third is over the cap (the two stalled ones are gone: wait for that).
	deadline := time.Now().Add(60 * time.Second)
	for {
		third, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = third.SetReadDeadline(time.Now().Add(2 * time.Second))
		var b [1]byte
		_, err = third.Read(b[:])
		third.Close()
		if err != nil && !isTimeout(err) {
			break // closed by the server
		}
		if time.Now().After(deadline) {
			t.Fatal("a connection over MaxConns was kept")
		}
	}
	time.Sleep(300 * time.Millisecond) // longer than FrameTimeout: idle is fine
	if err := c2.Do(context.Background(), call); err != nil {
		t.Fatalf("an idle connection was closed: %v", err)
	}
}

// allocRecorder is peerRecorder whose payloads of op OpWrite are read into
// buffers of its own, at an offset (PayloadAllocator).
type allocRecorder struct{ peerRecorder }

func (a *allocRecorder) AllocPayload(h api.Header, n int) (*[]byte, int) {
	if h.Op != api.OpWrite {
		return nil, 0
	}
	b := make([]byte, 16+n)
	return &b, 16
}

// TestPayloadTakenAsItArrives: connections that announce the largest
// payload and send 10 bytes of it make the server hold a small buffer each,
// not the announced 64 MiB (measured as the bytes the process allocated
// while they wait: ~64 × 256 KiB, against 4 GiB if the announced length
// were allocated); large payloads that arrive slowly still arrive whole,
// into pooled and into handler-owned buffers.
func TestPayloadTakenAsItArrives(t *testing.T) {
	rec := &allocRecorder{}
	srv, addr := startServer(t, ServerConfig{}, rec)
	const conns = 64
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var hb [api.HeaderSize]byte
	h := api.Header{Op: api.OpWrite, Volume: 1, Length: api.MaxPayload, PayloadLen: api.MaxPayload, ID: 1}
	h.Encode(hb[:])
	for range conns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write(append(hb[:], "0123456789"...)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for srv.staging.Load() < conns {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections reached their payload in 60 s", srv.staging.Load(), conns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > conns<<20 {
		t.Fatalf("%d connections announcing %d-byte payloads made the process allocate %d MiB", conns, api.MaxPayload, grew>>20)
	}

	// Slow large payloads still arrive whole, pooled (OpRead frames here)
	// and into the handler's buffers (OpWrite).
	for _, op := range []api.Op{api.OpRead, api.OpWrite} {
		c, err := Dial(context.Background(), addr, ConnConfig{})
		if err != nil {
			t.Fatal(err)
		}
		n := 3<<20 + 17
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		call := &Call{Header: api.Header{Op: op, Length: uint32(n)}, Payload: payload, ReadBuf: make([]byte, n)}
		if err := c.Do(context.Background(), call); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(call.ReadBuf[:call.Reply.PayloadLen], payload) {
			t.Fatalf("op %v: a %d-byte payload came back different", op, n)
		}
		c.Close()
	}
}

// ownRecorder echoes each payload and records whether it lay in the
// buffer its AllocPayload gave (OpWrite frames get one).
type ownRecorder struct {
	mu    sync.Mutex
	owned []bool
}

func (o *ownRecorder) AllocPayload(h api.Header, n int) (*[]byte, int) {
	if h.Op != api.OpWrite {
		return nil, 0
	}
	b := make([]byte, 16+n)
	return &b, 16
}

func (o *ownRecorder) ServeFrame(rw ReplyWriter, h api.Header, payload []byte) {
	buf, off := rw.(PayloadBufferer).PayloadBuffer()
	own := buf != nil && len(payload) > 0 && &(*buf)[off] == &payload[0]
	o.mu.Lock()
	o.owned = append(o.owned, own)
	o.mu.Unlock()
	rw.Reply(h, append([]byte(nil), payload...), nil)
}

// TestStagedPayloadIntoHandlerBuffer: payloads that arrive in two parts,
// of sizes around the staging steps, arrive whole, into the handler's own
// buffer when it gives one (OpWrite) and a pooled one otherwise (OpRead).
func TestStagedPayloadIntoHandlerBuffer(t *testing.T) {
	rec := &ownRecorder{}
	srv, addr := startServer(t, ServerConfig{}, rec)
	sizes := []int{stagedStep + stagedSlack + 1, 2*stagedStep + 300, 3<<20 + 17}
	for _, op := range []api.Op{api.OpWrite, api.OpRead} {
		for _, n := range sizes {
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = byte(i*7 + n)
			}
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			var hb [api.HeaderSize]byte
			h := api.Header{Op: op, Volume: 1, Length: uint32(n), PayloadLen: uint32(n), ID: 7}
			h.Encode(hb[:])
			if _, err := nc.Write(append(hb[:], payload[:100]...)); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(60 * time.Second)
			for srv.staging.Load() < 1 {
				if time.Now().After(deadline) {
					t.Fatalf("op %v, %d bytes: the server did not start staging the payload in 60 s", op, n)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if _, err := nc.Write(payload[100:]); err != nil {
				t.Fatal(err)
			}
			_ = nc.SetReadDeadline(time.Now().Add(60 * time.Second))
			if _, err := io.ReadFull(nc, hb[:]); err != nil {
				t.Fatalf("op %v, %d bytes: reply: %v", op, n, err)
			}
			rh, err := api.DecodeHeader(hb[:])
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, rh.PayloadLen)
			if _, err := io.ReadFull(nc, got); err != nil {
				t.Fatalf("op %v, %d bytes: reply payload: %v", op, n, err)
			}
			nc.Close()
			if !bytes.Equal(got, payload) {
				t.Fatalf("op %v: a %d-byte payload that arrived in two parts came back different (%d bytes)", op, n, len(got))
			}
			rec.mu.Lock()
			own := rec.owned[len(rec.owned)-1]
			rec.mu.Unlock()
			if want := op == api.OpWrite; own != want {
				t.Fatalf("op %v, %d bytes: payload in the handler's buffer: %v, want %v", op, n, own, want)
			}
		}
	}
}

// exactAlloc gives OpWrite payloads a buffer of their size with room in
// front, as PayloadAllocator asks for staged payloads, and records when.
type exactAlloc struct {
	peerRecorder
	held atomic.Int64 // capacity of the buffer given, 0 before
}

func (a *exactAlloc) AllocPayload(h api.Header, n int) (*[]byte, int) {
	if h.Op != api.OpWrite {
		return nil, 0
	}
	b := make([]byte, 64+n)
	a.held.Store(int64(cap(b)))
	return &b, 64
}

// TestStalledPayloadHoldsAtMostTwiceArrived: a peer announces an 8 MiB
// write and sends it slowly. The handler's buffer is asked for only once half
// arrived, so what the server holds stays within twice what arrived (plus
// the handler's room).
func TestStalledPayloadHoldsAtMostTwiceArrived(t *testing.T) {
	rec := &exactAlloc{}
	_, addr := startServer(t, ServerConfig{}, rec)
	const n = 8 << 20
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var hb [api.HeaderSize]byte
	h := api.Header{Op: api.OpWrite, Volume: 1, Length: n, PayloadLen: n, ID: 1}
	h.Encode(hb[:])
	nc.Write(hb[:])
	nc.Write(make([]byte, n/2-4096))
	time.Sleep(300 * time.Millisecond) // the server has read what came
	if c := rec.held.Load(); c != 0 {
		t.Fatalf("the handler's %d-byte buffer was asked for before half of the %d-byte payload arrived", c, n)
	}
	nc.Write(make([]byte, 4096))
	for deadline := time.Now().Add(30 * time.Second); rec.held.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the handler's buffer was not asked for once half the payload arrived")
		}
	}
	if c := rec.held.Load(); c > 2*(n/2)+64 {
		t.Fatalf("after %d of %d bytes the server holds the handler's %d bytes: over twice what arrived", n/2, n, c)
	}
}
