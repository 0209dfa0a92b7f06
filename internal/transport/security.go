package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
)

// Mode is how a connection's peers prove who they are and how its frames
// travel (doc.go, "Security"). The two secure modes are Ceph msgr2's crc and
// secure modes.
type Mode uint8

const (
	// ModeNone: no handshake, anyone who reaches the port is served (tests,
	// and deployments that asked for --insecure).
	ModeNone Mode = iota
	// ModeAuthenticated: a mutual TLS 1.3 handshake proves both identities,
	// then the frames travel in clear on the raw socket (the sockio fast path
	// unchanged). It keeps strangers out; it does not protect against an
	// attacker on the path who can inject into an established TCP stream.
	ModeAuthenticated
	// ModeEncrypted: TLS 1.3 for the whole connection (confidentiality and
	// integrity). On a same-host socket it is ModeAuthenticated: those bytes
	// never leave the kernel.
	ModeEncrypted
)

func (m Mode) String() string {
	switch m {
	case ModeNone:
		return "none"
	case ModeAuthenticated:
		return "authenticated"
	case ModeEncrypted:
		return "encrypted"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses a Mode's name ("none", "authenticated", "encrypted").
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{ModeNone, ModeAuthenticated, ModeEncrypted} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("transport: unknown security mode %q (none, authenticated, encrypted)", s)
}

// Errors of the handshake.
var (
	// ErrHandshake: the security handshake failed (no or a refused
	// certificate, another mode, a peer that does not speak it).
	ErrHandshake = errors.New("transport: security handshake failed")
	// ErrNoTLS: a secure mode without an identity.Config.
	ErrNoTLS = errors.New("transport: a secure mode needs a TLS identity")
)

// Security configures one end of connections: the mode and this party's
// identity. On a server, Mode is the least a connection gets: a client that
// asks for less is answered with the server's Mode and both use it (so
// clients need not be told a cluster's mode; a client may ask for
// encryption from a server that only requires authentication); Allow is the
// roles it serves. On a client, Mode is the least it accepts and Allow the
// roles it accepts as the server.
type Security struct {
	Mode  Mode
	TLS   *identity.Config
	Allow []identity.Role
	// ClientTLS, on a client, replaces TLS.ClientTLS(Allow...): a
	// configuration made by identity.Config.ClientTLS (the public client
	// library takes one, having no identity.Config in its API).
	ClientTLS *tls.Config
}

func (s Security) check() error {
	if s.Mode != ModeNone && s.TLS == nil && s.ClientTLS == nil {
		return ErrNoTLS
	}
	if s.Mode > ModeEncrypted {
		return fmt.Errorf("transport: unknown security mode %d", s.Mode)
	}
	return nil
}

// DefaultHandshakeTimeout bounds a connection's security handshake.
const DefaultHandshakeTimeout = 10 * time.Second

// The mode exchange, inside TLS once the handshake is done: the client
// sends modeHello then its Mode (one record), the server answers modeHello
// then the mode of the connection: the higher of the client's and its own
// (ModeEncrypted on TCP when it requires it), or closes. The client sends nothing else until
// that answer arrives, and the server nothing before it, so when the mode is
// ModeAuthenticated neither TLS stack has read or holds a byte of what
// follows on the raw socket.
const modeHello = 0xb5

// serverHandshake runs the server side on nc and returns the connection
// the frames travel on (nc itself, or the TLS connection) and the peer.
func serverHandshake(nc net.Conn, sec Security, timeout time.Duration) (net.Conn, identity.Identity, error) {
	cfg := sec.TLS.ServerTLS(sec.Allow...)
	cfg.SessionTicketsDisabled = true // nothing after the handshake but the mode exchange
	tc := tls.Server(nc, cfg)
	_ = nc.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = nc.SetDeadline(time.Time{}) }()
	if err := tc.Handshake(); err != nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	peer, err := identity.PeerIdentity(tc.ConnectionState())
	if err != nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	var b [2]byte
	if _, err := io.ReadFull(tc, b[:]); err != nil {
		return nil, peer, fmt.Errorf("%w: mode: %w", ErrHandshake, err)
	}
	want := Mode(b[1])
	least := sec.Mode
	if isLocal(nc) && least == ModeEncrypted {
		least = ModeAuthenticated
	}
	if b[0] != modeHello || want < ModeAuthenticated || want > ModeEncrypted {
		return nil, peer, fmt.Errorf("%w: %s asked for mode %d", ErrHandshake, peer, b[1])
	}
	want = max(want, least)
	if _, err := tc.Write([]byte{modeHello, byte(want)}); err != nil {
		return nil, peer, fmt.Errorf("%w: mode: %w", ErrHandshake, err)
	}
	if want == ModeEncrypted {
		return tc, peer, nil
	}
	return nc, peer, nil
}

// clientHandshake runs the client side on nc (see serverHandshake).
func clientHandshake(ctx context.Context, nc net.Conn, sec Security) (net.Conn, identity.Identity, error) {
	cfg := sec.ClientTLS
	if cfg == nil {
		cfg = sec.TLS.ClientTLS(sec.Allow...)
	}
	tc := tls.Client(nc, cfg)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultHandshakeTimeout)
	}
	_ = nc.SetDeadline(deadline)
	defer func() { _ = nc.SetDeadline(time.Time{}) }()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	peer, err := identity.PeerIdentity(tc.ConnectionState())
	if err != nil {
		return nil, identity.Identity{}, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	mode := sec.Mode
	if isLocal(nc) {
		mode = ModeAuthenticated
	}
	if _, err := tc.Write([]byte{modeHello, byte(mode)}); err != nil {
		return nil, peer, fmt.Errorf("%w: mode: %w", ErrHandshake, err)
	}
	var b [2]byte
	if _, err := io.ReadFull(tc, b[:]); err != nil {
		// The server closes on a mode it refuses, or a certificate it
		// refuses (TLS 1.3 clients learn that only now).
		return nil, peer, fmt.Errorf("%w: %s refused: %w", ErrHandshake, peer, err)
	}
	// The server may raise the mode to the least it serves; never lower it,
	// and never encrypt a same-host socket.
	got := Mode(b[1])
	if b[0] != modeHello || got < mode || got > ModeEncrypted || (isLocal(nc) && got != mode) {
		return nil, peer, fmt.Errorf("%w: %s answered mode %d to %s", ErrHandshake, peer, b[1], mode)
	}
	if got == ModeEncrypted {
		return tc, peer, nil
	}
	return nc, peer, nil
}

func isLocal(nc net.Conn) bool {
	_, ok := nc.(*net.UnixConn)
	return ok
}

// Peer is the ability of a Server's ReplyWriter to name the verified
// identity of its connection's peer.
type Peer interface {
	// Peer returns the peer's identity; ok is false on a ModeNone server.
	Peer() (id identity.Identity, ok bool)
}

// PeerOf returns the verified identity of the peer of rw's connection, and
// false when rw's server authenticates nobody (ModeNone).
func PeerOf(rw ReplyWriter) (identity.Identity, bool) {
	if p, ok := rw.(Peer); ok {
		return p.Peer()
	}
	return identity.Identity{}, false
}

// HasRole reports whether rw's peer is authenticated with one of roles, or
// the server authenticates nobody (ModeNone: everyone is allowed everything).
func HasRole(rw ReplyWriter, roles ...identity.Role) bool {
	id, ok := PeerOf(rw)
	return !ok || slices.Contains(roles, id.Role)
}

// ClientHandshake runs the client side of the security handshake on an
// established connection and returns the connection the frames then go on
// (nc itself in ModeAuthenticated, TLS over it in ModeEncrypted) and the
// server's identity. Dial uses it; fuzzers and tools that write raw frames
// behind authentication use it directly.
func ClientHandshake(ctx context.Context, nc net.Conn, sec Security) (net.Conn, identity.Identity, error) {
	if err := sec.check(); err != nil {
		return nil, identity.Identity{}, err
	}
	return clientHandshake(ctx, nc, sec)
}
