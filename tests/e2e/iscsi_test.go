package e2e

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testutil"
)

// The playground's iSCSI portal, with QEMU's iSCSI driver (libiscsi) and
// libiscsi's own tools as clients: the volume is listed by discovery, written
// with qemu-img convert and read back equal, through the replicated cluster.
func TestPlaygroundISCSI(t *testing.T) {
	testutil.RequireTools(t, "qemu-img", "iscsi-ls", "iscsi-inq")
	p := startPlayground(t, "256MiB")
	if p.st.ISCSI == "" || !strings.HasPrefix(p.st.ISCSIURI, "iscsi://"+p.st.ISCSI+"/") {
		t.Fatalf("playground.json has no iSCSI portal: %+v", p.st)
	}
	out := run(t, time.Minute, "iscsi-ls", "-s", "iscsi://"+p.st.ISCSI)
	if !strings.Contains(out, p.st.ISCSITarget) || !strings.Contains(out, "Lun:0") {
		t.Fatalf("iscsi-ls does not list target %s with LUN 0:\n%s", p.st.ISCSITarget, out)
	}
	if out := run(t, time.Minute, "iscsi-inq", p.st.ISCSIURI); !strings.Contains(out, "BASALT") {
		t.Fatalf("iscsi-inq:\n%s", out)
	}

	dir := t.TempDir()
	in, back := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	data := make([]byte, 64<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < len(data); i += 8 {
		v := rng.Uint64()
		for k := range 8 {
			data[i+k] = byte(v >> (8 * k))
		}
	}
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, 5*time.Minute, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", in, p.st.ISCSIURI)
	run(t, 5*time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", p.st.ISCSIURI, back)
	got, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 256<<20 || sha256.Sum256(got[:len(data)]) != sha256.Sum256(data) ||
		!bytes.Equal(got[len(data):], make([]byte, len(got)-len(data))) {
		t.Fatalf("the volume read back over iSCSI (%d bytes) is not the image written", len(got))
	}
}
