package iscsi

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// What libiscsi's WriteSame10/16.InvalidDataOutSize, WriteSame10/16.UnmapUnaligned
// and CompareAndWrite.InvalidDataOutSize check, which it runs only when
// READ CAPACITY(16) reports two or more logical blocks per physical block
// (basalt reports one: docs/iscsi.md): a WRITE SAME with UNMAP or a COMPARE
// AND WRITE whose Data-Out is not what its CDB calls for is refused, and a
// WRITE SAME with UNMAP (of a zero block) that starts inside a 4 KiB granule
// and ends at its end succeeds, zeroing what it covers and nothing else.
func TestDataOutSizeAndUnalignedUnmap(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	_, addr := startServer(t, frontendtest.Disks{"disk": disk}, Config{})
	c := dialClient(t, addr)
	c.loginNormal("iqn.2026-12.io.basalt.test:dataout", TargetName(testCluster, "disk"))
	ws10 := func(lba uint32, n uint16) []byte {
		cdb := cdb10(0x41, lba, n)
		cdb[1] = 0x08 // UNMAP
		return cdb
	}
	ws16 := func(lba uint64, n uint32) []byte {
		cdb := make([]byte, 16)
		cdb[0], cdb[1] = 0x93, 0x08
		binary.BigEndian.PutUint64(cdb[2:], lba)
		binary.BigEndian.PutUint32(cdb[10:], n)
		return cdb
	}
	for name, cdb := range map[string][]byte{"WRITE SAME(10)": ws10(0, 1), "WRITE SAME(16)": ws16(0, 1)} {
		for _, n := range []int{256, 1024} {
			if st, _, _ := c.command(cdb, n, bytes.Repeat([]byte{0xa6}, n)); st == 0 {
				t.Errorf("%s with UNMAP of one block and %d bytes of Data-Out: GOOD", name, n)
			}
		}
	}
	for _, tl := range []byte{1, 3} {
		cdb := make([]byte, 16)
		cdb[0], cdb[13] = 0x89, tl // COMPARE AND WRITE
		if st, _, _ := c.command(cdb, 4*512, bytes.Repeat([]byte{0xa6}, 4*512)); st == 0 {
			t.Errorf("COMPARE AND WRITE of %d blocks with 4 blocks of Data-Out: GOOD", tl)
		}
	}
	if !bytes.Equal(disk.Bytes(0, 2048), make([]byte, 2048)) {
		t.Fatal("a refused command wrote")
	}

	x := bytes.Repeat([]byte{'x'}, 8*512)
	for i := 1; i < 8; i++ {
		for name, cdb := range map[string][]byte{"WRITE SAME(10)": ws10(uint32(i), uint16(8-i)), "WRITE SAME(16)": ws16(uint64(i), uint32(8-i))} {
			if st, _, sense := c.command(cdb10(0x2a, 0, 8), len(x), x); st != 0 {
				t.Fatalf("WRITE: status %#x sense % x", st, sense)
			}
			if st, _, sense := c.command(cdb, 512, make([]byte, 512)); st != 0 {
				t.Fatalf("%s with UNMAP of blocks %d-7: status %#x sense % x", name, i, st, sense)
			}
			want := append(bytes.Repeat([]byte{'x'}, i*512), make([]byte, (8-i)*512)...)
			if st, data, _ := c.command(cdb10(0x28, 0, 8), 8*512, nil); st != 0 || !bytes.Equal(data, want) {
				t.Fatalf("after %s with UNMAP of blocks %d-7: status %#x; blocks 0-7 are not %d blocks of x and %d of zeros", name, i, st, i, 8-i)
			}
		}
	}
}
