package nbd

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestWireGolden freezes the server's bytes for one scripted session: greeting,
// NBD_OPT_LIST, NBD_OPT_GO with every info, a write, a read, a rejected read and
// DISC. A change to any of them is a protocol change and must be deliberate.
func TestWireGolden(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 16)
	disk.Description = "golden"
	s := fuzzServer(t, frontendtest.Disks{"disk": disk})

	in := binary.BigEndian.AppendUint32(nil, flagCFixedNewstyle|flagCNoZeroes)
	for _, o := range []struct {
		opt  uint32
		data []byte
	}{{optList, nil}, {optGo, goData("disk", infoName, infoDescription, infoBlockSize)}} {
		in = binary.BigEndian.AppendUint64(in, ihaveOpt)
		in = binary.BigEndian.AppendUint32(in, o.opt)
		in = binary.BigEndian.AppendUint32(in, uint32(len(o.data)))
		in = append(in, o.data...)
	}
	in = append(in, reqBytes(cmdWrite, cmdFlagFUA, 512, 4, []byte("gold"))...)
	in = append(in, reqBytes(cmdRead, 0, 510, 8, nil)...)
	in = append(in, reqBytes(cmdRead, 0, 1<<16, 8, nil)...)
	in = append(in, reqBytes(cmdDisc, 0, 0, 0, nil)...)

	var out bytes.Buffer
	s.ServeConn(&scriptConn{r: bytes.NewReader(in), out: &out})
	got := hex.Dump(out.Bytes())

	path := filepath.Join("testdata", "wire.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("server bytes changed:\n got:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(got, "gold") {
		t.Errorf("the read reply does not carry the written data")
	}
}
