package nvmfhost

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// TestCloseDuringC2HDataLeavesReturnedBuffer: command B's data is being
// read (by command A's Submit, the reader) when Close fails both; B's Submit
// returns and its caller reads B's buffer. Under -race this must not race
// with the reader still filling it.
func TestCloseDuringC2HDataLeavesReturnedBuffer(t *testing.T) {
	for iter := range 30 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		const n = 1 << 20
		started := make(chan struct{})
		go func() {
			nc, err := ln.Accept()
			ln.Close()
			if err != nil {
				return
			}
			defer nc.Close()
			req := make([]byte, icLen)
			io.ReadFull(nc, req)
			rsp := make([]byte, icLen)
			putCH(rsp, PDUICResp, 0, icLen, 0, icLen)
			rsp[11] = req[11]
			binary.LittleEndian.PutUint32(rsp[12:], 1<<20)
			nc.Write(rsp)
			caps := make([]byte, 2*capsuleLen)
			if _, err := io.ReadFull(nc, caps); err != nil {
				return
			}
			cidB := binary.LittleEndian.Uint16(caps[capsuleLen+8+2:])
			h := make([]byte, dataHdrLen)
			putCH(h, PDUC2HData, FlagLast|FlagSuccess, dataHdrLen, dataHdrLen, uint32(dataHdrLen+n))
			binary.LittleEndian.PutUint16(h[8:], cidB)
			binary.LittleEndian.PutUint32(h[16:], n)
			nc.Write(h)
			close(started)
			piece := make([]byte, 512)
			for sent := 0; sent < n/2; sent += len(piece) {
				if _, err := nc.Write(piece); err != nil {
					return
				}
			}
			time.Sleep(time.Second)
		}()
		c, err := Dial(t.Context(), ln.Addr().String(), false, false)
		if err != nil {
			t.Fatal(err)
		}
		q := c.Pipeline(4)
		aDone := make(chan struct{})
		go func() { q.Submit(RW(IORead, 0, 8), nil, false, make([]byte, 4096)); close(aDone) }()
		time.Sleep(20 * time.Millisecond) // A is sent and A's Submit reads
		in := make([]byte, n)
		bDone := make(chan error)
		go func() { _, err := q.Submit(RW(IORead, 8, n/512), nil, false, in); bDone <- err }()
		<-started
		time.Sleep(time.Duration(iter*37%300) * time.Microsecond)
		go q.Close()
		if err := <-bDone; err == nil {
			t.Fatal("B succeeded")
		}
		s := 0
		for _, b := range in { // the caller looks at (or reuses) its buffer
			s += int(b)
		}
		<-aDone
		q.Close()
	}
}
