package mdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/pkg/api"
)

// RetryTimeout bounds how long a call without a context deadline keeps
// trying when no MDS answers.
const RetryTimeout = 15 * time.Second

// AttemptTimeout bounds one attempt on one MDS; a hung MDS is then treated
// like an unreachable one.
const AttemptTimeout = 5 * time.Second

// Errors returned by the package.
var (
	// ErrNoAddresses: Dial was given no MDS address.
	ErrNoAddresses = errors.New("mdsclient: no MDS addresses")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("mdsclient: client closed")
	// ErrTLSMismatch: the client dials without TLS and the MDS requires it,
	// or the reverse. Calls fail with it at once (wrapped in a gRPC
	// FailedPrecondition status) instead of retrying until their deadline.
	ErrTLSMismatch = errors.New("mdsclient: TLS mismatch with the MDS")
)

// activePrefix is how a standby MDS names the active one in its
// Unavailable message.
const activePrefix = "active is "

// Client calls the active MDS out of a list; see the package doc.
type Client struct {
	addrs []string
	tls   bool // dials with TLS
	conns []*grpc.ClientConn
	stubs []api.MDSClient

	mu     sync.Mutex
	last   int // index of the MDS that answered last
	closed bool
}

var _ api.MDSClient = (*Client)(nil)

// Dial prepares connections to every address (host:port). It does not wait
// for any of them: connections are made on first use.
//
// tlsCfg carries the caller's certificate and checks the MDS's (in basalt,
// identity.Config.ClientTLS(identity.RoleMDS): mutual TLS 1.3, the server
// must hold an mds certificate of the same cluster CA). nil dials without
// TLS, which only an MDS started with --insecure (a test) accepts.
func Dial(addrs []string, tlsCfg *tls.Config) (*Client, error) {
	var clean []string
	for _, a := range addrs {
		for _, p := range strings.Split(a, ",") {
			if p = strings.TrimSpace(p); p != "" {
				clean = append(clean, p)
			}
		}
	}
	if len(clean) == 0 {
		return nil, ErrNoAddresses
	}
	c := &Client{addrs: clean, tls: tlsCfg != nil}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	for _, a := range clean {
		cc, err := grpc.NewClient(a,
			grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: 2 * time.Second,
			}))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("mdsclient: %s: %w", a, err)
		}
		c.conns = append(c.conns, cc)
		c.stubs = append(c.stubs, api.NewMDSClient(cc))
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	var first error
	for _, cc := range c.conns {
		if err := cc.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Active returns the address of the MDS that answered last (or the first
// address before any call).
func (c *Client) Active() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addrs[c.last]
}

// call runs fn against the active MDS, failing over as the package doc
// describes.
func (c *Client) call(ctx context.Context, fn func(context.Context, api.MDSClient) error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, RetryTimeout)
		defer cancel()
	}
	wait := 100 * time.Millisecond
	var lastErr error
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return ErrClosed
		}
		start := c.last
		c.mu.Unlock()

		tried := make([]bool, len(c.addrs))
		next := start
		for n := 0; n < len(c.addrs); n++ {
			tried[next] = true
			actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
			began := time.Now()
			err := fn(actx, c.stubs[next])
			cancel()
			if code := status.Code(err); (ctx.Err() != nil || callersDeadline(ctx, actx)) &&
				(code == codes.DeadlineExceeded || code == codes.Canceled) {
				// The caller's context ended during this attempt: say what the
				// MDSes said before, as when it ends between attempts.
				if code == codes.DeadlineExceeded && len(c.addrs) > 1 && time.Since(began) >= heldMin {
					// This MDS held the call until the caller's deadline: it
					// may hang (paused, cut off) while another is active.
					// The next call starts at the next address, or callers
					// whose deadlines are shorter than AttemptTimeout would
					// wait on it for as long as it hangs.
					c.mu.Lock()
					if c.last == start {
						c.last = (next + 1) % len(c.addrs)
					}
					c.mu.Unlock()
				}
				if lastErr == nil {
					lastErr = err
				}
				return gaveUp(ctx, lastErr)
			}
			hung := status.Code(err) == codes.DeadlineExceeded
			if hung {
				// This MDS hangs (paused, partitioned): try another.
				err = status.Error(codes.Unavailable, err.Error())
			}
			if !hung && status.Code(err) == codes.Unavailable && !strings.Contains(status.Convert(err).Message(), activePrefix) {
				// Unreachable, or it does not speak our protocol: a client
				// without TLS against a TLS MDS (or the reverse) would
				// retry until its deadline; tell the operator now.
				if merr := c.mismatch(ctx, c.addrs[next]); merr != nil {
					return status.Error(codes.FailedPrecondition, merr.Error())
				}
			}
			if status.Code(err) != codes.Unavailable {
				if err == nil || status.Code(err) != codes.Canceled && status.Code(err) != codes.DeadlineExceeded {
					c.mu.Lock()
					c.last = next
					c.mu.Unlock()
				}
				return err
			}
			lastErr = err
			if ctx.Err() != nil {
				return gaveUp(ctx, lastErr)
			}
			// Prefer the active MDS a standby named, if we know it.
			next = -1
			if i := c.named(err); i >= 0 && !tried[i] {
				next = i
			} else {
				for k := 1; k <= len(c.addrs); k++ {
					if i := (start + k) % len(c.addrs); !tried[i] {
						next = i
						break
					}
				}
			}
			if next < 0 {
				break
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return gaveUp(ctx, lastErr)
		case <-t.C:
		}
		wait = min(wait*2, time.Second)
	}
}

// probeTimeout bounds mismatch's probe.
const probeTimeout = 2 * time.Second

// mismatch probes addr with a TLS handshake that checks nothing and
// returns an ErrTLSMismatch when the server's answer shows it speaks TLS and
// c does not, or the reverse; nil when it cannot tell (no answer, or the
// modes agree).
func (c *Client) mismatch(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil // unreachable: the caller retries
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	// Only to learn whether a TLS server answers: no certificate is
	// trusted on this connection and nothing is sent over it.
	tc := tls.Client(nc, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a probe, see above
	herr := tc.HandshakeContext(ctx)
	var rec tls.RecordHeaderError
	var alert tls.AlertError
	speaksTLS := herr == nil || errors.As(herr, &alert)
	plain := errors.As(herr, &rec)
	switch {
	case speaksTLS && !c.tls:
		return fmt.Errorf("%w: the MDS at %s requires TLS and this client dials without it (--insecure): "+
			"give it a certificate of the cluster CA instead (--tls-dir DIR; docs/security.md)", ErrTLSMismatch, addr)
	case plain && c.tls:
		return fmt.Errorf("%w: the MDS at %s speaks no TLS (it runs with --insecure) and this client dials with TLS: "+
			"run the MDS with --tls-dir, or (tests only) this client with --insecure", ErrTLSMismatch, addr)
	}
	return nil
}

// named returns the index of the address a standby's error names as active,
// or -1.
func (c *Client) named(err error) int {
	msg := status.Convert(err).Message()
	i := strings.Index(msg, activePrefix)
	if i < 0 {
		return -1
	}
	addr := strings.TrimSpace(msg[i+len(activePrefix):])
	for k, a := range c.addrs {
		if a == addr {
			return k
		}
	}
	return -1
}

// callersDeadline reports whether the attempt context actx ended with the
// caller's ctx. The MDS gets the deadline too and may end the call a
// moment before ctx's own timer fires, so ctx.Err() alone can miss it.
func callersDeadline(ctx, actx context.Context) bool {
	dl, ok := ctx.Deadline()
	adl, _ := actx.Deadline()
	return ok && !adl.Before(dl) && time.Until(dl) < deadlineSlack
}

// heldMin: an attempt that the caller's deadline ended after this long was
// held by its MDS (which may hang); one that ended sooner says nothing of
// the MDS (its caller gave it no time) and must not send the next call,
// another caller's, away from a healthy active MDS.
const heldMin = 500 * time.Millisecond

// deadlineSlack: an attempt that failed this close to the caller's deadline
// ended on it; one that failed earlier is an MDS's answer, and another MDS is
// tried.
const deadlineSlack = 50 * time.Millisecond

// gaveUp is the error of a call whose context ended while no MDS answered:
// the context's code (DeadlineExceeded or Canceled), with the last MDS
// error in the message.
func gaveUp(ctx context.Context, last error) error {
	code := codes.DeadlineExceeded
	if errors.Is(ctx.Err(), context.Canceled) {
		code = codes.Canceled
	}
	return status.Errorf(code, "mdsclient: no active MDS answered in time; last error: %s", status.Convert(last).Message())
}
