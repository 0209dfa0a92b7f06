package nvmf

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/nvmfhost"
)

// seedStream is what a host sends for a short session: ICReq, Connect, a
// property get, a write in the capsule, a write by R2T with its H2CData, a read.
func seedStream(hdgst, ddgst bool) []byte {
	in := &initiator{Conn: nvmfhost.Framer(hdgst, ddgst)}
	ic := make([]byte, icLen)
	putCH(ic, pduICReq, 0, icLen, 0, icLen)
	if hdgst {
		ic[11] |= 1
	}
	if ddgst {
		ic[11] |= 2
	}
	capsule := func(sqe, data []byte, sglLen int) []byte {
		binary.LittleEndian.PutUint32(sqe[32:], uint32(sglLen))
		sqe[39] = sglTransport
		if len(data) > 0 {
			sqe[39] = sglInCapsule
		}
		h := make([]byte, capsuleLen)
		copy(h[chLen:], sqe)
		return in.pdu(pduCapsuleCmd, 0, h, data)
	}
	out := append([]byte(nil), ic...)
	conn := newSQE(opFabrics, 0)
	conn[4] = fctypeConnect
	binary.LittleEndian.PutUint16(conn[44:], 31)
	d := make([]byte, 1024)
	binary.LittleEndian.PutUint16(d[16:], 0xffff)
	copy(d[256:], VolumeNQNPrefix+"vol")
	copy(d[512:], hostA)
	out = append(out, capsule(conn, d, 1024)...)
	pg := newSQE(opFabrics, 0)
	pg[4] = fctypePropertyGet
	out = append(out, capsule(pg, nil, 0)...)
	out = append(out, capsule(newSQE(adminIdentify, 0, 1), nil, 4096)...)
	out = append(out, capsule(newSQE(adminGetLogPage, 0, logANA|(4096/4-1)<<16), nil, 4096)...)
	out = append(out, capsule(rw(ioWrite, 0, 1), make([]byte, 512), 512)...)
	out = append(out, capsule(rw(ioWrite, 8, 2), nil, 1024)...)
	dh := make([]byte, dataHdrLen)
	binary.LittleEndian.PutUint32(dh[16:], 1024)
	out = append(out, in.pdu(pduH2CData, flagLast, dh, make([]byte, 1024))...)
	out = append(out, capsule(rw(ioRead, 0, 1), nil, 512)...)
	return out
}

// FuzzConn feeds arbitrary bytes to one connection: it must end without a
// panic, a hang or a backend call outside the volume.
func FuzzConn(f *testing.F) {
	for _, h := range []bool{false, true} {
		for _, d := range []bool{false, true} {
			f.Add(seedStream(h, d))
		}
	}
	s, _, _ := startServer(f, func(c *Config) { c.ConnectTimeout = 5 * time.Second; c.AllowedHosts = nil })
	f.Fuzz(func(t *testing.T, b []byte) {
		srv, cli := net.Pipe()
		done := make(chan struct{})
		go func() {
			s.ServeConn(srv)
			close(done)
		}()
		go io.Copy(io.Discard, cli)
		cli.SetWriteDeadline(time.Now().Add(10 * time.Second))
		cli.Write(b)
		cli.Close()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("connection did not end within 30 s of the host closing it")
		}
	})
}
