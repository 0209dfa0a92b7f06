package access_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/access"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/pkg/api"
)

// GET LBA STATUS answers from the chunks that exist: QEMU's iSCSI driver
// (its block status is GET LBA STATUS) maps a volume served by `basalt
// iscsi` over a real cluster as data exactly where it was written, and a
// trim (a hole punched in the chunk file) deallocates again. Underneath,
// the client's OpMapped asks each chunk's leader.
func TestGetLBAStatusFromChunks(t *testing.T) {
	testutil.RequireTool(t, "qemu-img")
	if out, _ := exec.Command("qemu-img", "--help").CombinedOutput(); !bytes.Contains(out, []byte("iscsi")) {
		t.Skip("qemu-img has no iscsi driver (Debian package qemu-block-extra)")
	}
	c := testcluster.Start(t, testcluster.Options{Copysets: 4}) // 4 MiB chunks
	c.CreateVolume("vol", 64<<20)
	id := c.Identity(identity.RoleAccess, "access-map")
	node, err := access.Start(access.Config{
		MDS: strings.Split(c.MDSAddr, ","), MDSTLS: id.ClientTLS(identity.RoleMDS), DataTLS: id.ClientTLS(identity.RoleChunkserver),
		ClientName: "access-map", ISCSI: access.ISCSIConfig{Listen: "127.0.0.1:0", Cluster: "c"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	url := "iscsi://" + node.ISCSIPortal().String() + "/" + iscsi.TargetName("c", "vol") + "/0"

	// dataExtents is qemu-img map's list of [start, end) with data.
	dataExtents := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "qemu-img", "map", "--output=json", "-f", "raw", url)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if err != nil {
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			t.Fatalf("qemu-img map: %v: %s", err, out)
		}
		var ext []struct {
			Start, Length int64
			Data          bool
		}
		if err := json.Unmarshal(out, &ext); err != nil {
			t.Fatalf("qemu-img map: %v: %.4000s", err, out)
		}
		var b strings.Builder
		for _, e := range ext {
			if e.Data {
				fmt.Fprintf(&b, "[%d,%d)", e.Start, e.Start+e.Length)
			}
		}
		return b.String()
	}
	if got := dataExtents(); got != "" {
		t.Errorf("a new volume maps data at %s, want none", got)
	}

	// The client library writes 1 MiB across a chunk boundary and 64 KiB
	// elsewhere, then asks for the map itself.
	v := c.Open("vol", false)
	data := bytes.Repeat([]byte("basalt!!"), 128<<10)
	if _, err := v.WriteAt(data, 8<<20-512<<10); err != nil {
		t.Fatal(err)
	}
	if _, err := v.WriteAt(data[:64<<10], 40<<20); err != nil {
		t.Fatal(err)
	}
	bits := make([]byte, api.MappedBytes(16<<20))
	ch := make(chan error, 1)
	v.Submit(api.OpMapped, bits, 0, 16<<20, func(err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatal(err)
	}
	for g := range int64(16 << 20 / api.MapGranule) {
		off := g * api.MapGranule
		want := off >= 8<<20-512<<10 && off < 8<<20+512<<10
		if got := bits[g/8]&(1<<(g%8)) != 0; got != want {
			t.Fatalf("OpMapped: granule at %d mapped %v, want %v", off, got, want)
		}
	}
	want := fmt.Sprintf("[%d,%d)[%d,%d)", 8<<20-512<<10, 8<<20+512<<10, 40<<20, 40<<20+64<<10)
	if got := dataExtents(); got != want {
		t.Errorf("after the writes: data at %s, want %s", got, want)
	}
	if err := v.Trim(8<<20-512<<10, 768<<10); err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprintf("[%d,%d)[%d,%d)", 8<<20+256<<10, 8<<20+512<<10, 40<<20, 40<<20+64<<10)
	if got := dataExtents(); got != want {
		t.Errorf("after a trim: data at %s, want %s", got, want)
	}
}
