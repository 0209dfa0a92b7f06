package nvmf

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
)

// exec runs a command whose data (if any) has arrived.
func (c *conn) exec(cmd *command) {
	switch {
	case cmd.sqe.opcode == opFabrics:
		c.fabrics(cmd)
	case c.ctrl == nil:
		c.complete(cmd, scCmdSeqError|dnr, 0, 0) // nothing but Connect before Connect
	case c.qid == 0:
		c.admin(cmd)
	default:
		c.io(cmd)
	}
}

func (c *conn) fabrics(cmd *command) {
	s := cmd.sqe
	switch s.raw[4] {
	case fctypeConnect:
		c.connect(cmd)
	case fctypePropertyGet, fctypePropertySet:
		if c.ctrl == nil || c.qid != 0 {
			c.complete(cmd, scCmdSeqError|dnr, 0, 0)
			return
		}
		c.property(cmd)
	default:
		c.complete(cmd, scInvalidOpcode|dnr, 0, 0)
	}
}

// cstr returns the NUL-terminated string in b.
func cstr(b []byte) string {
	for i, x := range b {
		if x == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// invalidParam answers a Connect with Connect Invalid Parameters pointing at
// the offending byte (in the data when inData).
func (c *conn) invalidParam(cmd *command, off int, inData bool) {
	dw0 := uint32(off)
	if inData {
		dw0 |= 1 << 16
	}
	c.complete(cmd, scConnectInvalid|dnr, dw0, 0)
}

func (c *conn) connect(cmd *command) {
	s := cmd.sqe
	if c.ctrl != nil {
		c.complete(cmd, scCmdSeqError|dnr, 0, 0)
		return
	}
	if recfmt := binary.LittleEndian.Uint16(s.raw[40:]); recfmt != 0 {
		c.complete(cmd, scConnectFormat|dnr, 0, 0)
		return
	}
	if len(cmd.data) < 1024 {
		c.complete(cmd, scInvalidField|dnr, 0, 0)
		return
	}
	qid := binary.LittleEndian.Uint16(s.raw[42:])
	sqsize := int(binary.LittleEndian.Uint16(s.raw[44:])) + 1
	cattr := s.raw[46]
	kato := time.Duration(binary.LittleEndian.Uint32(s.raw[48:])) * time.Millisecond
	d := cmd.data
	cntlid := binary.LittleEndian.Uint16(d[16:])
	subNQN, hostNQN := cstr(d[256:512]), cstr(d[512:768])
	log := c.log.With("subnqn", subNQN, "hostnqn", hostNQN, "qid", qid)
	if sqsize < 2 || sqsize > c.s.cfg.QueueSize || (qid == 0 && sqsize > 32) {
		c.invalidParam(cmd, 44, false)
		return
	}
	var ctrl *controller
	if qid == 0 {
		if cntlid != 0xffff {
			c.invalidParam(cmd, 16, true) // static controllers are not supported
			return
		}
		ctrl = &controller{s: c.s, subNQN: subNQN, hostNQN: hostNQN, kato: kato,
			lastSeen: time.Now(), conns: map[*conn]bool{}, stopKA: make(chan struct{})}
		copy(ctrl.hostID[:], d[0:16])
		ctrl.nexus = nexusOf(ctrl.hostID)
		switch {
		case subNQN == DiscoveryNQN:
			ctrl.discovery = true
			ctrl.local = c.nc.LocalAddr().String()
			ctrl.discGen, ctrl.discRead = 1, 1
		default:
			vols, ok := c.s.subsystemVolumes(subNQN)
			if !ok {
				log.Info("nvmf: connect to an unknown subsystem refused")
				c.invalidParam(cmd, 256, true)
				return
			}
			ctx, cancel := context.WithTimeout(c.s.conns.Context(), c.s.cfg.ConnectTimeout)
			ok, err := c.s.mayConnect(ctx, hostNQN, vols)
			cancel()
			if err != nil {
				log.Warn("nvmf: connect refused for now: the volume's allow-list cannot be read", "err", err)
				c.complete(cmd, scConnectBusy, 0, 0)
				return
			}
			if !ok {
				log.Warn("nvmf: connect from a host not on the allow-list refused", "volumes", vols)
				c.complete(cmd, scConnectHost|dnr, 0, 0)
				return
			}
			if !c.attachAll(cmd, ctrl, vols, log) {
				return
			}
		}
		if !c.s.newController(ctrl) {
			for _, ns := range ctrl.namespaces() {
				if ns.att != nil {
					ns.att.Detach()
				}
			}
			c.complete(cmd, scConnectBusy, 0, 0)
			return
		}
		ctrl.join(c)
		go ctrl.keepAlive()
		ctrl.watchSizes()
		log.Info("nvmf: controller created", "cntlid", ctrl.id, "kato", kato, "discovery", ctrl.discovery,
			"hdgst", c.hdgst, "ddgst", c.ddgst)
	} else {
		ctrl = c.s.controller(cntlid)
		if ctrl == nil || ctrl.subNQN != subNQN || ctrl.hostNQN != hostNQN {
			c.invalidParam(cmd, 16, true)
			return
		}
		ctrl.mu.Lock()
		nq := ctrl.nqueues
		ctrl.mu.Unlock()
		if ctrl.discovery || qid > nq {
			c.invalidParam(cmd, 42, false)
			return
		}
		if !ctrl.join(c) {
			c.invalidParam(cmd, 16, true)
			return
		}
		ctrl.touch()
		log.Info("nvmf: I/O queue connected", "cntlid", ctrl.id, "sqsize", sqsize, "hdgst", c.hdgst, "ddgst", c.ddgst,
			"sqflow", cattr&4 == 0)
	}
	c.ctrl, c.qid, c.sqsize, c.noSQFlow = ctrl, qid, sqsize, cattr&4 != 0
	c.nc.SetReadDeadline(time.Time{})
	if c.s.conns.Context().Err() != nil {
		c.nc.SetReadDeadline(time.Now()) // Shutdown began during the Connect
	}
	c.complete(cmd, scSuccess, uint32(ctrl.id), 0)
}

// attachAll gives a new controller its namespaces, one per volume: described
// (Multipath: attached at the first I/O command) or attached. On failure it
// answers the Connect, detaches what it attached and returns false.
func (c *conn) attachAll(cmd *command, ctrl *controller, vols []string, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(c.s.conns.Context(), c.s.cfg.ConnectTimeout)
	defer cancel()
	var nss []*namespace
	for i, name := range vols {
		ns, err := c.s.newNamespace(ctx, ctrl.hostNQN, uint32(i+1), name, log)
		if err != nil {
			log.Info("nvmf: connect refused: the volume cannot be attached", "volume", name, "err", err)
			if errors.Is(err, frontend.ErrNoSuchExport) || errors.Is(err, errBadLBA) {
				c.invalidParam(cmd, 256, true)
			} else {
				c.complete(cmd, scConnectBusy, 0, 0)
			}
			for _, ns := range nss {
				if ns.att != nil {
					ns.att.Detach()
				}
			}
			return false
		}
		nss = append(nss, ns)
	}
	ctrl.nss.Store(&nss)
	ctrl.nn = nnOf(ctrl.subNQN, len(nss))
	return true
}

// errBadLBA: a volume's block size cannot be an NVMe LBA.
var errBadLBA = errors.New("the volume's block size cannot be an NVMe LBA")

// newNamespace makes namespace nsid of a controller of hostNQN over the
// volume name: described (Multipath: attached at the first I/O command) or
// attached.
func (s *Server) newNamespace(ctx context.Context, hostNQN string, nsid uint32, name string, log *slog.Logger) (*namespace, error) {
	var att *frontend.Attachment
	var info frontend.Info
	var err error
	if s.cfg.Multipath {
		info, err = s.cfg.Exports.Describe(ctx, name)
	} else if att, err = s.cfg.Exports.Attach(ctx, name); err == nil {
		info = att.Info()
	}
	if err != nil {
		return nil, err
	}
	ns := &namespace{nsid: nsid, volume: name, nsInfo: nsOf(info), att: att,
		write: frontend.NewWriteGate(frontend.MayWriteFunc(s.cfg.MayWrite), name, hostNQN,
			s.cfg.MayWriteTTL, s.cfg.ConnectTimeout, log)}
	if ns.lbaShift == 0 {
		if att != nil {
			att.Detach()
		}
		return nil, fmt.Errorf("%w: volume %s, minimum block %d", errBadLBA, name, info.BlockSizes.Minimum)
	}
	ns.nlb.Store(uint64(info.Size) >> ns.lbaShift)
	return ns, nil
}

// Properties (controller registers).
const (
	propCAP  = 0x00
	propVS   = 0x08
	propCC   = 0x14
	propCSTS = 0x1c
)

const version = 0x00010300 // NVMe 1.3

func (c *conn) property(cmd *command) {
	s := cmd.sqe
	ctrl := c.ctrl
	size8 := s.raw[40]&7 == 1
	ofst := binary.LittleEndian.Uint32(s.raw[44:])
	ctrl.mu.Lock()
	defer ctrl.mu.Unlock()
	if s.raw[4] == fctypePropertyGet {
		var v uint64
		switch ofst {
		case propCAP:
			// MQES, CQR, TO = 7.5 s, CSS = NVM command set; MPSMIN = MPSMAX = 4 KiB.
			v = uint64(c.s.cfg.QueueSize-1) | 1<<16 | 15<<24 | 1<<37
		case propVS:
			v = version
		case propCC:
			v = uint64(ctrl.cc)
		case propCSTS:
			v = uint64(ctrl.csts)
		default:
			c.complete(cmd, scInvalidField|dnr, 0, 0)
			return
		}
		if !size8 {
			v &= 0xffffffff
		}
		c.complete(cmd, scSuccess, uint32(v), uint32(v>>32))
		return
	}
	v := binary.LittleEndian.Uint32(s.raw[48:])
	if ofst != propCC {
		c.complete(cmd, scInvalidField|dnr, 0, 0)
		return
	}
	ctrl.cc = v
	switch {
	case v>>14&3 != 0: // SHN: shutdown notification
		ctrl.csts = ctrl.csts&^(3<<2) | 2<<2
	case v&1 != 0:
		ctrl.csts = 1
	default:
		ctrl.csts = 0
	}
	c.complete(cmd, scSuccess, 0, 0)
}

// maxIOQueues is how many I/O queues a controller grants.
const maxIOQueues = 64

func (c *conn) admin(cmd *command) {
	s := cmd.sqe
	ctrl := c.ctrl
	switch s.opcode {
	case adminIdentify:
		c.identify(cmd)
	case adminGetLogPage:
		c.getLogPage(cmd)
	case adminKeepAlive:
		c.complete(cmd, scSuccess, 0, 0)
	case adminAsyncEvent:
		c.asyncEvent(cmd) // held until there is an event
	case adminAbort:
		c.complete(cmd, scSuccess, 1, 0) // bit 0: the command was not aborted
	case adminSetFeatures, adminGetFeatures:
		set := s.opcode == adminSetFeatures
		fid := s.cdw[10] & 0xff
		v := s.cdw[11]
		if fid == featResvMask || fid == featResvPersist {
			st, dw0 := c.resvFeature(set, fid, s.nsid, v)
			c.complete(cmd, st, dw0, 0)
			return
		}
		ctrl.mu.Lock()
		defer ctrl.mu.Unlock()
		switch fid {
		case 0x07: // number of queues
			if set {
				if ctrl.nqueues != 0 && !ctrl.discovery {
					// Granted already: the answer stays the same.
				} else if v&0xffff == 0xffff || v>>16 == 0xffff {
					c.complete(cmd, scInvalidField|dnr, 0, 0)
					return
				} else {
					ctrl.nqueues = uint16(min(v&0xffff, v>>16, maxIOQueues-1) + 1)
				}
			}
			n := uint32(max(ctrl.nqueues, 1) - 1)
			c.complete(cmd, scSuccess, n|n<<16, 0)
		case 0x0f: // keep alive timer
			if set {
				ctrl.kato = time.Duration(v) * time.Millisecond
				ctrl.lastSeen = time.Now()
			}
			c.complete(cmd, scSuccess, uint32(ctrl.kato/time.Millisecond), 0)
		case 0x0b: // asynchronous event configuration
			if set {
				ctrl.aecfg = v
			}
			c.complete(cmd, scSuccess, ctrl.aecfg, 0)
			if d, dw0 := ctrl.deliverLocked(); d != nil { // a change while notices were off
				d.c.complete(d, scSuccess, dw0, 0)
			}
		case 0x06: // volatile write cache: present, and every write is durable anyway
			c.complete(cmd, scSuccess, 1, 0)
		case 0x08: // interrupt coalescing
			c.complete(cmd, scSuccess, 0, 0)
		default:
			c.complete(cmd, scInvalidField|dnr, 0, 0)
		}
	default:
		c.complete(cmd, scInvalidOpcode|dnr, 0, 0)
	}
}

// nsOf describes a volume as namespace 1; lbaShift 0 means it cannot be one.
func nsOf(info frontend.Info) nsInfo {
	lba := max(512, info.BlockSizes.Minimum)
	if lba > 4096 {
		return nsInfo{}
	}
	shift := uint(bits.TrailingZeros32(lba))
	return nsInfo{lbaShift: shift, readOnly: info.ReadOnly, info: info}
}

// ids returns the stable NGUID and UUID of a volume.
func ids(volume string) (nguid, uuid [16]byte) {
	h := sha256.Sum256([]byte("basalt nvmf volume " + volume))
	copy(nguid[:], h[:16])
	copy(uuid[:], h[16:])
	uuid[6] = uuid[6]&0x0f | 0x40 // version 4 layout, derived not random
	uuid[8] = uuid[8]&0x3f | 0x80
	return
}

func pad(b []byte, s string) {
	for i := range b {
		b[i] = ' '
	}
	copy(b, s)
}

func (c *conn) identify(cmd *command) {
	s := cmd.sqe
	ctrl := c.ctrl
	cns := s.cdw[10] & 0xff
	b := make([]byte, 4096)
	switch {
	case cns == 1:
		c.identifyController(b)
	case ctrl.discovery:
		c.complete(cmd, scInvalidField|dnr, 0, 0)
		return
	case cns == 0:
		ns := ctrl.namespace(s.nsid)
		if ns == nil && s.nsid >= 1 && s.nsid <= ctrl.nn {
			break // an inactive NSID: all zeros
		}
		if ns == nil {
			c.complete(cmd, scInvalidNS|dnr, 0, 0)
			return
		}
		nlb := ns.nlb.Load()
		binary.LittleEndian.PutUint64(b[0:], nlb)  // NSZE
		binary.LittleEndian.PutUint64(b[8:], nlb)  // NCAP
		binary.LittleEndian.PutUint64(b[16:], nlb) // NUSE
		if ns.info.CanTrim {
			b[24] |= 1 // thin provisioning
			b[33] = 1  // deallocated blocks read as zeros
		}
		b[30] = 1                                      // NMIC: may be shared by controllers (multipath)
		b[31] = 0xff                                   // RESCAP: every type, IEKEY and PTPL
		binary.LittleEndian.PutUint32(b[92:], ns.nsid) // ANAGRPID: one ANA group per namespace
		if ns.readOnly {
			b[99] = 1
		}
		nguid, _ := ids(ns.volume)
		copy(b[104:120], nguid[:])
		b[128+2] = byte(ns.lbaShift)
	case cns == 2:
		i := 0
		for _, ns := range ctrl.namespaces() {
			if ns != nil && ns.nsid > s.nsid && i < 1024 {
				binary.LittleEndian.PutUint32(b[4*i:], ns.nsid)
				i++
			}
		}
	case cns == 3:
		ns := ctrl.namespace(s.nsid)
		if ns == nil {
			c.complete(cmd, scInvalidNS|dnr, 0, 0)
			return
		}
		nguid, uuid := ids(ns.volume)
		b[0], b[1] = 2, 16
		copy(b[4:20], nguid[:])
		b[20], b[21] = 3, 16
		copy(b[24:40], uuid[:])
		b[40], b[41] = 4, 1 // command set: NVM
	default:
		c.complete(cmd, scInvalidField|dnr, 0, 0)
		return
	}
	c.completeData(cmd, b)
}

func (c *conn) identifyController(b []byte) {
	ctrl := c.ctrl
	h := sha256.Sum256([]byte(ctrl.subNQN))
	pad(b[4:24], fmt.Sprintf("%x", h[:10]))
	if ctrl.discovery {
		pad(b[24:64], "basalt discovery")
	} else {
		pad(b[24:64], "basalt volume")
	}
	pad(b[64:72], "0.1")
	b[72] = 6                                                         // RAB
	b[76] = 1<<0 | 1<<1 | 1<<3                                        // CMIC: multi-port, multi-controller, ANA
	binary.LittleEndian.PutUint32(b[92:], aenANAEnabled|aenNSEnabled) // OAES: ANA and namespace change notices
	b[77] = byte(bits.TrailingZeros(uint(c.s.cfg.MaxTransfer)) - 12)  // MDTS in 4 KiB pages
	binary.LittleEndian.PutUint16(b[78:], ctrl.id)
	binary.LittleEndian.PutUint32(b[80:], version)
	binary.LittleEndian.PutUint32(b[96:], 1<<0|1<<6) // CTRATT: 128-bit host id, TBKAS
	b[258] = 3                                       // ACL
	b[259] = 3                                       // AERL: 4 outstanding
	b[261] = 1<<0 | 1<<2                             // LPA: SMART per namespace, extended data
	b[262] = 0                                       // ELPE: one error log entry
	binary.LittleEndian.PutUint16(b[320:], 10)       // KAS: 100 ms granularity... 10×100 ms
	b[512], b[513] = 0x66, 0x44                      // SQES, CQES
	binary.LittleEndian.PutUint16(b[514:], uint16(c.s.cfg.QueueSize))
	b[536] = 1 // SGLS: SGLs supported
	b[538] = 1 << 4
	b[1803] = 1 // MSDBD
	copy(b[768:1024], ctrl.subNQN)
	if ctrl.discovery {
		b[111] = 2                                            // CNTRLTYPE: discovery
		b[76] = 0                                             // no multipath on discovery
		binary.LittleEndian.PutUint32(b[92:], aenDiscEnabled) // OAES: discovery log change notices only
		binary.LittleEndian.PutUint32(b[1792:], sqeLen/16)    // IOCCSZ: no in-capsule data
	} else {
		b[111] = 1 // CNTRLTYPE: I/O
		nn := ctrl.nn
		binary.LittleEndian.PutUint32(b[516:], nn) // NN
		binary.LittleEndian.PutUint32(b[540:], nn) // MNAN
		oncs := uint16(1 << 0)                     // Compare
		for _, ns := range ctrl.namespaces() {
			if ns != nil && ns.info.CanTrim {
				oncs |= 1 << 2 // Dataset Management (a no-op on a namespace that cannot trim)
			}
		}
		oncs |= 1 << 3 // Write Zeroes (emulated with zero writes without backend support)
		oncs |= 1 << 5 // Reservations
		binary.LittleEndian.PutUint16(b[520:], oncs)
		b[525] = 1                                                                         // VWC present
		b[342] = 10                                                                        // ANATT
		b[343] = 0x1f                                                                      // ANACAP: every ANA state reportable (as nvmet)
		binary.LittleEndian.PutUint32(b[344:], nn)                                         // ANAGRPMAX: group id = NSID
		binary.LittleEndian.PutUint32(b[348:], nn)                                         // NANAGRPID
		binary.LittleEndian.PutUint32(b[1792:], uint32((sqeLen+c.s.cfg.InCapsuleData)/16)) // IOCCSZ
	}
	binary.LittleEndian.PutUint32(b[1796:], cqeLen/16) // IORCSZ
	binary.LittleEndian.PutUint16(b[2048:], 0x9c4)     // PSD0 max power
}

// Log pages.
const (
	logError     = 0x01
	logSMART     = 0x02
	logFirmware  = 0x03
	logChangedNS = 0x04
	logANA       = 0x0c
	logDiscovery = 0x70
	// logResvNotify is the Reservation Notification log page (resvnotify.go).
	logResvNotify = 0x80
)

func (c *conn) getLogPage(cmd *command) {
	s := cmd.sqe
	lid := s.cdw[10] & 0xff
	lsp := s.cdw[10] >> 8 & 0xf
	numd := (uint64(s.cdw[11]&0xffff)<<16 | uint64(s.cdw[10]>>16)) + 1
	off := uint64(s.cdw[12]) | uint64(s.cdw[13])<<32
	var page []byte
	disc := c.ctrl.discovery
	switch {
	case lid == logDiscovery && disc:
		page = c.discoveryLog()
		if s.cdw[10]&(1<<15) == 0 { // RAE clear: the host has seen the log as it is
			c.ctrl.mu.Lock()
			c.ctrl.discRead, c.ctrl.discMasked = binary.LittleEndian.Uint64(page), false
			d, dw0 := c.ctrl.deliverLocked() // a change after the page was built
			c.ctrl.mu.Unlock()
			if d != nil {
				defer d.c.complete(d, scSuccess, dw0, 0)
			}
		}
	case disc:
		c.complete(cmd, scInvalidLogPage|dnr, 0, 0)
		return
	case lid == logError:
		page = make([]byte, 64)
	case lid == logSMART:
		page = make([]byte, 512)
		binary.LittleEndian.PutUint16(page[1:], 300) // 300 K
		page[3], page[4] = 100, 10                   // spare 100 %, threshold 10 %
	case lid == logFirmware:
		page = make([]byte, 512)
		page[0] = 1
		copy(page[8:16], "0.1     ")
	case lid == logChangedNS:
		page = make([]byte, 4096)
		c.ctrl.mu.Lock()
		for i, nsid := range c.ctrl.changedNS {
			binary.LittleEndian.PutUint32(page[4*i:], nsid)
		}
		var d *command
		var dw0 uint32
		if s.cdw[10]&(1<<15) == 0 { // RAE clear: the host has seen the list
			c.ctrl.changedNS, c.ctrl.nsMasked = nil, false
			d, dw0 = c.ctrl.deliverLocked() // a change after the page was built
		}
		c.ctrl.mu.Unlock()
		if d != nil {
			defer d.c.complete(d, scSuccess, dw0, 0)
		}
	case lid == logResvNotify:
		if numd*4 > 1<<20 || off&3 != 0 || off > 64 {
			c.complete(cmd, scInvalidField|dnr, 0, 0) // before an entry is taken
			return
		}
		page = c.ctrl.resvLogPage(off == 0)
		if s.cdw[10]&(1<<15) == 0 { // RAE clear: notices again
			c.ctrl.mu.Lock()
			c.ctrl.resvMasked = false
			d, dw0 := c.ctrl.deliverLocked() // entries left
			c.ctrl.mu.Unlock()
			if d != nil {
				defer d.c.complete(d, scSuccess, dw0, 0)
			}
		}
	case lid == logANA:
		page = c.s.anaLog(c.ctrl, lsp&1 != 0)
		if s.cdw[10]&(1<<15) == 0 { // RAE clear: the host has seen the change
			c.ctrl.mu.Lock()
			c.ctrl.anaMasked = false
			d, dw0 := c.ctrl.deliverLocked() // a change after the page was built
			c.ctrl.mu.Unlock()
			if d != nil {
				defer d.c.complete(d, scSuccess, dw0, 0)
			}
		}
	default:
		c.complete(cmd, scInvalidLogPage|dnr, 0, 0)
		return
	}
	want := numd * 4
	if want > 1<<20 || off&3 != 0 || off > uint64(len(page)) {
		c.complete(cmd, scInvalidField|dnr, 0, 0)
		return
	}
	out := make([]byte, want)
	copy(out, page[off:])
	c.completeData(cmd, out)
}

// discoveryLog lists every volume's subsystem the host may connect to.
func (c *conn) discoveryLog() []byte {
	ctx, cancel := context.WithTimeout(c.s.conns.Context(), c.s.cfg.ConnectTimeout)
	defer cancel()
	names, err := c.s.cfg.Exports.List(ctx)
	if err != nil {
		c.log.Warn("nvmf: listing volumes for the discovery log", "err", err)
	}
	page, err := c.s.discoveryLog(ctx, c.ctrl, names, true)
	if err != nil {
		c.log.Warn("nvmf: subsystems left out of the discovery log: their allow-lists cannot be read", "err", err)
	}
	return page
}
