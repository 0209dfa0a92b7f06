package iscsi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi/scsi"
	"github.com/basalt-storage/basalt/internal/reservation"
)

// Login status classes and details (RFC 7143 11.13.5).
const (
	statusSuccess           = 0x0000
	statusMovedTemporarily  = 0x0101
	statusInitiatorError    = 0x0200
	statusAuthFailure       = 0x0201
	statusAuthorization     = 0x0202
	statusNotFound          = 0x0203
	statusUnsupportedVer    = 0x0205
	statusTooManyConns      = 0x0206
	statusMissingParam      = 0x0207
	statusSessionTypeUnsupp = 0x0209
	statusNoSession         = 0x020a
	statusInvalidDuringLog  = 0x020b
	statusTargetError       = 0x0300
	statusUnavailable       = 0x0301
)

// Login stages.
const (
	stageSecurity    = 0
	stageOperational = 1
	stageFullFeature = 3
)

// loginFailure ends a login with a status; the connection is closed after
// the response.
type loginFailure struct {
	status uint16
	why    string
	text   []byte // the response's keys (a redirection's TargetAddress)
}

func (f *loginFailure) Error() string {
	return fmt.Sprintf("iscsi: login refused (status %#04x): %s", f.status, f.why)
}

func refuse(status uint16, format string, args ...any) *loginFailure {
	return &loginFailure{status: status, why: fmt.Sprintf(format, args...)}
}

// loginState is what one login has learnt so far.
type loginState struct {
	chap        chapState
	creds       *CHAP // the credentials this login must prove (Config.CHAP or the target's own); nil: none
	authDone    bool  // the security stage is complete (CHAP verified, or none needed)
	needAuth    bool
	declared    bool // our MaxRecvDataSegmentLength was sent
	sentTPGT    bool
	stage       int
	initialized bool
}

// Values this target wants.
const (
	ourMaxConnections    = 1
	ourMaxOutstandingR2T = 1
	ourMaxBurst          = 8 << 20
	ourFirstBurst        = 256 << 10
)

// login runs the login phase (RFC 7143 6, 13) to full feature phase, or
// returns why not (after sending the refusal).
func (c *conn) login() error {
	c.nc.SetDeadline(time.Now().Add(c.s.cfg.LoginTimeout))
	var st loginState
	var text []byte
	for {
		p, err := readPDU(c.br, false, false, c.s.cfg.MaxRecvDataSegment)
		if err != nil {
			return err
		}
		if p.opcode() != opLoginReq {
			return fmt.Errorf("%w: opcode %#x during login", ErrMalformed, p.opcode())
		}
		if !st.initialized {
			st.initialized = true
			copy(c.isid[:], p.bhs[8:14])
			c.statSN = p.u32(28)
			c.expCmdSN.Store(p.u32(24))
		}
		c.loginITT = p.itt()
		if p.bhs[2] < p.bhs[3] || p.bhs[3] > 0 {
			// Version-max below version-min, or a minimum above ours (0).
			return c.loginRefuse(p, refuse(statusUnsupportedVer, "versions %d..%d", p.bhs[3], p.bhs[2]))
		}
		text = append(text, p.data...)
		if len(text) > maxTextBytes {
			return c.loginRefuse(p, refuse(statusInitiatorError, "login text of more than %d bytes", maxTextBytes))
		}
		if p.bhs[1]&0x40 != 0 { // C: more text follows
			if err := c.loginRespond(p, statusSuccess, false, nil); err != nil {
				return err
			}
			continue
		}
		keys, err := parseText(text)
		text = nil
		if err != nil {
			return c.loginRefuse(p, refuse(statusInitiatorError, "%v", err))
		}
		resp, transit, err := c.negotiate(&st, p, keys)
		if err != nil {
			var lf *loginFailure
			if errors.As(err, &lf) {
				return c.loginRefuse(p, lf)
			}
			return err
		}
		if err := c.loginRespond(p, statusSuccess, transit, resp); err != nil {
			return err
		}
		if transit && p.bhs[1]&0x03 == stageFullFeature {
			c.nc.SetDeadline(time.Time{})
			return nil
		}
	}
}

// loginRespond sends a Login Response to p. transit agrees to the stage the
// initiator asked for.
func (c *conn) loginRespond(p *pdu, status uint16, transit bool, text []byte) error {
	r := &pdu{data: text}
	r.bhs[0] = opLoginResp
	csg := (p.bhs[1] >> 2) & 0x03
	r.bhs[1] = csg << 2
	if transit {
		r.bhs[1] |= 0x80 | p.bhs[1]&0x03
	}
	copy(r.bhs[8:14], c.isid[:])
	if transit && p.bhs[1]&0x03 == stageFullFeature {
		binary.BigEndian.PutUint16(r.bhs[14:], c.tsih)
	}
	r.put32(16, p.itt())
	r.put32(24, c.statSN)
	c.statSN++
	exp := c.expCmdSN.Load()
	r.put32(28, exp)
	r.put32(32, exp+uint32(c.s.cfg.MaxCommands)-1)
	binary.BigEndian.PutUint16(r.bhs[36:], status)
	b := appendPDU(nil, r, false, false)
	_, err := c.nc.Write(b)
	return err
}

// loginRefuse answers p with f's status and returns f.
func (c *conn) loginRefuse(p *pdu, f *loginFailure) error {
	if f.status>>8 == statusMovedTemporarily>>8 {
		c.log.Info("iscsi: login redirected", "to", f.why)
	} else {
		c.log.Warn("iscsi: login refused", "status", fmt.Sprintf("%#04x", f.status), "why", f.why)
	}
	c.loginRespond(p, f.status, false, f.text)
	return f
}

// negotiate handles one (complete) login request's keys and returns the
// response text and whether the requested stage transition is granted.
func (c *conn) negotiate(st *loginState, p *pdu, keys []kv) (resp []byte, transit bool, err error) {
	cfg := &c.s.cfg
	csg := int(p.bhs[1]>>2) & 0x03
	nsg := int(p.bhs[1]) & 0x03
	wantTransit := p.bhs[1]&0x80 != 0
	if csg == 2 || csg == stageFullFeature || (wantTransit && (nsg <= csg || nsg == 2)) {
		return nil, false, refuse(statusInitiatorError, "bad stages CSG %d NSG %d", csg, nsg)
	}
	if csg < st.stage {
		return nil, false, refuse(statusInitiatorError, "stage went back from %d to %d", st.stage, csg)
	}
	st.stage = csg
	get := func(k string) (string, bool) {
		for _, x := range keys {
			if x.k == k {
				return x.v, true
			}
		}
		return "", false
	}

	// The first request names the initiator, the session type and the target.
	if c.initiator == "" {
		name, ok := get("InitiatorName")
		if !ok || name == "" {
			return nil, false, refuse(statusMissingParam, "no InitiatorName")
		}
		c.initiator = name
		c.log = c.log.With("initiator", name)
		switch t, _ := get("SessionType"); t {
		case "", "Normal":
		case "Discovery":
			c.discovery = true
		default:
			return nil, false, refuse(statusSessionTypeUnsupp, "SessionType %q", t)
		}
		if binary.BigEndian.Uint16(p.bhs[14:]) != 0 {
			return nil, false, refuse(statusNoSession, "adding a connection to session %d: one connection per session",
				binary.BigEndian.Uint16(p.bhs[14:]))
		}
		if !c.discovery {
			target, ok := get("TargetName")
			if !ok || target == "" {
				return nil, false, refuse(statusMissingParam, "no TargetName in a normal session")
			}
			c.target = target
			c.log = c.log.With("target", target)
			vol, ok := c.s.volumeOf(target)
			if !ok {
				return nil, false, refuse(statusNotFound, "not a target of cluster %q", cfg.Cluster)
			}
			ctx, cancel := c.loginContext()
			_, err := cfg.Exports.Describe(ctx, vol)
			cancel()
			if errors.Is(err, frontend.ErrNoSuchExport) {
				return nil, false, refuse(statusNotFound, "no volume %q", vol)
			} else if err != nil {
				return nil, false, refuse(statusUnavailable, "volume %q: %v", vol, err)
			}
			c.volume = vol
			if cfg.Redirect != nil {
				return nil, false, c.redirect(vol)
			}
			if !c.s.allowed(c.initiator) {
				return nil, false, refuse(statusAuthorization, "initiator not on the allow-list")
			}
		}
		st.creds = cfg.CHAP
		if !c.discovery && cfg.TargetCHAP != nil {
			// The target's own CHAP, if it has one, replaces the node-wide
			// one. Not knowing it fails closed: the initiator retries.
			ctx, cancel := c.loginContext()
			tc, err := cfg.TargetCHAP(ctx, c.volume)
			cancel()
			if err != nil {
				return nil, false, refuse(statusUnavailable, "reading the target's CHAP: %v", err)
			}
			if tc != nil {
				st.creds = tc
			}
		}
		st.needAuth = st.creds != nil && !c.discovery
	}

	for _, x := range keys {
		k, v := x.k, x.v
		switch k {
		case "InitiatorName", "SessionType", "TargetName", "InitiatorAlias":
			continue
		case "AuthMethod", "CHAP_A", "CHAP_N", "CHAP_R", "CHAP_I", "CHAP_C":
			if csg != stageSecurity {
				return nil, false, refuse(statusInitiatorError, "%s outside the security stage", k)
			}
			continue // below, in order
		}
		if r, ok := c.operationalKey(k, v); ok {
			resp = appendText(resp, k, r)
		}
	}

	if csg == stageSecurity {
		var err error
		if resp, err = c.security(st, get, resp); err != nil {
			return nil, false, err
		}
	} else if !st.authDone {
		if st.needAuth {
			return nil, false, refuse(statusAuthFailure, "operational stage without authentication")
		}
		st.authDone = true
	}
	if !c.discovery && !st.sentTPGT {
		st.sentTPGT = true
		resp = appendText(resp, "TargetPortalGroupTag", "1")
	}
	if wantTransit && !st.authDone {
		if st.chap.step == 1 || st.chap.step == 2 {
			// CHAP is under way (libiscsi asks to move on from its first
			// request): answer T=0 and go on with it.
			return resp, false, nil
		}
		return nil, false, refuse(statusAuthFailure, "left the security stage without authenticating")
	}
	if (csg == stageOperational || wantTransit && nsg == stageFullFeature) && !st.declared {
		st.declared = true
		resp = appendText(resp, "MaxRecvDataSegmentLength", strconv.Itoa(cfg.MaxRecvDataSegment))
	}
	if wantTransit && nsg == stageFullFeature {
		if err := c.enterFullFeature(); err != nil {
			return nil, false, err
		}
	}
	return resp, wantTransit, nil
}

// security runs the security stage's keys: AuthMethod, then CHAP.
func (c *conn) security(st *loginState, get func(string) (string, bool), resp []byte) ([]byte, error) {
	ch := &st.chap
	if v, ok := get("AuthMethod"); ok && ch.step == 0 {
		switch {
		case st.creds != nil && listHas(v, "CHAP") && !(c.discovery && listHas(v, "None")):
			resp = appendText(resp, "AuthMethod", "CHAP")
			ch.step = 1
		case !st.needAuth && listHas(v, "None"):
			resp = appendText(resp, "AuthMethod", "None")
			st.authDone = true
		default:
			return nil, refuse(statusAuthFailure, "AuthMethod %q: this target requires CHAP", v)
		}
	}
	if v, ok := get("CHAP_A"); ok {
		if ch.step != 1 {
			return nil, refuse(statusInitiatorError, "CHAP_A out of turn")
		}
		ch.alg = chooseCHAPAlg(v)
		if ch.alg == 0 {
			return nil, refuse(statusAuthFailure, "no supported CHAP algorithm in %q", v)
		}
		ch.id, ch.challenge = newChallenge(32)
		resp = appendText(resp, "CHAP_A", strconv.Itoa(ch.alg))
		resp = appendText(resp, "CHAP_I", strconv.Itoa(int(ch.id)))
		resp = appendText(resp, "CHAP_C", hexValue(ch.challenge))
		ch.step = 2
	}
	name, hasN := get("CHAP_N")
	r, hasR := get("CHAP_R")
	if hasN || hasR {
		if ch.step != 2 || !hasN || !hasR {
			return nil, refuse(statusInitiatorError, "CHAP_N/CHAP_R out of turn")
		}
		got, ok := parseBinary(r)
		want := chapResponse(ch.alg, ch.id, st.creds.Secret, ch.challenge)
		if name != st.creds.User || !ok || !constEq(got, want) {
			return nil, refuse(statusAuthFailure, "CHAP: wrong user or secret (user %q)", name)
		}
		ch.step = 3
		st.authDone = true
		idv, hasI := get("CHAP_I")
		cv, hasC := get("CHAP_C")
		if hasI || hasC {
			if st.creds.MutualSecret == "" {
				return nil, refuse(statusAuthFailure, "mutual CHAP asked for but not configured")
			}
			id, okI := parseNumber(idv)
			chal, okC := parseBinary(cv)
			if !hasI || !hasC || !okI || id > 255 || !okC || len(chal) == 0 || constEq(chal, ch.challenge) {
				return nil, refuse(statusAuthFailure, "mutual CHAP: bad CHAP_I or CHAP_C")
			}
			resp = appendText(resp, "CHAP_N", st.creds.MutualUser)
			resp = appendText(resp, "CHAP_R", hexValue(chapResponse(ch.alg, byte(id), st.creds.MutualSecret, chal)))
		}
	}
	if ch.step == 0 && !st.needAuth {
		st.authDone = true
	}
	return resp, nil
}

// operationalKey negotiates one operational key (RFC 7143 13) and returns
// the answer, or false for keys that get none (declarations).
func (c *conn) operationalKey(k, v string) (string, bool) {
	cfg := &c.s.cfg
	num := func(lo, hi uint64) (uint64, bool) {
		n, ok := parseNumber(v)
		return n, ok && n >= lo && n <= hi
	}
	yes := func() (bool, bool) {
		switch v {
		case "Yes":
			return true, true
		case "No":
			return false, true
		}
		return false, false
	}
	sessionWide := func() bool {
		switch k {
		case "MaxConnections", "InitialR2T", "ImmediateData", "MaxBurstLength", "FirstBurstLength",
			"MaxOutstandingR2T", "DataPDUInOrder", "DataSequenceInOrder", "DefaultTime2Wait", "DefaultTime2Retain":
			return true
		}
		return false
	}
	if c.discovery && sessionWide() {
		return "Irrelevant", true
	}
	switch k {
	case "HeaderDigest", "DataDigest":
		for _, d := range strings.Split(v, ",") {
			if d == "None" || d == "CRC32C" && !cfg.NoDigests {
				on := d == "CRC32C"
				if k == "HeaderDigest" {
					c.headerDigest = on
				} else {
					c.dataDigest = on
				}
				return d, true
			}
		}
		return "Reject", true
	case "MaxRecvDataSegmentLength":
		if n, ok := num(512, 1<<24-1); ok {
			c.peerMaxData = int(n)
		}
		return "", false
	case "MaxConnections":
		if n, ok := num(1, 65535); ok {
			return strconv.FormatUint(min(n, ourMaxConnections), 10), true
		}
	case "InitialR2T":
		if b, ok := yes(); ok {
			c.initialR2T = b
			return v, true
		}
	case "ImmediateData":
		if b, ok := yes(); ok {
			c.immediateData = b
			return v, true
		}
	case "MaxBurstLength":
		if n, ok := num(512, 1<<24-1); ok {
			c.maxBurst = int(min(n, ourMaxBurst))
			c.firstBurst = min(c.firstBurst, c.maxBurst)
			return strconv.Itoa(c.maxBurst), true
		}
	case "FirstBurstLength":
		if n, ok := num(512, 1<<24-1); ok {
			c.firstBurst = min(int(min(n, ourFirstBurst)), c.maxBurst)
			return strconv.Itoa(c.firstBurst), true
		}
	case "MaxOutstandingR2T":
		if _, ok := num(1, 65535); ok {
			return strconv.Itoa(ourMaxOutstandingR2T), true
		}
	case "DataPDUInOrder", "DataSequenceInOrder":
		if _, ok := yes(); ok {
			return "Yes", true
		}
	case "DefaultTime2Wait":
		if n, ok := num(0, 3600); ok {
			return strconv.FormatUint(max(n, 2), 10), true
		}
	case "DefaultTime2Retain":
		if _, ok := num(0, 3600); ok {
			return "0", true
		}
	case "ErrorRecoveryLevel":
		if _, ok := num(0, 2); ok {
			return "0", true
		}
	case "IFMarker", "OFMarker":
		if _, ok := yes(); ok {
			return "No", true
		}
	case "IFMarkInt", "OFMarkInt":
		return "Irrelevant", true
	case "SendTargets", "TargetAlias", "TargetAddress", "TargetPortalGroupTag":
		return "Irrelevant", true
	default:
		return "NotUnderstood", true
	}
	return "Reject", true
}

// redirect answers a login to vol's target with the portal the redirector
// chooses: the initiator logs in there instead (RFC 7143 6.2.1). No portal
// answers: 0x0301, which initiators retry.
func (c *conn) redirect(vol string) error {
	ctx, cancel := c.loginContext()
	portal, err := c.s.cfg.Redirect.Portal(ctx, vol)
	cancel()
	if err != nil {
		return refuse(statusUnavailable, "no access node to send the login to: %v", err)
	}
	return &loginFailure{status: statusMovedTemporarily, why: portal,
		text: appendText(nil, "TargetAddress", portal+",1")}
}

func (c *conn) loginContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.s.ctx, c.s.cfg.LoginTimeout)
}

// enterFullFeature completes a login: a normal session attaches its volume
// and registers (replacing an older session with the same ISID).
func (c *conn) enterFullFeature() error {
	if c.discovery {
		c.tsih = 1
		return nil
	}
	ctx, cancel := c.loginContext()
	att, err := c.s.cfg.Exports.Attach(ctx, c.volume)
	cancel()
	if errors.Is(err, frontend.ErrNoSuchExport) {
		return refuse(statusNotFound, "no volume %q", c.volume)
	} else if err != nil {
		return refuse(statusUnavailable, "volume %q could not be opened: %v", c.volume, err)
	}
	c.att = att
	c.lu = c.s.openLU(c.volume, scsi.Config{
		Backend: att.Backend(), Info: att.Info(), Classify: att.Classify,
		ID: c.s.volumeID(c.volume), TargetName: c.target, MaxTransfer: c.s.cfg.MaxTransfer,
		MayWrite: frontend.NewWriteGate(c.s.cfg.MayWrite, c.volume, c.initiator, c.s.cfg.MayWriteTTL,
			c.s.cfg.LoginTimeout, c.log).Allow,
		PR: &scsi.PR{Store: c.s.cfg.Reservations, Volume: c.volume, Nexus: reservation.Nexus{
			Initiator:  fmt.Sprintf("%s,i,0x%x", strings.ToLower(c.initiator), c.isid[:]),
			TargetPort: c.s.cfg.TargetPort,
		}, AbortTasks: c.abortTasks},
	})
	c.key = sessionKey{initiator: strings.ToLower(c.initiator), target: strings.ToLower(c.target), isid: c.isid}
	old := c.s.register(c.key, c)
	c.registered = true
	if old != nil {
		c.log.Info("iscsi: session reinstated: closing the old session's connection")
		old.nc.Close()
	}
	return nil
}
