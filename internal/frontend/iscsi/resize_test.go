package iscsi

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// A volume with a session here is watched (frontend.Exports.WatchSize): its
// size is re-read through the backend while the session lasts, and after the
// volume grew the session's next command gets CAPACITY DATA HAS CHANGED and
// READ CAPACITY the new size (online expansion).
func TestSessionSeesTheVolumeGrow(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	_, addr := startServerSized(t, frontendtest.Disks{"disk": disk}, 5*time.Millisecond, Config{})
	c := dialClient(t, addr)
	c.loginNormal(testInitiator, TargetName(testCluster, "disk"))
	tur := make([]byte, 6)
	if st, _, sense := c.command(tur, 0, nil); st != 0 {
		t.Fatalf("TEST UNIT READY: status %#x sense % x", st, sense)
	}
	deadline := time.Now().Add(60 * time.Second)
	for disk.Checks.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the volume's size was re-read %d times in a minute: the session's volume is not watched", disk.Checks.Load())
		}
		time.Sleep(time.Millisecond)
	}

	disk.Grow(1 << 20)
	st, _, sense := c.command(tur, 0, nil)
	if st != 0x02 || len(sense) < 14 || sense[2]&0x0f != 0x06 || sense[12] != 0x2a || sense[13] != 0x09 {
		t.Fatalf("TEST UNIT READY after the volume grew: status %#x sense % x, want CAPACITY DATA HAS CHANGED", st, sense)
	}
	st, data, sense := c.command([]byte{0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 8, nil) // READ CAPACITY(10)
	if st != 0 || len(data) != 8 {
		t.Fatalf("READ CAPACITY: status %#x sense % x", st, sense)
	}
	last, bs := binary.BigEndian.Uint32(data[0:]), binary.BigEndian.Uint32(data[4:])
	if (int64(last)+1)*int64(bs) != 2<<20 {
		t.Fatalf("READ CAPACITY: %d blocks of %d bytes, want 2 MiB", last+1, bs)
	}
}
