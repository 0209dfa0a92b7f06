package chunkserver

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// TestChecksumFloodThrottled: a connection that floods checksum requests
// (each reads every chunk of a copyset) gets maxChecksumsPerPeer of them
// computed at a time and BUSY for the rest, at once; its own IO and another
// connection's checksums are served meanwhile.
func TestChecksumFloodThrottled(t *testing.T) {
	e := newHandlerEnv(t)
	gate := make(chan struct{})
	var gateOnce sync.Once
	open := func() { gateOnce.Do(func() { close(gate) }) }
	t.Cleanup(open)
	hold := func() { <-gate }
	e.hd.beforeChecksum.Store(&hold)

	c := e.dial()
	want := bytes.Repeat([]byte{0x5a}, 4096)
	if r, _ := e.do(c, ioHdr(api.OpWrite, 0, 4096), want); r.Status != api.StatusOK {
		t.Fatalf("write: %v", r.Status)
	}
	const flood = 40
	replies := make(chan api.Status, flood)
	for range flood {
		call := &transport.Call{Header: api.Header{Op: api.OpChecksum, Volume: hPool, Copyset: csOf(hVolume, 0)},
			ReadBuf: make([]byte, 1<<20)}
		c.Go(call, func(call *transport.Call) {
			if call.Err != nil {
				replies <- api.Status(255)
				return
			}
			replies <- call.Reply.Status
		})
	}
	// Every request beyond the ones in flight is answered BUSY without
	// waiting for the gate.
	count := map[api.Status]int{}
	for range flood - maxChecksumsPerPeer {
		select {
		case st := <-replies:
			count[st]++
		case <-time.After(60 * time.Second):
			t.Fatalf("replies so far %v; want %d BUSY while %d are held", count, flood-maxChecksumsPerPeer, maxChecksumsPerPeer)
		}
	}
	if count[api.StatusBusy] != flood-maxChecksumsPerPeer {
		t.Fatalf("replies while the gate is shut: %v; want %d BUSY", count, flood-maxChecksumsPerPeer)
	}
	// Normal IO on the flooding connection still works.
	if r, got := e.do(c, ioHdr(api.OpRead, 0, 4096), nil); r.Status != api.StatusOK || !bytes.Equal(got, want) {
		t.Fatalf("read during the flood: %v", r.Status)
	}
	// Another connection gets its own share.
	c2 := e.dial()
	call := &transport.Call{Header: api.Header{Op: api.OpChecksum, Volume: hPool, Copyset: csOf(hVolume, 0)}, ReadBuf: make([]byte, 1<<20)}
	done := make(chan struct{})
	c2.Go(call, func(*transport.Call) { close(done) })
	open()
	for range maxChecksumsPerPeer {
		select {
		case st := <-replies:
			if st != api.StatusOK {
				t.Fatalf("a held checksum answered %v", st)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("held checksums not answered after the gate opened")
		}
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the second connection's checksum was not answered")
	}
	if call.Err != nil || call.Reply.Status != api.StatusOK {
		t.Fatalf("second connection: %v %v", call.Err, call.Reply.Status)
	}
	// The flood is over: checksums are computed again.
	r, _ := e.do(c, api.Header{Op: api.OpChecksum, Volume: hPool, Copyset: csOf(hVolume, 0)}, nil)
	if r.Status != api.StatusOK {
		t.Fatalf("checksum after the flood: %v", r.Status)
	}
}
