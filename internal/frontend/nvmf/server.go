package nvmf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/reservation"
)

// Errors of the server.
var (
	// ErrServerClosed is returned by Serve after Shutdown or Close.
	ErrServerClosed = frontend.ErrServerClosed
	// ErrBadConfig is returned by NewServer for an invalid Config.
	ErrBadConfig = errors.New("nvmf: invalid config")
	// ErrProtocol wraps every host protocol violation that ends a connection.
	ErrProtocol = errors.New("nvmf: protocol violation")
)

// Config configures a Server. Only Exports is required.
type Config struct {
	// Exports attaches controllers to volumes: the I/O subsystem
	// VolumeNQNPrefix+NAME has one namespace (NSID 1), the volume NAME.
	Exports *frontend.Exports
	Logger  *slog.Logger // default slog.Default()
	// AllowedHosts lists the host NQNs that may connect to I/O subsystems and
	// see them in the discovery log; empty: every host.
	AllowedHosts []string
	// VolumeHostAllowed, if set, says whether the host hostNQN may connect
	// to volume's subsystem by the volume's own allow-list (the MDS's:
	// `basalt volume allow-host`); a host must pass AllowedHosts as well.
	// It is asked at every admin queue's Connect to an I/O subsystem (for a
	// group, of each of its volumes) and for every subsystem a discovery
	// log would list. An error refuses the Connect with Controller Busy
	// (the host retries) and leaves the subsystem out of the log.
	// Controllers already connected stay when a list changes, as nvmet's
	// do. nil: every volume allows every host.
	VolumeHostAllowed func(ctx context.Context, volume, hostNQN string) (bool, error)
	// QueueSize is the largest queue a host may create (CAP.MQES+1, MAXCMD).
	// Default and upper bound 128.
	QueueSize int
	// MaxTransfer is the largest data transfer of one command (MDTS), a power
	// of two from 4 KiB to 1 MiB. Default 128 KiB. A connection holds at most
	// QueueSize commands, so at most QueueSize*MaxTransfer bytes of buffers.
	MaxTransfer int
	// InCapsuleData is the in-capsule data an I/O queue accepts. Default 8 KiB.
	InCapsuleData int
	// MaxH2CData is the largest H2CData PDU the host may send. Default 128 KiB.
	MaxH2CData int
	// R2TChunk is the most data one R2T asks for; a larger write takes
	// several R2Ts in turn. Default MaxTransfer.
	R2TChunk int
	// ConnectTimeout bounds the wait from accept to a connected queue, and the
	// open of a volume at Connect. Default 30 s.
	ConnectTimeout time.Duration
	// WriteTimeout: a host that reads nothing for that long is disconnected.
	// Default 60 s.
	WriteTimeout time.Duration
	// KeepAliveGrace is added to twice the host's KATO before a silent
	// controller is ended: a host on a loaded machine (or an emulated CPU)
	// sends its keep-alives late. Default 10 s; negative: none.
	KeepAliveGrace time.Duration
	// AdvertiseAddr is the address the discovery log gives for the I/O
	// subsystems (host:port); default the address the host connected to.
	AdvertiseAddr string
	// Multipath makes this server one access node of several that export
	// the same subsystems (docs/nvmf.md): the ANA states and the discovery
	// log's ports come from SetPaths, a volume is attached at a
	// controller's first I/O command rather than at Connect, and
	// controller ids are NodeID%15<<12 | 1..0xfff, so that the access nodes
	// of a cluster (ids unique mod 15) give out distinct ones.
	Multipath bool
	NodeID    uint64
	// HostsChanged, if set, is called (on its own goroutine) when a
	// controller of an I/O subsystem is created or ends: Hosts changed.
	HostsChanged func()
	// Reservations keeps the volumes' reservations (NVMe Reservation
	// Register/Acquire/Release/Report), shared with the iSCSI target's
	// persistent reservations; every access node must share one (the
	// MDS's). Default: a store of this process alone.
	Reservations reservation.Store
	// MayWrite, if set, says whether the host hostNQN may write volume (take
	// its writer role): it is asked before a controller's first write,
	// write-zeroes or deallocate to a namespace, and again once the answer
	// is MayWriteTTL old, so a new controller (a host that reconnected)
	// always asks afresh. A host that may not write gets ANA Inaccessible
	// with DNR and its write never reaches the volume, so it cannot fence
	// the writer (docs/nvmf.md "Fenced hosts stay fenced"). An error keeps
	// the last answer; with none yet the write gets Namespace Not Ready (the
	// host retries). nil: every allowed host may write.
	MayWrite    func(ctx context.Context, volume, hostNQN string) (bool, error)
	MayWriteTTL time.Duration // default 5 s
	// ReservationCheck is how often the reservation states of the
	// namespaces whose host is registered are read to find reservation
	// notifications for it (another host preempted or released); every
	// namespace's every tenth time. Default 1 s (the reservation cache's
	// TTL on an access node).
	ReservationCheck time.Duration
	// DiscoveryCheck is how often the discovery logs of the discovery
	// controllers that enabled change notices are rebuilt to find a change
	// (a volume created or deleted, an allow-list edited) and notify their
	// hosts; SetPaths rebuilds them at once. Default 5 s.
	DiscoveryCheck time.Duration
}

func (c *Config) setDefaults() error {
	if c.Exports == nil {
		return fmt.Errorf("%w: Exports is nil", ErrBadConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Reservations == nil {
		c.Reservations = reservation.NewMemStore()
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 128
	}
	if c.MaxTransfer == 0 {
		c.MaxTransfer = 128 << 10
	}
	if c.InCapsuleData <= 0 {
		c.InCapsuleData = 8 << 10
	}
	if c.MaxH2CData <= 0 {
		c.MaxH2CData = 128 << 10
	}
	if c.R2TChunk <= 0 || c.R2TChunk > c.MaxTransfer {
		c.R2TChunk = c.MaxTransfer
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 30 * time.Second
	}
	if c.ReservationCheck <= 0 {
		c.ReservationCheck = time.Second
	}
	if c.DiscoveryCheck <= 0 {
		c.DiscoveryCheck = 5 * time.Second
	}
	if c.MayWriteTTL <= 0 {
		c.MayWriteTTL = 5 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 60 * time.Second
	}
	switch {
	case c.KeepAliveGrace == 0:
		c.KeepAliveGrace = 10 * time.Second
	case c.KeepAliveGrace < 0:
		c.KeepAliveGrace = 0
	}
	switch {
	case c.QueueSize > 128 || c.QueueSize < 2:
		return fmt.Errorf("%w: QueueSize %d is not between 2 and 128", ErrBadConfig, c.QueueSize)
	case c.MaxTransfer < 4096 || c.MaxTransfer > 1<<20 || c.MaxTransfer&(c.MaxTransfer-1) != 0:
		return fmt.Errorf("%w: MaxTransfer %d is not a power of two from 4 KiB to 1 MiB", ErrBadConfig, c.MaxTransfer)
	case c.InCapsuleData%16 != 0 || c.InCapsuleData > 64<<10:
		return fmt.Errorf("%w: InCapsuleData %d is not a multiple of 16 up to 64 KiB", ErrBadConfig, c.InCapsuleData)
	case c.MaxH2CData < 4096 || c.MaxH2CData%4 != 0:
		return fmt.Errorf("%w: MaxH2CData %d is below 4 KiB or not a multiple of 4", ErrBadConfig, c.MaxH2CData)
	}
	return nil
}

// Server is an NVMe over TCP target: a discovery controller and one I/O
// subsystem per volume, on any number of listeners.
type Server struct {
	cfg   Config
	log   *slog.Logger
	conns *frontend.Conns

	mu        sync.Mutex
	nextCtrl  uint16
	ctrls     map[uint16]*controller
	paths     Paths  // Multipath: the MDS's assignment (SetPaths)
	anaChange uint64 // ANA change count: bumped by SetPaths when a state changed

	discKick chan struct{} // SetPaths asks watchDiscovery for a refresh
	resvKick chan struct{} // asks watchReservations for a full round
}

// NewServer checks cfg and returns a Server; it listens on nothing until Serve.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, ctrls: map[uint16]*controller{}, discKick: make(chan struct{}, 1),
		resvKick: make(chan struct{}, 1)}
	if cfg.Multipath {
		// A restarted access node keeps its node id: start its controller
		// ids elsewhere in its range, so a host still holding a controller
		// of the previous run is not handed the same id again.
		s.nextCtrl = uint16(rand.IntN(0xfff))
	}
	s.conns = frontend.NewConns(frontend.ConnsConfig{
		Protocol: "nvmf",
		Logger:   cfg.Logger,
		New:      func(nc net.Conn) frontend.Conn { return newConn(s, nc) },
	})
	go s.watchDiscovery()
	go s.watchReservations()
	return s, nil
}

// Serve accepts connections on ln until Shutdown or Close (then it returns
// ErrServerClosed). It may be called for several listeners.
func (s *Server) Serve(ln net.Listener) error { return s.conns.Serve(ln) }

// ServeConn serves one accepted connection and returns when it ended.
func (s *Server) ServeConn(nc net.Conn) error { return s.conns.ServeConn(nc) }

// Shutdown stops accepting, lets every queue answer the commands it already
// read and closes it; after ctx ends the rest is closed hard.
func (s *Server) Shutdown(ctx context.Context) error { return s.conns.Shutdown(ctx) }

// Close closes every connection at once.
func (s *Server) Close() error { return s.conns.Close() }

// hostAllowed reports whether hostNQN may use I/O subsystems.
func (s *Server) hostAllowed(hostNQN string) bool {
	return len(s.cfg.AllowedHosts) == 0 || slices.Contains(s.cfg.AllowedHosts, hostNQN)
}

// mayConnect reports whether hostNQN may connect to the I/O subsystem of
// vols: AllowedHosts and each volume's own allow-list let it.
func (s *Server) mayConnect(ctx context.Context, hostNQN string, vols []string) (bool, error) {
	if !s.hostAllowed(hostNQN) {
		return false, nil
	}
	if s.cfg.VolumeHostAllowed == nil {
		return true, nil
	}
	for _, v := range vols {
		if ok, err := s.cfg.VolumeHostAllowed(ctx, v, hostNQN); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// subsystemVolumes returns the volumes of an I/O subsystem, in NSID order:
// the volume of VolumeNQNPrefix+NAME, or the group's (Paths.Groups). A
// volume in a group is served only through the group: the kernel refuses
// one namespace (one NGUID) in two subsystems.
func (s *Server) subsystemVolumes(nqn string) ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name, ok := volumeOf(nqn); ok {
		return []string{name}, !s.groupedLocked()[name]
	}
	vols, ok := s.paths.Groups[nqn]
	return vols, ok && len(vols) > 0
}

// groupedLocked returns the volumes that belong to a group. Caller holds s.mu.
func (s *Server) groupedLocked() map[string]bool {
	m := map[string]bool{}
	for _, vols := range s.paths.Groups {
		for _, v := range vols {
			m[v] = true
		}
	}
	return m
}

// volumeOf returns the volume name of an I/O subsystem NQN.
func volumeOf(subNQN string) (string, bool) {
	name, ok := strings.CutPrefix(subNQN, VolumeNQNPrefix)
	return name, ok && name != ""
}

// controller is one association: an admin queue and its I/O queues.
type controller struct {
	s         *Server
	id        uint16
	subNQN    string
	hostNQN   string
	hostID    [16]byte
	nexus     reservation.Nexus // hostID's, made once (every IO asks)
	discovery bool
	// nss: NSID i+1 is (*nss)[i], nil where the subsystem has no
	// namespace for this host (a group's volume it may not use); none for
	// discovery. Replaced whole, never changed in place (regroup).
	nss  atomic.Pointer[[]*namespace]
	nn   uint32     // NN and MNAN: the largest NSID the subsystem may have (nnOf)
	rgMu sync.Mutex // serializes regroup

	// lastSeen is updated by every command on any of its queues (TBKAS).
	mu         sync.Mutex
	kato       time.Duration
	lastSeen   time.Time
	cc         uint32
	csts       uint32
	nqueues    uint16 // I/O queues granted (Set Features number of queues)
	aecfg      uint32
	conns      map[*conn]bool
	refs       int // connections attached, until their IO drained
	dead       bool
	stopKA     chan struct{}
	gone       []*namespace // namespaces a group edit removed: detached by the last leave
	aers       []*command   // Asynchronous Event Requests held
	anaPending bool         // an ANA change notice waits for an AER
	anaMasked  bool         // a notice was sent; none until the host reads the ANA log
	nsPending  bool         // a Namespace Attribute Changed notice waits for an AER
	nsMasked   bool         // a notice was sent; none until the host reads the Changed Namespace List
	changedNS  []uint32     // the Changed Namespace List (log page 04h) since the host last read it
	// A discovery controller's log (discovery.go): the address its host
	// reached, the change count and hash of the log it last built, the
	// count its host last read without RAE, and whether a notice was sent
	// since.
	local      string
	discGen    uint64
	discSum    uint64
	discRead   uint64
	discMasked bool
	// Reservation notifications (resvnotify.go): the log page's entries,
	// the last Log Page Count, and whether a notice was sent since the
	// host last read the log without RAE.
	resvLog    []resvEntry
	resvCount  uint64
	resvMasked bool
}

// namespace is one namespace of a controller: a volume.
type namespace struct {
	nsid   uint32
	volume string
	nsInfo
	// nlb is the namespace's size in LBAs: the volume's size at Connect, grown
	// by sizeIs when the volume grows (it never shrinks).
	nlb   atomic.Uint64
	attMu sync.Mutex // serializes attaching (controller.attachment); taken before controller.mu
	// att (under controller.mu) is nil (Multipath) until the first I/O
	// command or after a fenced IO; retired ones are detached by the
	// controller's last leave.
	att     *frontend.Attachment
	retired []*frontend.Attachment

	// write says whether the controller's host may write the volume
	// (Config.MayWrite).
	write *frontend.WriteGate
	// unwatch (under controller.mu) ends its size subscription.
	unwatch func()
	// Reservation notifications, under controller.mu: the store's Seq up
	// to which attentions were looked at (once resvSeen), whether the host
	// was registered then, and the Reservation Notification Mask.
	resvSeen   bool
	resvSeq    uint64
	resvActive bool
	resvMask   uint32
	// fence aborts the commands in flight after a Preempt and Abort of the
	// controller's host (preempt.go).
	fence ioFence
}

// namespace returns the namespace nsid, or nil.
func (c *controller) namespace(nsid uint32) *namespace {
	l := c.namespaces()
	if nsid < 1 || int64(nsid) > int64(len(l)) {
		return nil
	}
	return l[nsid-1]
}

// namespaces returns c's namespaces by NSID (index NSID-1), nil where none.
func (c *controller) namespaces() []*namespace {
	if p := c.nss.Load(); p != nil {
		return *p
	}
	return nil
}

// nsInfo is what a namespace's volume presents.
type nsInfo struct {
	lbaShift uint
	readOnly bool
	info     frontend.Info
}

func (c *controller) touch() {
	c.mu.Lock()
	c.lastSeen = time.Now()
	c.mu.Unlock()
}

// newController registers a controller for an admin queue's Connect.
func (s *Server) newController(c *controller) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	limit, base := uint16(0xffef), uint16(0)
	if s.cfg.Multipath {
		limit, base = 0xfff, uint16(s.cfg.NodeID%15)<<12
	}
	for range limit {
		s.nextCtrl++
		if s.nextCtrl == 0 || s.nextCtrl > limit {
			s.nextCtrl = 1
		}
		if s.ctrls[base|s.nextCtrl] == nil {
			c.id = base | s.nextCtrl
			s.ctrls[c.id] = c
			if !c.discovery {
				s.hostsChanged()
				s.kickReservations() // the new controller's baseline, before any news
			}
			return true
		}
	}
	return false
}

func (s *Server) hostsChanged() {
	if s.cfg.HostsChanged != nil {
		go s.cfg.HostsChanged()
	}
}

func (s *Server) controller(id uint16) *controller {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctrls[id]
}

// join adds a queue's connection to c; false if c is gone.
func (c *controller) join(cn *conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return false
	}
	c.conns[cn] = true
	c.refs++
	return true
}

// kill ends the controller: every queue's connection is closed.
func (c *controller) kill(why string) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.dead = true
	close(c.stopKA)
	conns := make([]*conn, 0, len(c.conns))
	for cn := range c.conns {
		conns = append(conns, cn)
	}
	var unwatch []func()
	for _, ns := range c.namespaces() {
		if ns != nil && ns.unwatch != nil {
			unwatch = append(unwatch, ns.unwatch)
			ns.unwatch = nil
		}
	}
	c.mu.Unlock()
	for _, stop := range unwatch {
		stop()
	}
	c.s.mu.Lock()
	delete(c.s.ctrls, c.id)
	c.s.mu.Unlock()
	if !c.discovery {
		c.s.hostsChanged()
	}
	c.s.log.Info("nvmf: controller ended", "cntlid", c.id, "subnqn", c.subNQN, "hostnqn", c.hostNQN, "why", why)
	for _, cn := range conns {
		cn.nc.Close()
	}
}

// leave drops a connection whose IO has drained; the last one detaches.
func (c *controller) leave(cn *conn) {
	c.mu.Lock()
	delete(c.conns, cn)
	c.refs--
	last := c.refs == 0
	var atts []*frontend.Attachment
	if last {
		for _, ns := range append(c.namespaces(), c.gone...) {
			if ns != nil {
				atts = append(append(atts, ns.retired...), ns.att)
				ns.att, ns.retired = nil, nil
			}
		}
	}
	c.mu.Unlock()
	for _, a := range atts {
		if a != nil {
			a.Detach()
		}
	}
}

// keepAlive ends the controller when no command arrived for twice KATO plus
// Config.KeepAliveGrace (the spec lets a controller wait longer than KATO; a
// busy host's keep-alive may be late). KATO 0 disables it; Set Features may
// change KATO at any time.
func (c *controller) keepAlive() {
	for {
		c.mu.Lock()
		kato, idle := c.kato, time.Since(c.lastSeen)
		c.mu.Unlock()
		if kato > 0 && idle > 2*kato+c.s.cfg.KeepAliveGrace {
			c.kill(fmt.Sprintf("keep-alive timeout (no command for %s, KATO %s)", idle.Round(time.Millisecond), kato))
			return
		}
		period := time.Second
		if kato > 0 {
			period = min(max(kato/4, 10*time.Millisecond), time.Second)
		}
		select {
		case <-c.stopKA:
			return
		case <-time.After(period):
		}
	}
}
