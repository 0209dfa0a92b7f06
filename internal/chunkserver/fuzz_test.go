package chunkserver

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/capability"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// FuzzHandlerAuthenticated feeds the real data-plane handler (real
// datastore, volume cache, capability checks) raw frames on a connection
// that passed the security handshake as a client: whatever follows, the
// handler neither panics nor hangs, and the server closes cleanly.
func FuzzHandlerAuthenticated(f *testing.F) {
	ca, err := identity.InitCA(f.TempDir(), "c1")
	if err != nil {
		f.Fatal(err)
	}
	issue := func(role identity.Role, name string) *identity.Config {
		dir := f.TempDir()
		if _, _, err := ca.IssueFiles(dir, "", role, name, identity.IssueOptions{}); err != nil {
			f.Fatal(err)
		}
		c, err := identity.Load(dir, identity.Base(role, name))
		if err != nil {
			f.Fatal(err)
		}
		return c
	}
	srvID, cliID := issue(identity.RoleChunkserver, "1"), issue(identity.RoleClient, "fuzz")
	k, err := capability.NewKey(1, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	mds, _ := capability.NewSigner([]capability.PrivateKey{k})
	token := mds.Sign(capability.Capability{Volume: hVolume, Epoch: hEpoch, Mode: capability.ModeWrite, Expiry: time.Now().Add(time.Hour)})

	frame := func(h api.Header, payload []byte) []byte {
		h.PayloadLen = uint32(len(payload))
		b := make([]byte, api.HeaderSize)
		h.Encode(b)
		return append(b, payload...)
	}
	attach := frame(api.Header{Op: api.OpAttach, Volume: hVolume, ID: 1}, token)
	write := ioHdr(api.OpWrite, 0, 8)
	write.ID = 2
	read := ioHdr(api.OpRead, 0, 4096)
	read.Epoch, read.ID = ^uint64(0), 3
	f.Add(append(attach, frame(write, make([]byte, 8))...))
	f.Add(frame(read, nil))
	f.Add(append(attach, frame(api.Header{Op: api.OpFence, Volume: hVolume, Epoch: ^uint64(0), ID: 4}, nil)...))
	f.Add(append(attach, frame(api.Header{Op: api.OpRaft, Length: 2, Hint: 1}, make([]byte, 20))...))
	f.Add(frame(api.Header{Op: api.OpSnapshot, Volume: 1, Length: 1}, []byte("x")))
	f.Add(frame(api.Header{Op: api.OpChecksum, Volume: hPool, Copyset: 1}, nil))
	f.Add([]byte("BSLT\x01"))

	f.Fuzz(func(t *testing.T, in []byte) {
		e := newHandlerEnvWith(t, transport.Security{Mode: transport.ModeAuthenticated, TLS: srvID, Allow: dataRoles}, noPeers{})
		e.hd.caps = &capability.Keys{}
		e.hd.caps.Set(mds.Public())
		cli, sc := net.Pipe()
		e.srv.ServeConn(sc)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		fc, _, err := transport.ClientHandshake(ctx, cli, transport.Security{Mode: transport.ModeAuthenticated, TLS: cliID})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			var sink [4096]byte
			for {
				if _, err := fc.Read(sink[:]); err != nil {
					return
				}
			}
		}()
		_, _ = fc.Write(in)
		_ = fc.Close()
	})
}
