package iscsi

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi/scsi"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/reservation"
)

// IQNPrefix starts every target name: iqn.2026-11.io.basalt:CLUSTER:VOLUME.
const IQNPrefix = "iqn.2026-11.io.basalt:"

// TargetName is the IQN of volume in cluster.
func TargetName(cluster, volume string) string { return IQNPrefix + cluster + ":" + volume }

// ErrBadConfig: NewServer was given an unusable Config.
var ErrBadConfig = errors.New("iscsi: bad config")

// Config configures a Server. Exports and Cluster are required.
type Config struct {
	// Exports attaches sessions to volumes; every session to one volume shares
	// its backend.
	Exports *frontend.Exports
	// Cluster names the cluster in target names (TargetName).
	Cluster string
	Logger  *slog.Logger // default slog.Default()

	// CHAP, if set, is required of every login (security negotiation), for
	// every target without its own (TargetCHAP); nil: no authentication.
	CHAP *CHAP
	// TargetCHAP, if set, returns the CHAP a volume's target requires (kept
	// in the MDS; access.Node reads it through a short cache), asked at
	// each normal session's login. A target's own credentials take
	// precedence over CHAP; nil, nil: it has none, and CHAP applies. An
	// error refuses the login with status 0x0301 (service unavailable,
	// which initiators retry): not knowing a target's CHAP fails closed.
	// Discovery sessions use CHAP alone.
	TargetCHAP func(ctx context.Context, volume string) (*CHAP, error)
	// Initiators, if not empty, are the only initiator names (IQNs, compared
	// case-insensitively) allowed to log in to a normal session; others are
	// refused with "authorization failure". Discovery is open to all.
	Initiators []string
	// Digests allows CRC32C header and data digests when the initiator
	// offers them; default (false) accepts both.
	NoDigests bool

	// Reservations keeps the volumes' persistent reservations; every
	// access node serving a volume must share one (the MDS's, behind a
	// reservation.Cached). Default: a store of this process alone.
	Reservations reservation.Store
	// TargetPort is this target's relative target port identifier in
	// persistent reservations: give each access node its own (1-65535).
	// Default 1.
	TargetPort uint16

	// LoginTimeout bounds a whole login, from the first byte to the last
	// login response, including opening the volume. Default 15 s.
	LoginTimeout time.Duration
	// WriteTimeout bounds one write of responses: an initiator that stops
	// reading for that long is disconnected. Default 60 s.
	WriteTimeout time.Duration
	// MaxCommands is the command window of a session (MaxCmdSN - ExpCmdSN +
	// 1 when idle). Default 64.
	MaxCommands int
	// MaxSessionBytes bounds the data buffers of a session's commands in
	// flight; a command that would pass it (when others hold buffers) gets TASK
	// SET FULL. Default 128 MiB.
	MaxSessionBytes int64
	// MaxTransfer is the largest READ or WRITE (the Block Limits page).
	// Default 32 MiB.
	MaxTransfer int
	// MaxRecvDataSegment is the MaxRecvDataSegmentLength this target
	// declares. Default 256 KiB.
	MaxRecvDataSegment int

	// MayWrite, if set, says whether the initiator (its name, as it logged
	// in) may write volume (take its writer role): a session asks before
	// its first command that writes (WRITE, WRITE AND VERIFY, WRITE SAME,
	// UNMAP, COMPARE AND WRITE), inline, and again in the background once
	// the answer is MayWriteTTL old, the writes going on with the last
	// answer meanwhile (frontend.WriteGate); a new session (an initiator
	// that logged in again) always asks afresh. An initiator that may not
	// write gets CHECK CONDITION, DATA PROTECT, LOGICAL UNIT ACCESS NOT
	// AUTHORIZED and its write never reaches the volume, so it cannot
	// fence the writer; it still reads (docs/iscsi.md "Fenced initiators
	// stay fenced"). With no answer yet and an error, the write gets NOT
	// READY, BECOMING READY (the initiator retries). nil: every allowed
	// initiator may write.
	MayWrite    frontend.MayWriteFunc
	MayWriteTTL time.Duration // default 5 s

	// Redirect, if set, makes this portal a redirector: it serves no
	// volume; a normal session's login is answered "target moved
	// temporarily" (RFC 7143 11.13.5) with the portal Redirect chooses
	// for the target, and SendTargets lists every portal it knows for
	// every target (for multipath). Exports is still needed: it says
	// which targets exist.
	Redirect Redirector
}

// Redirector chooses access nodes' portals for a redirector (Config.Redirect).
type Redirector interface {
	// Portal returns the portal (host:port) a login to the volume's target
	// goes to.
	Portal(ctx context.Context, volume string) (string, error)
	// Portals returns every portal that serves targets (host:port).
	Portals(ctx context.Context) ([]string, error)
}

func (c *Config) setDefaults() error {
	if c.Exports == nil {
		return fmt.Errorf("%w: Exports is nil", ErrBadConfig)
	}
	if c.Cluster == "" || strings.ContainsAny(c.Cluster, ": ") {
		return fmt.Errorf("%w: cluster name %q must be non-empty, without ':' or spaces", ErrBadConfig, c.Cluster)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Reservations == nil {
		c.Reservations = reservation.NewMemStore()
	}
	if c.TargetPort == 0 {
		c.TargetPort = 1
	}
	if c.LoginTimeout <= 0 {
		c.LoginTimeout = 15 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 60 * time.Second
	}
	if c.MaxCommands <= 0 {
		c.MaxCommands = 64
	}
	if c.MaxSessionBytes <= 0 {
		c.MaxSessionBytes = 128 << 20
	}
	if c.MaxTransfer <= 0 {
		c.MaxTransfer = 32 << 20
	}
	if c.MayWriteTTL <= 0 {
		c.MayWriteTTL = 5 * time.Second
	}
	if c.MaxRecvDataSegment <= 0 {
		c.MaxRecvDataSegment = 256 << 10
	}
	c.MaxRecvDataSegment = min(max(c.MaxRecvDataSegment, 512), 1<<24-1)
	if c.CHAP != nil && (c.CHAP.User == "" || c.CHAP.Secret == "") {
		return fmt.Errorf("%w: CHAP needs a user and a secret", ErrBadConfig)
	}
	return nil
}

// Server is an iSCSI target over an Exports: one target per volume, LUN 0.
type Server struct {
	cfg   Config
	log   *slog.Logger
	conns *frontend.Conns
	ctx   context.Context // ends at Shutdown or Close: cuts short a login waiting for a volume

	// groups are the open LUs of each volume in this process (unit
	// attentions, COMPARE AND WRITE), while any is open.
	groupMu sync.Mutex
	groups  map[string]*volumeGroup

	// mu guards the fields below.
	mu       sync.Mutex
	tsih     uint16
	sessions map[sessionKey]*conn // logged-in normal sessions, for reinstatement
}

// sessionKey identifies a session: the initiator's name and ISID (and the
// target: the same ISID may be used towards different targets).
type sessionKey struct {
	initiator, target string
	isid              [6]byte
}

// NewServer checks cfg and returns a Server.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, groups: map[string]*volumeGroup{}, sessions: map[sessionKey]*conn{}}
	s.conns = frontend.NewConns(frontend.ConnsConfig{
		Protocol: "iscsi", Logger: cfg.Logger,
		New: func(nc net.Conn) frontend.Conn { return newConn(s, nc) },
	})
	s.ctx = s.conns.Context()
	return s, nil
}

// volumeOf returns the volume a target name names, or false.
func (s *Server) volumeOf(target string) (string, bool) {
	prefix := IQNPrefix + s.cfg.Cluster + ":"
	if len(target) <= len(prefix) || !strings.EqualFold(target[:len(prefix)], prefix) {
		return "", false
	}
	return target[len(prefix):], true
}

func (s *Server) allowed(initiator string) bool {
	if len(s.cfg.Initiators) == 0 {
		return true
	}
	for _, a := range s.cfg.Initiators {
		if strings.EqualFold(a, initiator) {
			return true
		}
	}
	return false
}

// volumeGroup is a volume's LUs in this process and its subscription to the
// volume's size.
type volumeGroup struct {
	lus *scsi.Group
	// unwatch ends the subscription (frontend.Exports.WatchSize). The
	// watch keeps the open backend's size fresh; each LU reads it for every
	// command and reports a change once to its session, as a CAPACITY DATA
	// HAS CHANGED unit attention, so the watch needs no callback.
	unwatch func()
}

// openLU opens a session's logical unit for volume in the volume's group;
// the first one subscribes the group to the volume's size.
func (s *Server) openLU(volume string, cfg scsi.Config) *scsi.LU {
	s.groupMu.Lock()
	defer s.groupMu.Unlock()
	g := s.groups[volume]
	if g == nil {
		g = &volumeGroup{lus: scsi.NewGroup(), unwatch: s.cfg.Exports.WatchSize(volume, nil)}
		s.groups[volume] = g
	}
	cfg.Group = g.lus
	return scsi.New(cfg)
}

// closeLU closes a session's logical unit; the volume's last one ends the
// group and its subscription.
func (s *Server) closeLU(volume string, lu *scsi.LU) {
	// The I_T nexus is gone: so is an SPC-2 reservation it held (SPC-2
	// 5.5.1); an unreachable store keeps it until a reset or RELEASE.
	_ = lu.ReleaseSPC2(false)
	s.groupMu.Lock()
	defer s.groupMu.Unlock()
	lu.Close()
	if g := s.groups[volume]; g != nil && g.lus.Len() == 0 {
		g.unwatch()
		delete(s.groups, volume)
	}
}

// volumeID is the stable 64-bit identity of a volume's logical unit.
func (s *Server) volumeID(volume string) uint64 {
	h := sha256.Sum256([]byte(s.cfg.Cluster + "\x00" + volume))
	return binary.BigEndian.Uint64(h[:])
}

// register records a new normal session, gives c its TSIH, and returns the
// connection of an older session with the same key, which it replaces
// (session reinstatement: the caller closes it).
func (s *Server) register(k sessionKey, c *conn) (old *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tsih++
	if s.tsih == 0 {
		s.tsih = 1
	}
	c.tsih, c.since = s.tsih, time.Now()
	old = s.sessions[k]
	s.sessions[k] = c
	return old
}

// SessionInfo describes one logged-in normal session (one connection).
type SessionInfo struct {
	Initiator, Target, Remote string
	ISID                      [6]byte
	TSIH                      uint16
	Since                     time.Time
	HeaderDigest, DataDigest  bool
}

// Sessions lists the logged-in normal sessions, oldest first.
func (s *Server) Sessions() []SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SessionInfo, 0, len(s.sessions))
	for _, c := range s.sessions {
		out = append(out, SessionInfo{Initiator: c.initiator, Target: c.target, Remote: c.nc.RemoteAddr().String(),
			ISID: c.isid, TSIH: c.tsih, Since: c.since, HeaderDigest: c.headerDigest, DataDigest: c.dataDigest})
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return a.Since.Compare(b.Since) })
	return out
}

func (s *Server) unregister(k sessionKey, c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[k] == c {
		delete(s.sessions, k)
	}
}

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = frontend.ErrServerClosed

// Serve accepts connections on ln until Shutdown or Close (then it returns
// ErrServerClosed); it may run for several listeners at once and closes ln
// when it returns.
func (s *Server) Serve(ln net.Listener) error { return s.conns.Serve(ln) }

// ServeConn serves one accepted connection until it ends.
func (s *Server) ServeConn(nc net.Conn) error { return s.conns.ServeConn(nc) }

// Shutdown stops accepting and ends every connection gracefully: the
// commands already read are answered, then the connection closes. If ctx
// ends first, the rest are closed hard.
func (s *Server) Shutdown(ctx context.Context) error { return s.conns.Shutdown(ctx) }

// Close stops accepting and closes every connection at once; commands in the
// backend still complete before their sessions detach. It returns when every
// connection ended.
func (s *Server) Close() error { return s.conns.Close() }
