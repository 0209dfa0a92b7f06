package nvmf

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/internal/nvmftshark"
)

// volumeSet is a frontend.Opener whose volumes a test creates and deletes.
type volumeSet struct {
	mu    sync.Mutex
	disks frontendtest.Disks
}

func (v *volumeSet) Open(ctx context.Context, name string) (frontend.Backend, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.disks.Open(ctx, name)
}

func (v *volumeSet) Stat(ctx context.Context, name string) (frontend.Info, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.disks.Stat(ctx, name)
}

func (v *volumeSet) List(ctx context.Context) ([]string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.disks.List(ctx)
}

func (v *volumeSet) Classify(err error) error { return v.disks.Classify(err) }

func (v *volumeSet) set(name string, d *frontendtest.Disk) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.disks[name] = d
}

// del deletes volumes at once.
func (v *volumeSet) del(names ...string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, n := range names {
		delete(v.disks, n)
	}
}

// discLog reads the discovery log as admin (RAE as given) and returns its
// generation counter and subsystem NQN per NVM subsystem record, as
// "PORTID NQN".
func discLog(t *testing.T, admin *initiator, rae bool) (gen uint64, recs []string) {
	t.Helper()
	cdw10 := uint32(logDiscovery | (16384/4-1)<<16)
	if rae {
		cdw10 |= 1 << 15
	}
	page := admin.must(admin.do(newSQE(adminGetLogPage, 0, cdw10), nil, false, 16384)).data
	n := int(binary.LittleEndian.Uint64(page[8:]))
	for i := 1; i <= n; i++ {
		e := page[1024*i:]
		if e[2] != subtypeNVM {
			continue
		}
		recs = append(recs, fmt.Sprintf("%d %s", binary.LittleEndian.Uint16(e[4:]), strings.TrimRight(string(e[256:512]), "\x00")))
	}
	slices.Sort(recs)
	return binary.LittleEndian.Uint64(page[0:]), recs
}

// TestDiscoveryChangeNotice: a discovery controller advertises Discovery
// Log Page Change notices (OAES bit 31); a host that enabled them (AEC bit
// 31) and holds an Asynchronous Event Request gets a notice (type notice,
// information F0h, log page 70h) when its log changes — an access node
// joins (SetPaths), a volume is created or deleted, its allow-list leaves
// the host out (found by the periodic rebuild) — with the generation counter bumped each time; no second
// notice until the host read the log without RAE; a host that did not
// enable them gets none. More than AERL+1 outstanding AERs get Asynchronous
// Event Request Limit Exceeded. tshark decodes the notices.
func TestDiscoveryChangeNotice(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	vols := &volumeSet{disks: frontendtest.Disks{"vol": newDisk(1 << 20)}}
	ex := frontend.NewExports(frontend.ExportsConfig{Opener: vols, Logger: quiet})
	lists := &hostLists{lists: map[string][]string{}}
	s, addr := serve(t, Config{Exports: ex, Logger: quiet, Multipath: true, NodeID: 1, DiscoveryCheck: 20 * time.Millisecond,
		VolumeHostAllowed: lists.allowed})
	capture := nvmftshark.Start(t, addr)
	p1, p2 := Port{1, "10.0.0.1:4420"}, Port{2, "10.0.0.2:4420"}
	s.SetPaths(Paths{Ports: []Port{p1}})

	d := dialInit(t, addr, true, true)
	d.must(d.connect(DiscoveryNQN, hostA, 0, 0xffff, 0))
	id := d.must(d.do(newSQE(adminIdentify, 0, 1), nil, false, 4096)).data
	if id[111] != 2 || binary.LittleEndian.Uint32(id[92:]) != aenDiscEnabled {
		t.Fatalf("discovery Identify: CNTRLTYPE %d OAES %#x, want 2 and bit 31 alone", id[111], binary.LittleEndian.Uint32(id[92:]))
	}
	// A second host's discovery controller that does not enable notices.
	quietHost := dialInit(t, addr, true, true)
	quietHost.must(quietHost.connect(DiscoveryNQN, hostB, 0, 0xffff, 0))
	quietAER := quietHost.send(newSQE(adminAsyncEvent, 0))

	gen0, recs := discLog(t, d, false)
	if !slices.Equal(recs, []string{"1 " + VolumeNQNPrefix + "vol"}) {
		t.Fatalf("discovery log %v", recs)
	}
	d.must(d.do(newSQE(adminSetFeatures, 0, 0x0b, aenDiscEnabled), nil, false, 0))
	if r := d.must(d.do(newSQE(adminGetFeatures, 0, 0x0b), nil, false, 0)); r.dw0 != aenDiscEnabled {
		t.Fatalf("Get Features AEC %#x", r.dw0)
	}

	// An access node joins.
	aer := d.send(newSQE(adminAsyncEvent, 0))
	s.SetPaths(Paths{Ports: []Port{p1, p2}})
	if st, dw0 := d.response(aer); st != scSuccess || dw0 != 0x70f002 {
		t.Fatalf("AER: status %#x dw0 %#x, want a discovery log change notice 0x70f002", st, dw0)
	}
	// Masked until the host reads the log without RAE: a volume created
	// now changes the log (its reads with RAE see it, with a higher
	// generation) and no notice completes the held AER (do fails on a
	// response to another command).
	aer = d.send(newSQE(adminAsyncEvent, 0))
	vols.set("new", newDisk(1<<20))
	gen1, recs := discLog(t, d, true)
	deadline := time.Now().Add(60 * time.Second)
	for !slices.Contains(recs, "2 "+VolumeNQNPrefix+"new") {
		if time.Now().After(deadline) {
			t.Fatalf("the new volume is not in the log after 60 s: %v", recs)
		}
		time.Sleep(20 * time.Millisecond)
		gen1, recs = discLog(t, d, true)
	}
	if gen1 < gen0+2 {
		t.Fatalf("generation %d after two changes, was %d", gen1, gen0)
	}
	// The read without RAE shows the host the log as it is: no notice for
	// what it read, and notices are on again.
	gen2, recs := discLog(t, d, false)
	want := []string{"1 " + VolumeNQNPrefix + "new", "1 " + VolumeNQNPrefix + "vol", "2 " + VolumeNQNPrefix + "new", "2 " + VolumeNQNPrefix + "vol"}
	if !slices.Equal(recs, want) || gen2 != gen1 {
		t.Fatalf("log %v generation %d (was %d), want %v, the same generation", recs, gen2, gen1, want)
	}
	vols.set("new2", newDisk(1<<20))
	if st, dw0 := d.response(aer); st != scSuccess || dw0 != aenDiscChange {
		t.Fatalf("AER after a volume was created: status %#x dw0 %#x", st, dw0)
	}
	gen3, recs := discLog(t, d, false)
	if gen3 <= gen2 || len(recs) != 6 {
		t.Fatalf("after the second volume: log %v generation %d (was %d)", recs, gen3, gen2)
	}
	// Volumes deleted.
	aer = d.send(newSQE(adminAsyncEvent, 0))
	vols.del("new", "new2")
	if st, dw0 := d.response(aer); st != scSuccess || dw0 != aenDiscChange {
		t.Fatalf("AER after a delete: status %#x dw0 %#x", st, dw0)
	}
	if gen4, recs := discLog(t, d, false); gen4 <= gen3 || len(recs) != 2 {
		t.Fatalf("after the deletes: log %v generation %d (was %d)", recs, gen4, gen3)
	}

	// The volume's allow-list leaves hostA out.
	aer = d.send(newSQE(adminAsyncEvent, 0))
	lists.set("vol", hostB)
	if st, dw0 := d.response(aer); st != scSuccess || dw0 != aenDiscChange {
		t.Fatalf("AER after an allow-list change: status %#x dw0 %#x", st, dw0)
	}
	if _, recs := discLog(t, d, false); len(recs) != 0 {
		t.Fatalf("hostA's log after the volume's list left it out: %v", recs)
	}

	// AERL is 3: four may be outstanding, a fifth is refused.
	for range 4 {
		d.send(newSQE(adminAsyncEvent, 0))
	}
	if r, err := d.do(newSQE(adminAsyncEvent, 0), nil, false, 0); err != nil || r.status != scAERLimit || !r.dnr {
		t.Fatalf("a fifth AER: status %#x dnr %v, %v; want Asynchronous Event Request Limit Exceeded with DNR", r.status, r.dnr, err)
	}
	// The host that did not enable notices got none: its AER is still held.
	quietHost.must(quietHost.do(newSQE(adminKeepAlive, 0), nil, false, 0))
	_ = quietAER

	d.Close()
	quietHost.Close()
	if capture == nil {
		t.Log("no capture: tshark or dumpcap missing or not allowed to capture (see above)")
		return
	}
	capture.Check(t, 2, nvmftshark.Want{Digests: true, PDUs: map[int]int{nvmftshark.ICReq: 2}})
	if n := capture.Count(t, "nvme.cqe.dword0.aev.aet == 2 && nvme.cqe.dword0.aev.aei == 0xf0 && nvme.cqe.dword0.aev.lpi == 0x70"); n != 4 {
		t.Errorf("tshark decodes %d discovery log change notices, want 4", n)
	}
	if n := capture.Count(t, "nvme.cmd.set_features.dword11.aec.disc == 1"); n != 1 {
		t.Errorf("tshark decodes %d Set Features enabling discovery log change notices, want 1", n)
	}
}
