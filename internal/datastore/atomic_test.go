package datastore

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBlockReadNeverTorn: a 4 KiB read that overlaps a 4 KiB write of the
// same block returns the old block or the new one, never a mix. Linux does
// not promise that for a buffered pread racing a pwrite on ext4 (the read
// copies the page while the write is copying into it); the linearizability
// checker (tests/proof) saw such a torn block through a whole cluster.
func TestBlockReadNeverTorn(t *testing.T) {
	s := openStore(t, t.TempDir(), 0, Knobs{})
	defer s.Close()
	cs := mustCopyset(t, s, 1)
	id := ChunkID{1, 0}
	block := func(v byte) []byte { return bytes.Repeat([]byte{v}, 4096) }
	if err := cs.WriteAt(id, block(0), 0); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := byte(1); !stop.Load(); v++ {
			if err := cs.WriteAt(id, block(v), 0); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	got := make([]byte, 4096)
	deadline := time.Now().Add(2 * time.Second)
	reads := 0
	for time.Now().Before(deadline) {
		if err := cs.ReadAt(id, got, 0); err != nil {
			t.Fatal(err)
		}
		reads++
		if !bytes.Equal(got, block(got[0])) {
			i := bytes.IndexFunc(got, func(r rune) bool { return byte(r) != got[0] })
			stop.Store(true)
			wg.Wait()
			t.Fatalf("read %d returned a torn block: byte 0 is %d, byte %d is %d", reads, got[0], i, got[i])
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d reads, none torn", reads)
}
