package nvmf

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// hostLists is a Config.VolumeHostAllowed over lists the test changes: a
// volume without one allows every host; err, if set, is every answer.
type hostLists struct {
	mu    sync.Mutex
	lists map[string][]string
	err   error
}

func (h *hostLists) set(volume string, hosts ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lists[volume] = hosts
}

func (h *hostLists) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = err
}

func (h *hostLists) allowed(_ context.Context, volume, hostNQN string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.lists[volume]
	return len(l) == 0 || slices.Contains(l, hostNQN), h.err
}

// discoveryNQNs fetches the discovery log as hostNQN and returns the NVM
// subsystem NQNs it lists (not the current discovery subsystem's records).
func discoveryNQNs(t *testing.T, addr, hostNQN string) []string {
	t.Helper()
	d := dialInit(t, addr, false, false)
	d.must(d.connect(DiscoveryNQN, hostNQN, 0, 0xffff, 0))
	hdr := d.must(d.do(newSQE(adminGetLogPage, 0, logDiscovery|(1024/4-1)<<16), nil, false, 1024)).data
	n := int(binary.LittleEndian.Uint64(hdr[8:]))
	if n == 0 {
		return nil
	}
	page := d.must(d.do(newSQE(adminGetLogPage, 0, logDiscovery|(uint32(1024*(n+1))/4-1)<<16), nil, false, 1024*(n+1))).data
	var nqns []string
	for i := 1; i <= n; i++ {
		if page[1024*i+2] == subtypeNVM {
			nqns = append(nqns, strings.TrimRight(string(page[1024*i+256:1024*i+512]), "\x00"))
		}
	}
	slices.Sort(nqns)
	return nqns
}

const hostC = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-0000-0000-000000000003"

// A volume's own allow-list (Config.VolumeHostAllowed) on top of the
// target's (AllowedHosts): a host either refuses gets Connect Invalid Host
// (SCT 1, SC 84h) with DNR, and the discovery log it fetches lists only the
// subsystems it may connect to. A change applies to the next Connect; a
// controller already connected stays. A list that cannot be read refuses
// the Connect with Controller Busy, which the host retries.
func TestVolumeAllowList(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	vol, open := newDisk(1<<20), newDisk(1<<20)
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: frontendtest.Disks{"vol": vol, "open": open}, Logger: quiet})
	lists := &hostLists{lists: map[string][]string{}}
	lists.set("vol", hostA, hostC)
	_, addr := serve(t, Config{Exports: ex, Logger: quiet, AllowedHosts: []string{hostA, hostB}, VolumeHostAllowed: lists.allowed})
	connect := func(sub, host string) result {
		t.Helper()
		in := dialInit(t, addr, false, false)
		r, err := in.connect(VolumeNQNPrefix+sub, host, 0, 0xffff, 0)
		if err != nil {
			t.Fatalf("connect %s as %s: %v", sub, host, err)
		}
		return r
	}
	refused := func(sub, host, why string) {
		t.Helper()
		if r := connect(sub, host); r.status != scConnectHost || !r.dnr {
			t.Errorf("%s: connect %s as %s: status %#x dnr %v, want Connect Invalid Host (%#x) with DNR", why, sub, host, r.status, r.dnr, scConnectHost)
		}
	}
	served := func(sub, host, why string) {
		t.Helper()
		if r := connect(sub, host); r.status != scSuccess {
			t.Errorf("%s: connect %s as %s: status %#x, want success", why, sub, host, r.status)
		}
	}
	sees := func(host string, want ...string) {
		t.Helper()
		for i := range want {
			want[i] = VolumeNQNPrefix + want[i]
		}
		if got := discoveryNQNs(t, addr, host); !slices.Equal(got, want) {
			t.Errorf("discovery log of %s lists %v, want %v", host, got, want)
		}
	}

	served("vol", hostA, "on both lists")
	refused("vol", hostB, "on the target's list, not the volume's")
	refused("vol", hostC, "on the volume's list, not the target's")
	served("open", hostB, "a volume without a list")
	sees(hostA, "open", "vol")
	sees(hostB, "open")
	sees(hostC)

	// hostA keeps a controller of vol across the change.
	keep := dialInit(t, addr, false, false)
	keep.must(keep.connect(VolumeNQNPrefix+"vol", hostA, 0, 0xffff, 0))
	lists.set("vol", hostB)
	refused("vol", hostA, "taken off the volume's list")
	served("vol", hostB, "put on it")
	sees(hostA, "open")
	sees(hostB, "open", "vol")
	keep.must(keep.do(newSQE(adminKeepAlive, 0), nil, false, 0))
	keep.must(keep.do(newSQE(adminIdentify, 1, 0), nil, false, 4096))

	lists.set("vol")
	served("vol", hostA, "a list emptied")

	lists.fail(errors.New("the MDS is unreachable"))
	if r := connect("open", hostA); r.status != scConnectBusy || r.dnr {
		t.Errorf("a list that cannot be read: status %#x dnr %v, want Controller Busy (%#x) without DNR", r.status, r.dnr, scConnectBusy)
	}
	sees(hostA)
}

// A group subsystem (several volumes) admits a host every one of its
// volumes allows.
func TestGroupAllowList(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: frontendtest.Disks{"a": newDisk(1 << 20), "b": newDisk(1 << 20)}, Logger: quiet})
	lists := &hostLists{lists: map[string][]string{}}
	lists.set("b", hostB)
	s, addr := serve(t, Config{Exports: ex, Logger: quiet, Multipath: true, NodeID: 1, VolumeHostAllowed: lists.allowed})
	const group = GroupNQNPrefix + "g"
	s.SetPaths(Paths{Groups: map[string][]string{group: {"a", "b"}}})
	in := dialInit(t, addr, false, false)
	if r, _ := in.connect(group, hostA, 0, 0xffff, 0); r.status != scConnectHost || !r.dnr {
		t.Errorf("hostA, refused by volume b, to the group: status %#x, want Connect Invalid Host", r.status)
	}
	in = dialInit(t, addr, false, false)
	in.must(in.connect(group, hostB, 0, 0xffff, 0))
	if got := discoveryNQNs(t, addr, hostA); len(got) != 0 {
		t.Errorf("hostA's discovery log lists %v, want nothing (volume a is in the group)", got)
	}
	if got := discoveryNQNs(t, addr, hostB); !slices.Equal(got, []string{group}) {
		t.Errorf("hostB's discovery log lists %v, want the group", got)
	}
}
