package access_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/nvmfhost"
	"github.com/basalt-storage/basalt/internal/nvmftshark"
	"github.com/basalt-storage/basalt/internal/testcluster"
)

// A volume's NVMe allow-list lives in the MDS: an admin sets it with
// `basalt volume allow-host` (a bad NQN refused, changing nothing; the
// list shown by `volume info` and `ls`), and an NVMe/TCP access node over
// the same MDS refuses a Connect from a host not on it with Connect
// Invalid Host (SCT 1, SC 84h, DNR), leaves the subsystem out of that
// host's discovery log, and admits a host on it; `deny-host` of the last
// host opens the volume to every host again. tshark decodes the refusal.
func TestVolumeAllowListFromMDS(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Copysets: 4})
	c.CreateVolume("vol", 16<<20)
	c.CreateVolume("open", 16<<20)
	id := c.Identity(identity.RoleAccess, "access-hosts")
	node, err := access.Start(access.Config{
		MDS: strings.Split(c.MDSAddr, ","), MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
		ClientName: "access-hosts",
		NVMf:       access.NVMfConfig{Listen: "127.0.0.1:0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	addr := node.Addrs()[0].String()
	capture := nvmftshark.Start(t, addr)

	admin := c.Issue(identity.RoleAdmin, "admin")
	cli := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		args = append(args, "--mds", c.MDSAddr, "--tls-dir", c.TLSDir, "--tls-cert", admin)
		cmd := exec.CommandContext(ctx, c.Binary, args...)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	const (
		hostA = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-00000000000a"
		hostB = "nqn.2026-12.io.basalt.test:host-b"
	)
	conns := 0 // every connection made, for the capture's check
	// connect sends an admin queue's Connect to volume's subsystem as host
	// and returns the completion; the connection is closed.
	connect := func(volume, host string) (nvmfhost.Result, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conns++
		h, err := nvmfhost.Dial(ctx, addr, true, true)
		if err != nil {
			return nvmfhost.Result{}, err
		}
		defer h.Close()
		h.NetConn().SetDeadline(time.Now().Add(60 * time.Second))
		return h.Connect(nvmf.VolumeNQNPrefix+volume, host, 0, 0xffff, 32, 0)
	}
	// discovered returns the subsystems host's discovery log lists.
	discovered := func(host string) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conns++
		h, err := nvmfhost.Dial(ctx, addr, true, true)
		if err != nil {
			return nil, err
		}
		defer h.Close()
		h.NetConn().SetDeadline(time.Now().Add(60 * time.Second))
		if r, err := h.Connect(nvmf.DiscoveryNQN, host, 0, 0xffff, 32, 0); err != nil || r.Status != 0 {
			return nil, fmt.Errorf("discovery connect: status %#x, %v", r.Status, err)
		}
		const logDiscovery = 0x70
		page := func(n int) ([]byte, error) {
			r, err := h.Do(nvmfhost.NewSQE(0x02, 0, logDiscovery|uint32(1024*n/4-1)<<16), nil, false, 1024*n)
			if err == nil {
				err = r.Err()
			}
			return r.Data, err
		}
		hdr, err := page(1)
		if err != nil {
			return nil, err
		}
		n := int(binary.LittleEndian.Uint64(hdr[8:]))
		all, err := page(n + 1)
		if err != nil {
			return nil, err
		}
		var nqns []string
		for i := 1; i <= n; i++ {
			if all[1024*i+2] == 2 { // NVM subsystems, not the discovery subsystem's own records
				nqns = append(nqns, strings.TrimRight(string(all[1024*i+256:1024*i+512]), "\x00"))
			}
		}
		slices.Sort(nqns)
		return nqns, nil
	}
	refused := func(volume, host string) func(context.Context) error {
		return func(context.Context) error {
			r, err := connect(volume, host)
			if err != nil || r.Status != 0x184 || !r.DNR {
				return fmt.Errorf("connect to %s as %s: status %#x DNR %v, %v; want Connect Invalid Host (0x184) with DNR", volume, host, r.Status, r.DNR, err)
			}
			return nil
		}
	}
	served := func(volume, host string) func(context.Context) error {
		return func(context.Context) error {
			if r, err := connect(volume, host); err != nil || r.Status != 0 {
				return fmt.Errorf("connect to %s as %s: status %#x, %v; want success", volume, host, r.Status, err)
			}
			return nil
		}
	}
	sees := func(host string, vols ...string) func(context.Context) error {
		return func(context.Context) error {
			var want []string
			for _, v := range vols {
				want = append(want, nvmf.VolumeNQNPrefix+v)
			}
			got, err := discovered(host)
			if err != nil || !slices.Equal(got, want) {
				return fmt.Errorf("discovery log of %s: %v, %v; want %v", host, got, err, want)
			}
			return nil
		}
	}

	c.Eventually(60*time.Second, "hostB connects before any list", served("vol", hostB))
	for _, bad := range []string{"nqn.2026-12.io.basalt.test", "host-b", "nqn.2014-08.org.nvmexpress:uuid:1234",
		"nqn.2026-12.io.basalt:" + strings.Repeat("x", 202)} {
		if out, err := cli("volume", "allow-host", "vol", bad); err == nil || !strings.Contains(out, "host NQN") {
			t.Errorf("allow-host %q: %v: %s; want a refusal naming the host NQN", bad, err, out)
		}
	}
	if out, err := cli("volume", "info", "vol"); err != nil || !strings.Contains(out, "NVMe hosts allowed: any") {
		t.Fatalf("volume info after the refused allow-hosts: %v: %s; want no list", err, out)
	}
	if out, err := cli("volume", "allow-host", "vol", hostA); err != nil || !strings.Contains(out, "allowed") {
		t.Fatalf("allow-host: %v: %s", err, out)
	}
	if out, err := cli("volume", "info", "vol"); err != nil || !strings.Contains(out, "  "+hostA+"\n") {
		t.Errorf("volume info does not list %s: %v: %s", hostA, err, out)
	}
	if out, err := cli("volume", "ls"); err != nil || !strings.Contains(out, "NVME HOSTS") {
		t.Errorf("volume ls has no NVME HOSTS column: %v: %s", err, out)
	}

	c.Eventually(60*time.Second, "hostB refused", refused("vol", hostB))
	if err := served("vol", hostA)(context.Background()); err != nil {
		t.Error(err)
	}
	if err := served("open", hostB)(context.Background()); err != nil {
		t.Errorf("a volume without a list: %v", err)
	}
	if err := sees(hostB, "open")(context.Background()); err != nil {
		t.Error(err)
	}
	if err := sees(hostA, "open", "vol")(context.Background()); err != nil {
		t.Error(err)
	}

	if out, err := cli("volume", "deny-host", "vol", hostA); err != nil || !strings.Contains(out, "allows any NVMe host now") {
		t.Fatalf("deny-host of the last host: %v: %s", err, out)
	}
	c.Eventually(60*time.Second, "hostB served once the list is empty", served("vol", hostB))
	c.Eventually(60*time.Second, "hostB discovers both", sees(hostB, "open", "vol"))

	if capture == nil {
		t.Log("no capture: tshark or dumpcap missing or not allowed to capture (see above)")
		return
	}
	capture.Check(t, conns, nvmftshark.Want{Digests: true, PDUs: map[int]int{nvmftshark.ICReq: conns, nvmftshark.CapsuleRsp: conns}})
	if n := capture.Count(t, "nvme.cqe.status.sct == 1 && nvme.cqe.status.sc == 0x84 && nvme.cqe.status.dnr == 1"); n == 0 {
		t.Error("tshark decodes no Connect response with SCT 1, SC 84h (Connect Invalid Host) and DNR")
	}
}
