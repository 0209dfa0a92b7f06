package iscsi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// Initiator names of the fencing tests.
const (
	iqnA = "iqn.2026-12.io.basalt.test:fence-a"
	iqnB = "iqn.2026-12.io.basalt.test:fence-b"
	iqnC = "iqn.2026-12.io.basalt.test:fence-c" // the MDS cannot be asked about it
)

// wantSense fails the test unless a command ended in CHECK CONDITION with
// the given sense key, ASC and ASCQ.
func wantSense(t *testing.T, what string, st byte, sense []byte, key, asc, ascq byte) {
	t.Helper()
	if st != 0x02 || len(sense) < 14 || sense[2]&0x0f != key || sense[12] != asc || sense[13] != ascq {
		t.Fatalf("%s: status %#x sense % x; want CHECK CONDITION %x/%02x/%02x", what, st, sense, key, asc, ascq)
	}
}

// TestFencedInitiator: with Config.MayWrite naming one writer (as the
// volume's attachment names one initiator), another initiator's WRITE and
// WRITE SAME get CHECK CONDITION, DATA PROTECT, WRITE PROTECTED and change
// nothing, while its READs go on; when the writer changes, the new writer's
// session writes and the old writer's session is refused once its answer
// is refreshed — and at once after it logs in again. An initiator
// MayWrite cannot answer for gets NOT READY, BECOMING READY (retried).
func TestFencedInitiator(t *testing.T) {
	var writer atomic.Value
	writer.Store(iqnA)
	disk := frontendtest.NewDisk(1 << 20)
	_, addr := startServer(t, frontendtest.Disks{"disk": disk}, Config{
		MayWriteTTL: 20 * time.Millisecond,
		MayWrite: func(_ context.Context, volume, host string) (bool, error) {
			if volume != "disk" {
				return false, fmt.Errorf("asked about volume %q", volume)
			}
			if host == iqnC {
				return false, errors.New("the MDS does not answer")
			}
			return strings.EqualFold(host, writer.Load().(string)), nil
		},
	})
	target := TargetName(testCluster, "disk")
	login := func(iqn string) *testClient {
		c := dialClient(t, addr)
		c.loginNormal(iqn, target)
		return c
	}
	block := func(b byte) []byte { return bytes.Repeat([]byte{b}, 512) }
	write := func(c *testClient, lba uint32, b byte) (byte, []byte) {
		st, _, sense := c.command(cdb10(0x2a, lba, 1), 512, block(b))
		return st, sense
	}
	read := func(t *testing.T, c *testClient, lba uint32, want byte) {
		t.Helper()
		st, data, sense := c.command(cdb10(0x28, lba, 1), 512, nil)
		if st != 0 || !bytes.Equal(data, block(want)) {
			t.Fatalf("read of block %d: status %#x sense % x, %d bytes; want GOOD and %q", lba, st, sense, len(data), want)
		}
	}
	fenced := func(t *testing.T, what string, st byte, sense []byte) {
		t.Helper()
		wantSense(t, what, st, sense, 0x07, 0x27, 0x00)
	}

	a := login(iqnA)
	if st, sense := write(a, 0, 'a'); st != 0 {
		t.Fatalf("A's write: status %#x sense % x", st, sense)
	}
	b := login(iqnB)
	for i := range 3 {
		st, sense := write(b, 1, 'b')
		fenced(t, fmt.Sprintf("B's write %d", i+1), st, sense)
	}
	st, _, sense := b.command(cdb10(0x41, 2, 4), 512, block('b')) // WRITE SAME(10)
	fenced(t, "B's WRITE SAME", st, sense)
	if !bytes.Equal(disk.Bytes(512, 5*512), make([]byte, 5*512)) {
		t.Fatal("B's refused writes changed the volume")
	}
	read(t, b, 0, 'a')

	// The writer becomes B: B logs in again and writes at once; A's session
	// writes until its answer is refreshed, then is refused.
	writer.Store(iqnB)
	b2 := login(iqnB)
	if st, sense := write(b2, 1, 'b'); st != 0 {
		t.Fatalf("B's write after it became the writer: status %#x sense % x", st, sense)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, sense := write(a, 3, 'a')
		if st != 0 {
			fenced(t, "A's write after B became the writer", st, sense)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("A's session still writes 60 s after B became the writer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	a2 := login(iqnA)
	st, sense = write(a2, 4, 'a')
	fenced(t, "A's first write after logging in again", st, sense)
	read(t, a2, 1, 'b')
	if got := disk.Bytes(4*512, 512); !bytes.Equal(got, make([]byte, 512)) {
		t.Fatal("A's refused write changed the volume")
	}
	// B's old session learns it may write now too.
	deadline = time.Now().Add(60 * time.Second)
	for {
		st, sense := write(b, 5, 'b')
		if st == 0 {
			break
		}
		fenced(t, "B's old session's write", st, sense)
		if time.Now().After(deadline) {
			t.Fatal("B's first session still refused 60 s after B became the writer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	read(t, b2, 5, 'b')

	c := login(iqnC)
	st, sense = write(c, 6, 'c')
	wantSense(t, "a write MayWrite cannot answer for", st, sense, 0x02, 0x04, 0x01)
	read(t, c, 1, 'b')
}

// A session's writes go on while a refresh of its MayWrite answer hangs (a
// slow or failing-over MDS): only the first write waits for an answer. The
// refreshed answer, when it comes, is used.
func TestMayWriteRefreshDoesNotHoldIO(t *testing.T) {
	var allow atomic.Bool
	allow.Store(true)
	release := make(chan struct{})
	var asked atomic.Int32
	disk := frontendtest.NewDisk(1 << 20)
	_, addr := startServer(t, frontendtest.Disks{"disk": disk}, Config{
		MayWriteTTL: time.Millisecond,
		MayWrite: func(ctx context.Context, _, _ string) (bool, error) {
			if asked.Add(1) > 1 {
				select { // every refresh hangs until released
				case <-release:
				case <-ctx.Done():
					return false, ctx.Err()
				}
			}
			return allow.Load(), nil
		},
	})
	c := dialClient(t, addr)
	c.loginNormal(iqnA, TargetName(testCluster, "disk"))
	data := bytes.Repeat([]byte{9}, 512)
	for i := range 20 {
		if st, _, sense := c.command(cdb10(0x2a, uint32(i), 1), 512, data); st != 0 {
			t.Fatalf("write %d while a refresh hangs: status %#x sense % x", i, st, sense)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if !bytes.Equal(disk.Bytes(19*512, 512), data) {
		t.Fatal("the writes made while MayWrite hung are not on the volume")
	}
	if n := asked.Load(); n < 2 {
		t.Fatalf("MayWrite asked %d times, want a refresh after the TTL", n)
	}
	allow.Store(false)
	close(release)
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, _, sense := c.command(cdb10(0x2a, 1, 1), 512, data)
		if st != 0 {
			wantSense(t, "write after the refresh refused the initiator", st, sense, 0x07, 0x27, 0x00)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the initiator still writes 60 s after MayWrite refused it")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
