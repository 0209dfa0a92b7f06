package testcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/transport"
)

// TestEncryptedDataPlane: chunkservers started with --data-mode encrypted
// (and --tcp-only, so that same-host clients and peers go over TCP, where
// the mode encrypts) replicate and serve a client's IO end to end; the
// client library was not told the mode: it asks for the authenticated mode
// and the chunkservers raise it. A raw connection that asks for less is
// handed TLS, not the raw socket.
func TestEncryptedDataPlane(t *testing.T) {
	c := Start(t, Options{Copysets: 4, ChunkserverFlags: []string{"--data-mode", "encrypted", "--tcp-only"}})
	c.CreateVolume("enc", 64<<20)
	v := c.Open("enc", false)
	want := make([]byte, 1<<20)
	_, _ = rand.Read(want)
	for off := int64(0); off < 64<<20; off += 16 << 20 {
		if _, err := v.WriteAt(want, off); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	got := make([]byte, len(want))
	for off := int64(0); off < 64<<20; off += 16 << 20 {
		if _, err := v.ReadAt(got, off); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read at %d differs from what was written", off)
		}
	}

	// Each chunkserver's data port: a client asking for the authenticated
	// mode gets an encrypted connection.
	id := c.Identity(identity.RoleClient, "test")
	for _, cs := range c.CS {
		nc, err := net.DialTimeout("tcp", cs.Addr, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		fc, peer, err := transport.ClientHandshake(ctx, nc, transport.Security{Mode: transport.ModeAuthenticated,
			TLS: id, Allow: []identity.Role{identity.RoleChunkserver}})
		cancel()
		if err != nil {
			nc.Close()
			t.Fatalf("%s: handshake: %v", cs.Name, err)
		}
		if _, ok := fc.(*tls.Conn); !ok || peer.Role != identity.RoleChunkserver {
			t.Errorf("%s: handshake gave %T, peer %v; want TLS to a chunkserver", cs.Name, fc, peer)
		}
		nc.Close()
	}
}
