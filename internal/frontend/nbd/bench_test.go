package nbd

// The NBD request path over a Unix socket against the memory backend: what the
// protocol layer costs per request, without any storage behind it.
//
//	go test -run '^$' -bench . -benchmem ./internal/frontend/nbd/

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

func BenchmarkRequest(b *testing.B) {
	for _, op := range []string{"read", "write"} {
		for _, qd := range []int{1, 32} {
			for _, bs := range []int{4 << 10, 64 << 10} {
				b.Run(fmt.Sprintf("%s/bs=%dk/qd=%d", op, bs>>10, qd), func(b *testing.B) {
					benchRequests(b, op == "write", bs, qd)
				})
			}
		}
	}
}

func benchRequests(b *testing.B, write bool, bs, qd int) {
	const size = 64 << 20
	ts := startServer(b, Config{Exports: frontendtest.Disks{"disk": frontendtest.NewDisk(size)}.Exports()})
	c := open(b, ts.sock, "disk")
	blocks := uint64(size / bs)

	typ := uint16(cmdRead)
	if write {
		typ = cmdWrite
	}
	payload := make([]byte, bs)
	for i := range payload {
		payload[i] = byte(i)
	}
	slots := make(chan struct{}, qd)
	sendErr := make(chan error, 1)
	b.SetBytes(int64(bs))
	b.ReportAllocs()
	b.ResetTimer()

	go func() {
		w := bufio.NewWriterSize(c.nc, 256<<10)
		var hdr [requestHeaderLen]byte
		binary.BigEndian.PutUint32(hdr[0:], requestMagic)
		binary.BigEndian.PutUint16(hdr[6:], typ)
		binary.BigEndian.PutUint32(hdr[24:], uint32(bs))
		for i := range b.N {
			select {
			case slots <- struct{}{}:
			default:
				// About to block: push what is batched first.
				if err := w.Flush(); err != nil {
					sendErr <- err
					return
				}
				slots <- struct{}{}
			}
			binary.BigEndian.PutUint64(hdr[8:], uint64(i))
			binary.BigEndian.PutUint64(hdr[16:], uint64(i*7919)%blocks*uint64(bs))
			w.Write(hdr[:])
			if write {
				w.Write(payload)
			}
			if qd == 1 || len(slots) == qd {
				if err := w.Flush(); err != nil {
					sendErr <- err
					return
				}
			}
		}
		sendErr <- w.Flush()
	}()

	br := bufio.NewReaderSize(c.nc, 256<<10)
	var rh [replyHeaderLen]byte
	data := make([]byte, bs)
	for range b.N {
		if _, err := io.ReadFull(br, rh[:]); err != nil {
			b.Fatal(err)
		}
		if errno := binary.BigEndian.Uint32(rh[4:]); errno != 0 {
			b.Fatalf("errno %d", errno)
		}
		if !write {
			if _, err := io.ReadFull(br, data); err != nil {
				b.Fatal(err)
			}
		}
		<-slots
	}
	b.StopTimer()
	if err := <-sendErr; err != nil {
		b.Fatal(err)
	}
}
