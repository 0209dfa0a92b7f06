package iscsi

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/testutil"
)

const testInitiator = "iqn.2026-11.io.basalt.test:client"

func chapConfig() *CHAP {
	return &CHAP{User: "alice", Secret: "alice-secret-123", MutualUser: "target", MutualSecret: "target-secret-456"}
}

// chapLogin runs a CHAP login with algorithm list algs, answering with
// secret; mutual adds the initiator's challenge. It returns the final
// status and the target's keys of the last response.
func chapLogin(c *testClient, target, algs, user, secret string, mutual bool) (uint16, map[string]string) {
	c.t.Helper()
	st, _, keys := c.login(0, 1, false, "InitiatorName", testInitiator, "SessionType", "Normal",
		"TargetName", target, "AuthMethod", "CHAP,None")
	if st != 0 {
		return st, keys
	}
	if keys["AuthMethod"] != "CHAP" {
		c.t.Fatalf("AuthMethod %q, want CHAP", keys["AuthMethod"])
	}
	st, _, keys = c.login(0, 1, false, "CHAP_A", algs)
	if st != 0 {
		return st, keys
	}
	alg := 0
	switch keys["CHAP_A"] {
	case "5":
		alg = chapMD5
	case "6":
		alg = chapSHA1
	case "7":
		alg = chapSHA256
	default:
		c.t.Fatalf("CHAP_A %q", keys["CHAP_A"])
	}
	resp := []string{"CHAP_N", user, "CHAP_R", chapHex(alg, keys["CHAP_I"], secret, keys["CHAP_C"])}
	if mutual {
		resp = append(resp, "CHAP_I", "77", "CHAP_C", "0x0123456789abcdef0123456789abcdef")
	}
	st, _, keys = c.login(0, 1, true, resp...)
	if st != 0 || !mutual {
		return st, keys
	}
	want := chapHex(alg, "77", chapConfig().MutualSecret, "0x0123456789abcdef0123456789abcdef")
	if keys["CHAP_N"] != "target" || keys["CHAP_R"] != want {
		c.t.Fatalf("mutual CHAP: target answered %q %q, want target %q", keys["CHAP_N"], keys["CHAP_R"], want)
	}
	return st, keys
}

// Logins that must be refused are, with the status RFC 7143 gives the case,
// a log line, and nothing served; good ones succeed (CHAP with MD5, SHA-1
// and SHA-256, one-way and mutual).
func TestLoginStatus(t *testing.T) {
	var logs testutil.LogBuffer
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20)}, Config{
		CHAP:       chapConfig(),
		Initiators: []string{testInitiator},
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
	})
	target := TargetName(testCluster, "disk")
	cases := []struct {
		name       string
		run        func(c *testClient) uint16
		wantStatus uint16
	}{
		{"unknown target", func(c *testClient) uint16 {
			st, _, _ := c.login(0, 1, true, "InitiatorName", testInitiator, "TargetName", TargetName(testCluster, "nope"), "AuthMethod", "CHAP")
			return st
		}, statusNotFound},
		{"another cluster's target", func(c *testClient) uint16 {
			st, _, _ := c.login(0, 1, true, "InitiatorName", testInitiator, "TargetName", TargetName("other", "disk"), "AuthMethod", "CHAP")
			return st
		}, statusNotFound},
		{"initiator not allowed", func(c *testClient) uint16 {
			st, _, _ := c.login(0, 1, true, "InitiatorName", "iqn.2026-11.io.basalt.test:stranger", "TargetName", target, "AuthMethod", "CHAP")
			return st
		}, statusAuthorization},
		{"no InitiatorName", func(c *testClient) uint16 {
			st, _, _ := c.login(0, 1, true, "TargetName", target)
			return st
		}, statusMissingParam},
		{"no authentication offered", func(c *testClient) uint16 {
			st, _, _ := c.login(0, 1, true, "InitiatorName", testInitiator, "TargetName", target, "AuthMethod", "None")
			return st
		}, statusAuthFailure},
		{"skipping the security stage", func(c *testClient) uint16 {
			st, _, _ := c.login(1, 3, true, "InitiatorName", testInitiator, "TargetName", target)
			return st
		}, statusAuthFailure},
		{"wrong CHAP secret", func(c *testClient) uint16 {
			st, _ := chapLogin(c, target, "5", "alice", "wrong", false)
			return st
		}, statusAuthFailure},
		{"wrong CHAP user", func(c *testClient) uint16 {
			st, _ := chapLogin(c, target, "5", "mallory", chapConfig().Secret, false)
			return st
		}, statusAuthFailure},
		{"CHAP MD5", func(c *testClient) uint16 {
			st, _ := chapLogin(c, target, "5", "alice", chapConfig().Secret, false)
			return st
		}, statusSuccess},
		{"CHAP SHA-1", func(c *testClient) uint16 {
			st, _ := chapLogin(c, target, "6,5", "alice", chapConfig().Secret, false)
			return st
		}, statusSuccess},
		{"CHAP SHA-256, mutual", func(c *testClient) uint16 {
			st, _ := chapLogin(c, target, "7,5", "alice", chapConfig().Secret, true)
			return st
		}, statusSuccess},
		{"CHAP MD5, mutual", func(c *testClient) uint16 {
			st, _ := chapLogin(c, target, "5", "alice", chapConfig().Secret, true)
			return st
		}, statusSuccess},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialClient(t, addr)
			if got := tc.run(c); got != tc.wantStatus {
				t.Fatalf("login status %#04x, want %#04x", got, tc.wantStatus)
			}
			if tc.wantStatus != statusSuccess {
				c.expectClosed()
			}
		})
	}
	out := logs.String()
	for _, want := range []string{"status=0x0203", "status=0x0202", "status=0x0201"} {
		if !strings.Contains(out, "login refused") || !strings.Contains(out, want) {
			t.Errorf("no log line of a refused login with %s", want)
		}
	}
	if strings.Contains(out, chapConfig().Secret) || strings.Contains(out, chapConfig().MutualSecret) {
		t.Errorf("a CHAP secret was logged")
	}
}

// libiscsi (a real initiator) gets in with the right CHAP secret and is
// refused with a wrong one, a target that does not exist, or an initiator
// name off the allow-list.
func TestLibiscsiLogin(t *testing.T) {
	testutil.RequireTool(t, "iscsi-inq")
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20)}, Config{
		CHAP: chapConfig(), Initiators: []string{testInitiator},
	})
	target := TargetName(testCluster, "disk")
	run := func(url, initiator string) (string, error) {
		cmd := exec.Command("timeout", "-k", "5", "60", "iscsi-inq", "-i", initiator, url)
		out, err := cmd.CombinedOutput()
		return string(bytes.TrimSpace(out)), err
	}
	if out, err := run("iscsi://alice%alice-secret-123@"+addr+"/"+target+"/0", testInitiator); err != nil {
		t.Fatalf("the right secret was refused: %v: %s", err, out)
	}
	// Mutual CHAP: libiscsi checks the target's answer.
	mutual := "iscsi://alice%alice-secret-123@" + addr + "/" + target + "/0?target_user=target&target_password="
	if out, err := run(mutual+"target-secret-456", testInitiator); err != nil {
		t.Fatalf("mutual CHAP was refused: %v: %s", err, out)
	}
	if out, err := run(mutual+"not-the-secret-1", testInitiator); err == nil || !strings.Contains(out, "Invalid CHAP_R") {
		t.Errorf("libiscsi accepted a target that does not know the mutual secret: %v: %s", err, out)
	}
	for _, bad := range []struct{ url, initiator, want string }{
		{"iscsi://alice%wrong-secret-12@" + addr + "/" + target + "/0", testInitiator, "Authentication failure(513)"},
		{"iscsi://" + addr + "/" + target + "/0", testInitiator, "Authentication failure(513)"},
		{"iscsi://alice%alice-secret-123@" + addr + "/" + TargetName(testCluster, "nope") + "/0", testInitiator, "Target not found(515)"},
		{"iscsi://alice%alice-secret-123@" + addr + "/" + target + "/0", "iqn.2026-11.io.basalt.test:stranger", "Authorization failure(514)"},
	} {
		if out, err := run(bad.url, bad.initiator); err == nil || !strings.Contains(out, bad.want) {
			t.Errorf("iscsi-inq %s as %s: %v: %q, want a refusal with %s", bad.url, bad.initiator, err, out, bad.want)
		}
	}
}

// A login that never finishes is cut off at LoginTimeout.
func TestLoginDeadline(t *testing.T) {
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20)}, Config{LoginTimeout: 500 * time.Millisecond})
	c := dialClient(t, addr)
	c.nc.Write([]byte{0x43, 0x87}) // the start of a login PDU, and then nothing
	c.expectClosed()
	c = dialClient(t, addr) // still serving
	c.loginNormal(testInitiator, TargetName(testCluster, "disk"))
}

// A malformed PDU closes only its own connection, with a log line; other
// sessions go on.
func TestMalformedPDUClosesOnlyItsConnection(t *testing.T) {
	var logs testutil.LogBuffer
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20)}, Config{
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), MaxRecvDataSegment: 8192,
	})
	target := TargetName(testCluster, "disk")
	good := dialClient(t, addr)
	good.loginNormal(testInitiator, target)
	cases := map[string]func(c *testClient){
		"oversized data segment": func(c *testClient) {
			p := &pdu{data: make([]byte, 16384)}
			p.bhs[0] = opNopOut | 0x40
			p.bhs[1] = 0x80
			p.put32(16, 9)
			c.write(p)
		},
		"AHS overrunning itself": func(c *testClient) {
			b := make([]byte, 48+8)
			b[0], b[1], b[4] = opSCSICmd, 0x80, 2
			b[48], b[49] = 0x10, 0x00 // a 4096-byte AHS segment in 8 bytes
			c.nc.Write(b)
		},
		"Data-Out at the wrong offset": func(c *testClient) {
			p := &pdu{}
			p.bhs[0] = opSCSICmd
			p.bhs[1] = 0x80 | 0x20
			p.put32(16, 5)
			p.put32(20, 1024)
			p.put32(24, c.cmdSN)
			copy(p.bhs[32:], cdb10(0x2a, 0, 2))
			c.write(p)
			d := &pdu{data: make([]byte, 512)}
			d.bhs[0] = opDataOut
			d.bhs[1] = 0x80
			d.put32(16, 5)
			d.put32(20, reservedTag)
			d.put32(40, 512) // offset 512 first
			c.write(d)
		},
	}
	for name, send := range cases {
		t.Run(name, func(t *testing.T) {
			c := dialClient(t, addr)
			c.loginNormal(testInitiator, target, "InitialR2T", "No", "ImmediateData", "Yes")
			send(c)
			c.expectClosed()
		})
	}
	if st, _, _ := good.command(cdb10(0x28, 0, 1), 512, nil); st != 0 {
		t.Fatalf("the other session's READ: status %#x", st)
	}
	if out := logs.String(); !strings.Contains(out, "malformed PDU") {
		t.Errorf("no log line about the malformed PDU:\n%s", out)
	}
}

// CRC32C header and data digests: negotiated, checked both ways; a data
// digest error is rejected and the session goes on.
func TestDigests(t *testing.T) {
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20)}, Config{})
	c := dialClient(t, addr)
	keys := c.loginNormal(testInitiator, TargetName(testCluster, "disk"),
		"HeaderDigest", "CRC32C,None", "DataDigest", "CRC32C,None", "ImmediateData", "Yes", "InitialR2T", "No")
	if !c.hd || !c.dd {
		t.Fatalf("digests not negotiated: %v", keys)
	}
	block := bytes.Repeat([]byte("basalt!!"), 64)
	if st, _, sense := c.command(cdb10(0x2a, 3, 1), 512, block); st != 0 {
		t.Fatalf("WRITE: status %#x sense % x", st, sense)
	}
	st, data, _ := c.command(cdb10(0x28, 3, 1), 512, nil)
	if st != 0 || !bytes.Equal(data, block) {
		t.Fatalf("READ: status %#x, data equal %v", st, bytes.Equal(data, block))
	}
	// A NOP-Out whose data digest is wrong: rejected, nothing else.
	p := &pdu{data: []byte("ping")}
	p.bhs[0] = opNopOut | 0x40
	p.bhs[1] = 0x80
	p.put32(16, 77)
	p.put32(24, c.cmdSN)
	b := appendPDU(nil, p, true, true)
	b[len(b)-1] ^= 0xff
	c.nc.Write(b)
	r := c.mustRead()
	if r.opcode() != opReject || r.bhs[2] != rejectDataDigest {
		t.Fatalf("got opcode %#x reason %#x, want a Reject for the data digest", r.opcode(), r.bhs[2])
	}
	if st, _, _ := c.command(cdb10(0x28, 3, 1), 512, nil); st != 0 {
		t.Fatalf("READ after the reject: status %#x", st)
	}
	// A bad header digest: nothing in the header can be trusted: closed.
	b = appendPDU(nil, p, true, true)
	b[50] ^= 0xff
	c.nc.Write(b)
	c.expectClosed()
}

// The buffers a session holds are bounded: writes whose data has not come
// yet hold their buffers, and one past MaxSessionBytes gets TASK SET FULL.
func TestSessionMemoryBound(t *testing.T) {
	_, addr := startServer(t, frontendtest.Disks{"disk": frontendtest.NewDisk(8 << 20)}, Config{MaxSessionBytes: 256 << 10})
	c := dialClient(t, addr)
	c.loginNormal(testInitiator, TargetName(testCluster, "disk"), "InitialR2T", "Yes", "ImmediateData", "No")
	const blocks = 128 // 64 KiB per write: four fit
	r2ts := 0
	for i := range 5 {
		p := &pdu{}
		p.bhs[0] = opSCSICmd
		p.bhs[1] = 0x80 | 0x20
		c.itt++
		p.put32(16, c.itt)
		p.put32(20, blocks*512)
		p.put32(24, c.cmdSN)
		c.cmdSN++
		copy(p.bhs[32:], cdb10(0x2a, uint32(i*blocks), blocks))
		c.write(p)
		r := c.mustRead()
		switch {
		case i < 4 && r.opcode() == opR2T:
			r2ts++
		case i == 4 && r.opcode() == opSCSIResp && r.bhs[3] == 0x28:
		default:
			t.Fatalf("write %d: opcode %#x status %#x", i, r.opcode(), r.bhs[3])
		}
	}
	if r2ts != 4 {
		t.Fatalf("%d R2Ts, want 4", r2ts)
	}
}

// A target's own CHAP (Config.TargetCHAP, the MDS's record) takes
// precedence over the node-wide one; a target without one falls back to
// it; not knowing a target's CHAP refuses the login (0x0301), and
// discovery keeps the node-wide rule.
func TestTargetCHAPPrecedence(t *testing.T) {
	own := &CHAP{User: "bob", Secret: "bob-secret-0123"}
	var down atomic.Bool
	var logs testutil.LogBuffer
	_, addr := startServer(t, frontendtest.Disks{"own": frontendtest.NewDisk(1 << 20), "plain": frontendtest.NewDisk(1 << 20)}, Config{
		CHAP:   chapConfig(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		TargetCHAP: func(_ context.Context, volume string) (*CHAP, error) {
			if down.Load() {
				return nil, errors.New("the MDS cannot be reached")
			}
			if volume == "own" {
				return own, nil
			}
			return nil, nil
		},
	})
	ownT, plainT := TargetName(testCluster, "own"), TargetName(testCluster, "plain")
	for _, tc := range []struct {
		name, target, user, secret string
		want                       uint16
	}{
		{"own target, its secret", ownT, "bob", own.Secret, statusSuccess},
		{"own target, the node's secret", ownT, "alice", chapConfig().Secret, statusAuthFailure},
		{"own target, wrong secret", ownT, "bob", "bob-secret-0124", statusAuthFailure},
		{"plain target, the node's secret", plainT, "alice", chapConfig().Secret, statusSuccess},
		{"plain target, the other target's secret", plainT, "bob", own.Secret, statusAuthFailure},
	} {
		c := dialClient(t, addr)
		if st, _ := chapLogin(c, tc.target, "5", tc.user, tc.secret, false); st != tc.want {
			t.Errorf("%s: status %#04x, want %#04x", tc.name, st, tc.want)
		}
		c.nc.Close()
	}
	// Mutual CHAP asked of a target whose record has none is refused.
	c := dialClient(t, addr)
	if st, _ := chapLogin(c, ownT, "5", "bob", own.Secret, true); st != statusAuthFailure {
		t.Errorf("mutual CHAP with a one-way target record: status %#04x, want %#04x", st, statusAuthFailure)
	}
	c.nc.Close()

	down.Store(true)
	for _, target := range []string{ownT, plainT} {
		c := dialClient(t, addr)
		st, _, _ := c.login(0, 1, false, "InitiatorName", testInitiator, "SessionType", "Normal",
			"TargetName", target, "AuthMethod", "CHAP,None")
		if st != statusUnavailable {
			t.Errorf("%s with its CHAP unknown: status %#04x, want %#04x (fail closed)", target, st, statusUnavailable)
		}
		c.expectClosed()
	}
	c = dialClient(t, addr)
	if st, _, keys := c.login(0, 1, false, "InitiatorName", testInitiator, "SessionType", "Discovery",
		"AuthMethod", "None"); st != 0 || keys["AuthMethod"] != "None" {
		t.Errorf("discovery while target CHAP is unknown: status %#04x, AuthMethod %q", st, keys["AuthMethod"])
	}
	c.nc.Close()
	if out := logs.String(); strings.Contains(out, own.Secret) || strings.Contains(out, chapConfig().Secret) {
		t.Errorf("a CHAP secret was logged")
	}
}
