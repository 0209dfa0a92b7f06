package nbd

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
)

// Config configures a Server. Only Exports is required.
type Config struct {
	// Exports attaches connections to exports (export name = volume name); every
	// connection to one name shares its backend, so the server advertises
	// CAN_MULTI_CONN. The block sizes and optional commands advertised are the
	// backend's (frontend.Info).
	Exports *frontend.Exports
	// Logger; default slog.Default().
	Logger *slog.Logger
	// MaxInFlight bounds the requests of one connection that are parsed but not yet
	// answered; when it is reached the server stops reading. Default 128.
	MaxInFlight int
	// MaxInFlightBytes bounds the payload bytes (read and write buffers) of one
	// connection's in-flight requests; one request may always proceed. Default 128 MiB.
	MaxInFlightBytes int64
	// MaxPayload is the largest READ or WRITE length this server takes (the
	// advertised maximum block size is the smaller of it and the backend's).
	// Default and upper bound maxPayload (32 MiB), lower bound 4 KiB.
	MaxPayload uint32
	// HandshakeTimeout bounds each option of the handshake (the timer restarts
	// per option; at most maxOptions options), including the wait for an
	// export's backend to open. Default 30 s.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds one batch of replies: a client that stops reading for
	// that long is disconnected, so it cannot pin buffers and goroutines. An
	// idle client is never timed out. Default 60 s.
	WriteTimeout time.Duration
	// Metrics, if set, records per-request latencies (NewMetrics).
	Metrics *Metrics

	// TLS is the server side of NBD_OPT_STARTTLS on listeners served with a
	// policy other than TLSOff (ServeTLS). It must require and verify a
	// client certificate: basalt passes identity.Config.ServerTLS, TLS 1.3
	// against the cluster CA and its revocation list.
	TLS *tls.Config
	// TLSRecheck, if set, is asked about each TLS client every second while
	// it is in transmission; an error disconnects it (a certificate revoked
	// or expired after the handshake).
	TLSRecheck func(tls.ConnectionState) error

	// MayWrite, if set, says whether Host — the one client this server has,
	// a CSI node's kernel behind the node plugin's own socket — may write
	// an export (take its writer role): package access answers from the
	// volume's attachments in the MDS, so a node the volume was published
	// away from stays fenced when its kernel reconnects. Asked at a
	// connection's first write, trim or write-zeroes (holding its next
	// requests), then once per MayWriteTTL (default 5 s) in the background
	// (frontend.WriteGate). A refused request gets EPERM; with no answer yet
	// and the MDS away, EIO.
	MayWrite    frontend.MayWriteFunc
	Host        string
	MayWriteTTL time.Duration
}

func (c *Config) setDefaults() error {
	if c.Exports == nil {
		return fmt.Errorf("%w: Exports is nil", ErrBadConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 128
	}
	if c.MaxInFlightBytes <= 0 {
		c.MaxInFlightBytes = 128 << 20
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = maxPayload
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 30 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 60 * time.Second
	}
	if c.MayWriteTTL <= 0 {
		c.MayWriteTTL = 5 * time.Second
	}
	if c.MaxPayload > maxPayload || c.MaxPayload < 4096 {
		return fmt.Errorf("%w: MaxPayload %d is not between 4 KiB and 32 MiB", ErrBadConfig, c.MaxPayload)
	}
	return nil
}

// maxPayload bounds Config.MaxPayload: 32 MiB, the largest request the NBD
// protocol recommends a client to send.
const maxPayload = 32 << 20

// Server serves exports over NBD on any number of listeners (TCP, Unix). The
// accept loops, the set of connections and shutdown are frontend.Conns'.
type Server struct {
	cfg Config
	log *slog.Logger

	reqPool sync.Pool // *request

	conns *frontend.Conns
	// ctx ends when Shutdown or Close begins: it cuts short a handshake that
	// waits for an export to open.
	ctx context.Context
}

// NewServer checks cfg and returns a Server; it listens on nothing until Serve.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	s.conns = frontend.NewConns(frontend.ConnsConfig{
		Protocol: "nbd",
		Logger:   cfg.Logger,
		New:      func(nc net.Conn) frontend.Conn { return newConn(s, nc) },
	})
	s.ctx = s.conns.Context()
	s.reqPool.New = func() any {
		r := &request{}
		r.doneFn = r.complete
		return r
	}
	return s, nil
}

// Serve accepts connections on ln until Shutdown or Close (TLSOff: see
// ServeTLS), and then returns ErrServerClosed; any other accept failure is returned as is. It may be called
// concurrently for several listeners. Serve closes ln when it returns.
func (s *Server) Serve(ln net.Listener) error { return s.conns.Serve(ln) }

// ServeConn serves one already accepted connection (for example a socket handed
// over by a previous process) and returns when it is closed.
func (s *Server) ServeConn(nc net.Conn) error { return s.conns.ServeConn(nc) }

// Shutdown stops accepting, closes connections still in the handshake, lets each
// connection in transmission finish and answer the requests it already read
// (requests still buffered are answered NBD_ESHUTDOWN), and closes it. If ctx ends
// first, the remaining connections are closed hard (as by Close) and ctx.Err()
// is returned.
func (s *Server) Shutdown(ctx context.Context) error { return s.conns.Shutdown(ctx) }

// Close stops accepting and closes every connection at once; requests in flight
// still complete in the backend (their buffers are only reused after that), but
// their replies are dropped. It returns when every connection goroutine ended.
func (s *Server) Close() error { return s.conns.Close() }

func (s *Server) getRequest() *request { return s.reqPool.Get().(*request) }
