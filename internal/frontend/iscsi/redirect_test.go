package iscsi

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// portalsFixed is a Redirector over a fixed list; err, if set, is every answer.
type portalsFixed struct {
	portals []string
	err     error
}

func (p portalsFixed) Portal(_ context.Context, volume string) (string, error) {
	if p.err != nil {
		return "", p.err
	}
	return p.portals[len(volume)%len(p.portals)], nil
}

func (p portalsFixed) Portals(context.Context) ([]string, error) { return p.portals, p.err }

// A redirector answers a normal login "target moved temporarily" with the
// portal its Redirector chooses, before any authentication (the access
// node it sends the initiator to asks for that); an unknown target is
// refused, not redirected; no portal to send to is "service unavailable",
// which initiators retry; discovery lists every target at every portal.
func TestRedirectorLogin(t *testing.T) {
	disks := frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20), "disk2": frontendtest.NewDisk(1 << 20)}
	_, addr := startServer(t, disks, Config{
		CHAP:     chapConfig(),
		Redirect: portalsFixed{portals: []string{"10.0.0.1:3260", "10.0.0.2:3260"}},
	})
	c := dialClient(t, addr)
	st, flags, keys := c.login(0, 1, true, "InitiatorName", testInitiator, "TargetName", TargetName(testCluster, "disk"), "AuthMethod", "CHAP")
	if st != statusMovedTemporarily || keys["TargetAddress"] != "10.0.0.1:3260,1" || flags&0x80 != 0 {
		t.Errorf("login through the redirector: status %#04x, flags %#x, keys %v; want 0x0101 and TargetAddress 10.0.0.1:3260,1", st, flags, keys)
	}
	c.expectClosed()

	c = dialClient(t, addr)
	if st, _, keys := c.login(0, 1, true, "InitiatorName", testInitiator, "TargetName", TargetName(testCluster, "nope"), "AuthMethod", "CHAP"); st != statusNotFound {
		t.Errorf("login to an unknown target through the redirector: status %#04x, keys %v; want 0x0203", st, keys)
	}

	c = dialClient(t, addr)
	if st, _, _ := c.login(0, 3, true, "InitiatorName", testInitiator, "SessionType", "Discovery", "AuthMethod", "None"); st != 0 {
		t.Fatalf("discovery login: status %#04x", st)
	}
	got := c.sendTargets()
	want := []string{
		"TargetName=" + TargetName(testCluster, "disk"), "TargetAddress=10.0.0.1:3260,1", "TargetAddress=10.0.0.2:3260,1",
		"TargetName=" + TargetName(testCluster, "disk2"), "TargetAddress=10.0.0.1:3260,1", "TargetAddress=10.0.0.2:3260,1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("SendTargets through the redirector: %q, want %q", got, want)
	}

	_, addr = startServer(t, disks, Config{Redirect: portalsFixed{err: errors.New("no access node is online")}})
	c = dialClient(t, addr)
	if st, _, _ := c.login(0, 1, true, "InitiatorName", testInitiator, "TargetName", TargetName(testCluster, "disk"), "AuthMethod", "None"); st != statusUnavailable {
		t.Errorf("login through a redirector with no portal: status %#04x, want 0x0301", st)
	}
}

// sendTargets asks SendTargets=All in a discovery session and returns the
// answer's key=value pairs in order.
func (c *testClient) sendTargets() []string {
	c.t.Helper()
	p := &pdu{}
	p.bhs[0] = 0x40 | opTextReq
	p.bhs[1] = 0x80
	c.itt++
	p.put32(16, c.itt)
	p.put32(20, 0xffffffff)
	p.put32(24, c.cmdSN)
	p.put32(28, c.statSN)
	p.data = appendText(nil, "SendTargets", "All")
	c.write(p)
	r := c.mustRead()
	if r.opcode() != opTextResp || r.bhs[1]&0x80 == 0 {
		c.t.Fatalf("SendTargets: opcode %#x flags %#x, want a final Text Response", r.opcode(), r.bhs[1])
	}
	// (parseText refuses a key given twice, which SendTargets does.)
	return strings.Split(strings.TrimRight(string(r.data), "\x00"), "\x00")
}
