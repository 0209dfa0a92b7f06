package nbd

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/basalt-storage/basalt/internal/sockio"
)

// TLSPolicy says what one listener offers with NBD_OPT_STARTTLS.
type TLSPolicy int

const (
	// TLSOff: no TLS; NBD_OPT_STARTTLS is answered NBD_REP_ERR_UNSUP.
	TLSOff TLSPolicy = iota
	// TLSAllow: a client may upgrade with NBD_OPT_STARTTLS or stay in
	// plaintext (the kernel's nbd-client, nbdfuse without certificates).
	TLSAllow
	// TLSRequire: the spec's "forced TLS". Before NBD_OPT_STARTTLS every
	// option but NBD_OPT_ABORT is answered NBD_REP_ERR_TLS_REQD, and
	// NBD_OPT_EXPORT_NAME (which cannot be answered with an error) closes the
	// connection: no export is named, described or attached in plaintext.
	TLSRequire
)

var policyNames = [...]string{TLSOff: "off", TLSAllow: "allow", TLSRequire: "require"}

func (p TLSPolicy) String() string {
	if p < 0 || int(p) >= len(policyNames) {
		return fmt.Sprintf("TLSPolicy(%d)", int(p))
	}
	return policyNames[p]
}

// ParseTLSPolicy parses "off", "allow" or "require".
func ParseTLSPolicy(s string) (TLSPolicy, error) {
	for p, n := range policyNames {
		if s == n {
			return TLSPolicy(p), nil
		}
	}
	return TLSOff, fmt.Errorf("%w: TLS policy %q is not off, allow or require", ErrBadConfig, s)
}

// recheckEvery is how often a TLS connection's peer is asked about again
// (Config.TLSRecheck) while it lives.
var recheckEvery = time.Second

// ServeTLS is Serve with a TLS policy for the connections of ln. A policy
// other than TLSOff needs Config.TLS.
func (s *Server) ServeTLS(ln net.Listener, p TLSPolicy) error {
	if err := s.checkPolicy(p); err != nil {
		ln.Close()
		return err
	}
	if p == TLSOff {
		return s.conns.Serve(ln)
	}
	return s.conns.Serve(policyListener{ln, p})
}

// ServeConnTLS is ServeConn with a TLS policy.
func (s *Server) ServeConnTLS(nc net.Conn, p TLSPolicy) error {
	if err := s.checkPolicy(p); err != nil {
		nc.Close()
		return err
	}
	return s.conns.ServeConn(policyConn{nc, p})
}

func (s *Server) checkPolicy(p TLSPolicy) error {
	if p < TLSOff || p > TLSRequire {
		return fmt.Errorf("%w: %v", ErrBadConfig, p)
	}
	if p != TLSOff && s.cfg.TLS == nil {
		return fmt.Errorf("%w: TLS policy %v without Config.TLS", ErrBadConfig, p)
	}
	return nil
}

// policyListener tags each accepted connection with its listener's policy;
// newConn unwraps it (so sockio still sees the socket).
type policyListener struct {
	net.Listener
	p TLSPolicy
}

func (l policyListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return policyConn{nc, l.p}, nil
}

type policyConn struct {
	net.Conn
	p TLSPolicy
}

// startTLS answers NBD_OPT_STARTTLS with NBD_REP_ACK and runs the server
// side of the TLS handshake (Config.TLS verifies the client's certificate).
// From then on the handshake and transmission speak through the TLS
// connection; c.nc stays the socket (deadlines, Close).
func (c *conn) startTLS(w *bufio.Writer) error {
	// A client must wait for the ACK before it starts TLS: bytes already
	// buffered were sent in plaintext after STARTTLS and would be taken as
	// if they came through TLS (the STARTTLS injection attack).
	if c.br.Buffered() != 0 {
		return fmt.Errorf("%w: %d bytes after NBD_OPT_STARTTLS before its reply", ErrProtocol, c.br.Buffered())
	}
	optReply(w, optStartTLS, repAck, nil)
	if err := w.Flush(); err != nil {
		return err
	}
	tc := tls.Server(c.nc, c.s.cfg.TLS)
	c.deadline()
	if err := tc.HandshakeContext(c.s.ctx); err != nil {
		return fmt.Errorf("nbd: TLS handshake: %w", err)
	}
	c.tls = tc
	c.stream = tc
	c.br.Reset(tc)
	w.Reset(tc)
	c.w = sockio.NewWriter(tc)
	st := tc.ConnectionState()
	c.peer = peerName(st)
	c.log = c.log.With("peer", c.peer)
	c.log.Debug("nbd: TLS established", "version", tls.VersionName(st.Version))
	return nil
}

// peerName names a TLS client by its certificate: its first URI SAN (a
// basalt identity) or else its subject.
func peerName(st tls.ConnectionState) string {
	if len(st.PeerCertificates) == 0 {
		return "anonymous"
	}
	leaf := st.PeerCertificates[0]
	if len(leaf.URIs) > 0 {
		return leaf.URIs[0].String()
	}
	return leaf.Subject.String()
}

// recheckLoop asks Config.TLSRecheck about the peer every recheckEvery and
// closes the socket when it says no (a certificate revoked since the
// handshake); it returns when stop is closed.
func (c *conn) recheckLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(recheckEvery)
	defer t.Stop()
	st := c.tls.ConnectionState()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if err := c.s.cfg.TLSRecheck(st); err != nil {
			c.log.Warn("nbd: the client's certificate is no longer accepted; disconnecting", "err", err)
			c.nc.Close()
			return
		}
	}
}
