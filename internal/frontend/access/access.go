package access

import (
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/frontend/nbd"
	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/internal/frontend/volumes"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/reservation"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Config says which front ends to start and how to reach the cluster.
type Config struct {
	MDS []string // MDS addresses; required
	// MDSTLS is the TLS configuration for the MDS (an access or client
	// certificate; docs/security.md); nil only for an --insecure MDS.
	MDSTLS *tls.Config
	// DataTLS is the same identity toward chunkservers
	// (client.Config.DataTLS); nil only for a cluster without TLS.
	DataTLS *tls.Config
	// ReadOnly opens every volume read-only, to serve alongside a writer elsewhere.
	ReadOnly bool
	// ClientName is shown in the MDS's sessions; default "frontend@HOST/PID".
	ClientName string
	Logger     *slog.Logger // default slog.Default()
	// Registry, if set, receives the metrics of the client library and of every
	// protocol server.
	Registry prometheus.Registerer
	// Local, if set, is the chunkserver this node runs inside: IO to copysets it
	// leads takes the local fast path (client.Config.Local).
	Local client.Local

	// ReservationTTL is how long this node uses a volume's persistent
	// reservations before reading them from the MDS again, and so how long
	// a PERSISTENT RESERVE OUT waits before it completes; default
	// DefaultReservationTTL.
	ReservationTTL time.Duration
	// CHAPTTL is how long this node uses a target's CHAP record (or its
	// absence) before reading it from the MDS again; default
	// DefaultCHAPTTL.
	CHAPTTL time.Duration
	// HostsTTL is how long an NVMe/TCP target uses the volumes' host
	// allow-lists (`basalt volume allow-host`) before reading them from
	// the MDS again; default DefaultHostsTTL.
	HostsTTL time.Duration

	NBD   NBDConfig
	NVMf  NVMfConfig
	ISCSI ISCSIConfig
}

// NVMfConfig says where the NVMe over TCP target listens; empty Listen: none.
type NVMfConfig struct {
	Listen string // TCP address (the NVMe/TCP port is 4420)
	// AllowedHosts: the host NQNs that may connect; empty: every host. A
	// volume's own allow-list in the MDS applies as well: a host needs both.
	AllowedHosts []string
	// AdvertiseAddr is the address the discovery log gives (default: the one
	// the host connected to); with ANA multipath, the address this access
	// node registers with the MDS (default: the listener's).
	AdvertiseAddr string
	// Multipath makes this target one access node of several exporting the
	// same subsystems (docs/nvmf.md): it registers and heartbeats to the
	// MDS, which assigns the ANA state of each host's paths. Off: one
	// optimized path, volumes attached at Connect.
	Multipath bool
}

// ISCSIConfig says where the iSCSI target listens; Listen empty: no iSCSI.
type ISCSIConfig struct {
	Listen string // TCP address (the portal)
	// Cluster names the cluster in target names: iqn.2026-11.io.basalt:CLUSTER:VOLUME.
	Cluster string
	// CHAP, if set, is required of every normal session to a target
	// without CHAP of its own in the MDS (`basalt volume chap set`), which
	// takes precedence; Initiators, if not empty, are the only initiator
	// names allowed (iscsi.Config).
	CHAP       *iscsi.CHAP
	Initiators []string
	// IgnoreTargetCHAP: do not read the targets' CHAP from the MDS. For a
	// loopback portal whose one host is this machine's kernel (the CSI
	// node plugin's), which no remote initiator reaches.
	IgnoreTargetCHAP bool
	// TargetPort is this portal's relative target port identifier in
	// persistent reservations, which must differ between the access nodes
	// serving a volume; 0: derived from the host name and the listener's
	// address.
	TargetPort uint16
	// Register announces this portal to the MDS as an access node's, so
	// that redirectors send logins here; AdvertiseAddr is the address
	// initiators reach it on (default: the listener's).
	Register      bool
	AdvertiseAddr string
	// Redirect makes this portal a redirector (docs/iscsi.md): it serves
	// no volume and sends each login to a registered access node's portal.
	Redirect bool
}

// NBDConfig says where the NBD front end listens; both empty: no NBD.
type NBDConfig struct {
	Listen string // TCP address
	Socket string // Unix socket path; a stale socket file (nobody serves on it) is replaced
	// ListenTLS and SocketTLS are the NBD_OPT_STARTTLS policies of the two
	// listeners (docs/security.md, "Access plane"); zero: off.
	ListenTLS, SocketTLS nbd.TLSPolicy
	// TLS is the front end's identity toward NBD clients: its certificate,
	// and the cluster CA and revocation list clients are verified against
	// (NBDRoles only). Required unless both policies are off.
	TLS *identity.Config
	// Node, if set, is the CSI node whose kernel is this front end's one
	// client (the node plugin's own socket): it may write a volume only
	// while a writable attachment names this node (nbd.Config.MayWrite).
	Node string
}

// NBDRoles are the roles that may attach volumes over NBD: those that may
// already do IO on chunkservers themselves (a library client, another
// access node, an operator), so the front end lends nobody a power it
// lacks. Daemon certificates (mds, chunkserver, etcd) are refused: a
// stolen chunkserver key must not become a way to read every volume.
var NBDRoles = []identity.Role{identity.RoleClient, identity.RoleAccess, identity.RoleAdmin}

func (c NBDConfig) enabled() bool { return c.Listen != "" || c.Socket != "" }

// ErrNothingToServe: Start was given no front end to run.
var ErrNothingToServe = errors.New("access: no front end configured (give an NBD TCP address or Unix socket, an NVMe/TCP address or an iSCSI portal)")

// Node is a running set of front ends over one export lifecycle.
type Node struct {
	log      *slog.Logger
	mds      *mdsclient.Client
	exports  *frontend.Exports
	nbd      *nbd.Server
	nvmf     *nvmf.Server
	iscsi    *iscsi.Server
	addrs    []net.Addr
	stopANA  chan struct{} // closed by Close: ends heartbeatLoop
	kickANA  chan struct{} // a heartbeat now: NVMe/TCP hosts came or went
	reg      registration  // as an access node (Start only)
	regMu    sync.Mutex
	anaSrv   *nvmf.Server  // in ANA multipath, under regMu
	iscsiSrv *iscsi.Server // registered iSCSI portal, under regMu
	// reservations are the volumes' persistent reservations, in the MDS.
	reservations *reservation.Cached
	// chaps are the targets' CHAP records, in the MDS.
	chaps *targetCHAPs
	// hosts are the volumes' NVMe host allow-lists, in the MDS.
	hosts *volumeHosts

	closeOnce sync.Once
	closeErr  error
}

// Start starts the front ends cfg names; they serve until Close.
func Start(cfg Config) (*Node, error) {
	if !cfg.NBD.enabled() && cfg.NVMf.Listen == "" && cfg.ISCSI.Listen == "" {
		return nil, ErrNothingToServe
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ClientName == "" {
		host, _ := os.Hostname()
		cfg.ClientName = fmt.Sprintf("frontend@%s/%d", host, os.Getpid())
	}
	mc, err := mdsclient.Dial(cfg.MDS, cfg.MDSTLS)
	if err != nil {
		return nil, err
	}
	var cm *client.Metrics
	var nm *nbd.Metrics
	if cfg.Registry != nil {
		cm, nm = client.NewMetrics(cfg.Registry), nbd.NewMetrics(cfg.Registry)
	}
	if cfg.ReservationTTL <= 0 {
		cfg.ReservationTTL = DefaultReservationTTL
	}
	if cfg.CHAPTTL <= 0 {
		cfg.CHAPTTL = DefaultCHAPTTL
	}
	if cfg.HostsTTL <= 0 {
		cfg.HostsTTL = DefaultHostsTTL
	}
	n := &Node{log: cfg.Logger, mds: mc, stopANA: make(chan struct{}), kickANA: make(chan struct{}, 1),
		reservations: reservation.NewCached(MDSReservations{MDS: mc}, cfg.ReservationTTL),
		chaps:        newTargetCHAPs(mc, cfg.CHAPTTL),
		hosts:        newVolumeHosts(mc, cfg.HostsTTL)}
	n.exports = frontend.NewExports(frontend.ExportsConfig{
		Logger: cfg.Logger,
		Opener: volumes.New(volumes.Config{
			MDS: mc, ReadOnly: cfg.ReadOnly, ClientName: cfg.ClientName,
			Logger: cfg.Logger, Metrics: cm, Local: cfg.Local, DataTLS: cfg.DataTLS,
		}),
	})
	if cfg.NBD.enabled() {
		if err := n.startNBD(cfg.NBD, nm); err != nil {
			n.Close()
			return nil, err
		}
	}
	if cfg.NVMf.Listen != "" {
		if err := n.startNVMf(cfg.NVMf, cfg.ClientName); err != nil {
			n.Close()
			return nil, err
		}
	}
	if cfg.ISCSI.Listen != "" {
		if err := n.startISCSI(cfg.ISCSI, cfg.ClientName); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

func (n *Node) startNVMf(cfg NVMfConfig, name string) error {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("NVMe/TCP listen on %s: %w", cfg.Listen, err)
	}
	scfg := nvmf.Config{Exports: n.exports, Logger: n.log,
		AllowedHosts: cfg.AllowedHosts, AdvertiseAddr: cfg.AdvertiseAddr, Reservations: n.reservations,
		MayWrite: n.mayWrite(NVMeHost), VolumeHostAllowed: n.hosts.allowed}
	var id uint64
	if cfg.Multipath {
		n.reg.nvmf = advertised(cfg.AdvertiseAddr, ln)
		if id, err = n.announce(name); err != nil {
			ln.Close()
			return err
		}
		scfg.Multipath, scfg.NodeID = true, id
		scfg.HostsChanged = func() {
			select {
			case n.kickANA <- struct{}{}:
			default:
			}
		}
	}
	srv, err := nvmf.NewServer(scfg)
	if err != nil {
		ln.Close()
		return err
	}
	n.nvmf = srv
	n.addrs = append(n.addrs, ln.Addr())
	n.log.Info("serving NVMe/TCP", "addr", ln.Addr().String(), "subsystems", nvmf.VolumeNQNPrefix+"VOLUME",
		"allowed_hosts", len(cfg.AllowedHosts), "access_node", id, "ana_multipath", cfg.Multipath)
	if cfg.Multipath {
		n.regMu.Lock()
		n.anaSrv = srv
		n.regMu.Unlock()
		select { // its paths at once, not at the next tick
		case n.kickANA <- struct{}{}:
		default:
		}
	}
	go srv.Serve(ln)
	return nil
}

func (n *Node) startNBD(cfg NBDConfig, m *nbd.Metrics) error {
	scfg := nbd.Config{Exports: n.exports, Logger: n.log, Metrics: m}
	if cfg.Node != "" {
		scfg.MayWrite, scfg.Host = n.mayWrite(CSINode), cfg.Node
	}
	if cfg.TLS != nil {
		id := cfg.TLS
		scfg.TLS = id.ServerTLS(NBDRoles...)
		scfg.TLSRecheck = func(cs tls.ConnectionState) error {
			_, err := id.Verify(cs.PeerCertificates, NBDRoles)
			return err
		}
	} else if cfg.ListenTLS != nbd.TLSOff || cfg.SocketTLS != nbd.TLSOff {
		return fmt.Errorf("NBD TLS policy %v (TCP) / %v (socket) needs a TLS identity", cfg.ListenTLS, cfg.SocketTLS)
	}
	srv, err := nbd.NewServer(scfg)
	if err != nil {
		return err
	}
	n.nbd = srv
	type listener struct {
		net.Listener
		policy nbd.TLSPolicy
	}
	var lns []listener
	if cfg.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("NBD listen on %s: %w", cfg.Listen, err)
		}
		lns = append(lns, listener{ln, cfg.ListenTLS})
	}
	if cfg.Socket != "" {
		err := removeStaleSocket(cfg.Socket)
		var ln net.Listener
		if err == nil {
			ln, err = net.Listen("unix", cfg.Socket)
		}
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("NBD listen on %s: %w", cfg.Socket, err)
		}
		lns = append(lns, listener{ln, cfg.SocketTLS})
	}
	for _, ln := range lns {
		n.addrs = append(n.addrs, ln.Addr())
		n.log.Info("serving NBD", "addr", ln.Addr().String(), "network", ln.Addr().Network(), "tls", ln.policy.String())
		go srv.ServeTLS(ln.Listener, ln.policy)
	}
	return nil
}

func (n *Node) startISCSI(cfg ISCSIConfig, name string) error {
	if cfg.Cluster == "" {
		cfg.Cluster = "basalt"
	}
	if cfg.Register && cfg.Redirect {
		return errors.New("iSCSI: a redirector portal serves no volume: it cannot register as an access node too")
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("iSCSI listen on %s: %w", cfg.Listen, err)
	}
	if cfg.TargetPort == 0 {
		host, _ := os.Hostname()
		h := fnv.New32a()
		h.Write([]byte(host + "/" + ln.Addr().String()))
		cfg.TargetPort = uint16(h.Sum32()%0xffff) + 1
	}
	icfg := iscsi.Config{
		Exports: n.exports, Cluster: cfg.Cluster, Logger: n.log,
		CHAP: cfg.CHAP, Initiators: cfg.Initiators,
		Reservations: n.reservations, TargetPort: cfg.TargetPort,
		MayWrite: n.mayWrite(ISCSIInitiator),
	}
	if !cfg.IgnoreTargetCHAP {
		icfg.TargetCHAP = n.chaps.get
	}
	if cfg.Redirect {
		icfg.Redirect = &redirector{mds: n.mds}
	}
	srv, err := iscsi.NewServer(icfg)
	if err != nil {
		ln.Close()
		return err
	}
	var id uint64
	if cfg.Register {
		n.regMu.Lock()
		n.iscsiSrv = srv
		n.regMu.Unlock()
		n.reg.iscsi = advertised(cfg.AdvertiseAddr, ln)
		if id, err = n.announce(name); err != nil {
			ln.Close()
			return err
		}
	}
	n.iscsi = srv
	n.addrs = append(n.addrs, ln.Addr())
	n.log.Info("serving iSCSI", "portal", ln.Addr().String(), "targets", iscsi.TargetName(cfg.Cluster, "VOLUME"),
		"chap", cfg.CHAP != nil, "target_chap", !cfg.IgnoreTargetCHAP, "initiators_allowed", len(cfg.Initiators), "target_port", cfg.TargetPort,
		"access_node", id, "redirector", cfg.Redirect)
	go srv.Serve(ln)
	return nil
}

// removeStaleSocket removes the socket file at path if nobody serves on it
// (left by a process that died); a live socket or a file of another kind is
// an error, so a second front end never takes a running one's path over.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return errors.New("the file exists and is not a socket; remove it or choose another path")
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return errors.New("another process already serves on it; stop it first or choose another path")
	}
	return os.Remove(path)
}

// Addrs returns the addresses the front ends listen on: NBD's, then the
// iSCSI portal.
func (n *Node) Addrs() []net.Addr { return n.addrs }

// ExportIdle reports that the named export has no backend open, opening or
// closing (frontend.Exports.Idle).
func (n *Node) ExportIdle(name string) bool { return n.exports.Idle(name) }

// ISCSIPortal returns the iSCSI portal's address, or nil if none.
func (n *Node) ISCSIPortal() net.Addr {
	if n.iscsi == nil {
		return nil
	}
	return n.addrs[len(n.addrs)-1]
}

// Close stops the front ends (their connections end at once; IO in flight
// completes first), then closes every volume and the MDS connection. Later
// calls return the first one's result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.stopANA)
		var errs []error
		if n.nbd != nil {
			errs = append(errs, n.nbd.Close())
		}
		if n.nvmf != nil {
			errs = append(errs, n.nvmf.Close())
		}
		if n.iscsi != nil {
			errs = append(errs, n.iscsi.Close())
		}
		errs = append(errs, n.exports.Close(), n.mds.Close())
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}
