package nbd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
	"github.com/basalt-storage/basalt/pkg/api"
)

func TestCommandsRoundTrip(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")

	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if errno, _ := c.do(cmdWrite, 0, 4096, uint32(len(data)), data); errno != 0 {
		t.Fatalf("write: errno %d", errno)
	}
	if errno, _ := c.do(cmdWrite, cmdFlagFUA, 1<<20-3, 3, []byte("end")); errno != 0 {
		t.Fatalf("FUA write at the last bytes: errno %d", errno)
	}
	errno, got := c.do(cmdRead, 0, 4096, uint32(len(data)), nil)
	if errno != 0 || !bytes.Equal(got, data) {
		t.Fatalf("read back: errno %d, equal %v", errno, bytes.Equal(got, data))
	}
	if errno, _ := c.do(cmdFlush, 0, 0, 0, nil); errno != 0 {
		t.Fatalf("flush: errno %d", errno)
	}
	if errno, _ := c.do(cmdFlush, cmdFlagFUA, 0, 0, nil); errno != 0 {
		t.Fatalf("flush with FUA (clients do send it): errno %d", errno)
	}
	if errno, _ := c.do(cmdTrim, 0, 4096, 4096, nil); errno != 0 {
		t.Fatalf("trim: errno %d", errno)
	}
	if errno, _ := c.do(cmdWriteZeroes, cmdFlagNoHole|cmdFlagFUA, 3*4096, 100, nil); errno != 0 {
		t.Fatalf("write zeroes: errno %d", errno)
	}
	want := append([]byte(nil), data...)
	clear(want[0:4096])
	clear(want[2*4096 : 2*4096+100])
	if errno, got := c.do(cmdRead, 0, 4096, uint32(len(data)), nil); errno != 0 || !bytes.Equal(got, want) {
		t.Fatalf("trimmed and zeroed ranges do not read back as zeros (errno %d)", errno)
	}
	if got := disk.Bytes(1<<20-3, 3); string(got) != "end" {
		t.Fatalf("last bytes %q", got)
	}
	c.send(cmdDisc, 0, 9, 0, 0, nil)
	c.expectEOF()
}

func TestValidationRejectsBeforeBackend(t *testing.T) {
	for _, minBlock := range []uint32{1, 512} {
		t.Run(fmt.Sprintf("min%d", minBlock), func(t *testing.T) {
			disk := frontendtest.NewDisk(1 << 20)
			disk.BlockSizes.Minimum = minBlock
			ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), MaxPayload: 1 << 20})
			c := open(t, ts.sock, "disk")
			type tc struct {
				name    string
				typ     uint16
				flags   uint16
				off     uint64
				length  uint32
				payload bool
				want    uint32
			}
			cases := []tc{
				{"unknown command", 42, 0, 0, 512, false, EINVAL},
				{"cache not advertised", 5, 0, 0, 512, false, EINVAL},
				{"block status not negotiated", 7, 0, 0, 512, false, EINVAL},
				{"unknown flag on read", cmdRead, 1 << 7, 0, 512, false, EINVAL},
				{"DF flag without structured replies", cmdRead, 1 << 2, 0, 512, false, EINVAL},
				{"NO_HOLE on write", cmdWrite, cmdFlagNoHole, 0, 512, true, EINVAL},
				{"FAST_ZERO not advertised", cmdWriteZeroes, 1 << 4, 0, 512, false, EINVAL},
				{"flush with offset", cmdFlush, 0, 512, 0, false, EINVAL},
				{"flush with length", cmdFlush, 0, 0, 512, false, EINVAL},
				{"read length 0", cmdRead, 0, 0, 0, false, EINVAL},
				{"write length 0", cmdWrite, 0, 0, 0, false, EINVAL},
				{"trim length 0", cmdTrim, 0, 0, 0, false, EINVAL},
				{"read past end", cmdRead, 0, 1<<20 - 512, 1024, false, EINVAL},
				{"read offset past end", cmdRead, 0, 1 << 40, 512, false, EINVAL},
				{"read offset overflow", cmdRead, 0, ^uint64(0) - 100, 512, false, EINVAL},
				{"trim past end", cmdTrim, 0, 1<<20 - 512, 1024, false, EINVAL},
				{"write past end", cmdWrite, 0, 1<<20 - 512, 1024, true, ENOSPC},
				{"write zeroes past end", cmdWriteZeroes, 0, 1 << 20, 512, false, ENOSPC},
				{"read over max payload", cmdRead, 0, 0, 1<<20 + 512, false, EINVAL},
			}
			if minBlock > 1 {
				cases = append(cases,
					tc{"unaligned read offset", cmdRead, 0, 100, 512, false, EINVAL},
					tc{"unaligned write length", cmdWrite, 0, 0, 100, true, EINVAL},
					tc{"unaligned trim", cmdTrim, 0, 512, 700, false, EINVAL},
				)
			}
			before := disk.Submitted.Load()
			for _, tc := range cases {
				var payload []byte
				if tc.payload {
					payload = bytes.Repeat([]byte{0xee}, int(tc.length))
				}
				if errno, _ := c.do(tc.typ, tc.flags, tc.off, tc.length, payload); errno != tc.want {
					t.Errorf("%s: errno %d, want %d", tc.name, errno, tc.want)
				}
			}
			if n := disk.Submitted.Load() - before; n != 0 {
				t.Errorf("%d invalid requests reached the backend", n)
			}
			// The payloads of rejected writes were skipped: the stream is in step
			// and nothing was written.
			if errno, got := c.do(cmdRead, 0, 0, 4096, nil); errno != 0 || !bytes.Equal(got, make([]byte, 4096)) {
				t.Errorf("after rejected requests: errno %d, data changed %v", errno, !bytes.Equal(got, make([]byte, 4096)))
			}
		})
	}
}

func TestOversizedWriteClosesWithoutWriting(t *testing.T) {
	disk := frontendtest.NewDisk(64 << 20)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), MaxPayload: 1 << 20})
	c := open(t, ts.sock, "disk")
	c.send(cmdWrite, 0, 5, 0, 2<<20, bytes.Repeat([]byte{1}, 4096))
	if cookie, errno, _ := c.reply(nil); cookie != 5 || errno != EINVAL {
		t.Errorf("oversized write: cookie %d errno %d, want 5 EINVAL", cookie, errno)
	}
	c.expectEOF()
	if n := disk.Submitted.Load(); n != 0 {
		t.Errorf("backend got %d requests", n)
	}
}

func TestTornWriteIsNotSubmitted(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	c.send(cmdWrite, 0, 1, 0, 8192, bytes.Repeat([]byte{1}, 5000))
	c.nc.Close()
	// The server notices the EOF and ends the connection.
	deadline := time.Now().Add(60 * time.Second)
	for {
		n := ts.conns.Len()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("connection still active after the client hung up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := disk.Mutations.Load(); n != 0 {
		t.Errorf("a torn write reached the backend (%d mutations)", n)
	}
}

func TestBackendErrorsMapped(t *testing.T) {
	injected := map[int64]error{
		0 * 4096: fmt.Errorf("wrapped: %w", frontend.ErrFenced),
		1 * 4096: frontend.ErrNoSpace,
		2 * 4096: frontend.ErrInvalid,
		3 * 4096: errors.New("disk on fire"),
		4 * 4096: frontend.ErrReadOnly,
		5 * 4096: frontend.ErrNotSupported,
		6 * 4096: frontend.ErrShuttingDown,
		7 * 4096: frontend.ErrOutOfRange,
		8 * 4096: frontend.ErrUnavailable,
		9 * 4096: frontend.ErrIO,
	}
	disk := frontendtest.NewDisk(1 << 20)
	disk.Fail = func(op api.Op, off, length int64) error { return injected[off] }
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	want := []uint32{EPERM, ENOSPC, EINVAL, EIO, EPERM, ENOTSUP, ESHUTDOWN, EINVAL, EIO, EIO, 0}
	for i, w := range want {
		if errno, _ := c.do(cmdRead, 0, uint64(i)*4096, 4096, nil); errno != w {
			t.Errorf("read at block %d: errno %d, want %d", i, errno, w)
		}
		if errno, _ := c.do(cmdWrite, 0, uint64(i)*4096, 4, []byte("abcd")); errno != w {
			t.Errorf("write at block %d: errno %d, want %d", i, errno, w)
		}
	}
}

// TestRepliesOutOfOrder: a slow read does not hold up the replies to the
// requests after it. The read completes only after the 8 writes sent after it
// were answered, so a server that replied in order would never answer.
func TestRepliesOutOfOrder(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	release := make(chan struct{})
	// Every IO completes on a goroutine of its own; the read of block 0
	// waits for release.
	disk.Delay = func(op api.Op, off, length int64) time.Duration { return time.Millisecond }
	disk.Fail = func(op api.Op, off, length int64) error {
		if off == 0 {
			<-release
		}
		return nil
	}
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	c.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	c.send(cmdRead, 0, 100, 0, 4096, nil)
	for i := uint64(1); i <= 8; i++ {
		c.send(cmdWrite, 0, 100+i, i*4096, 4, []byte("wxyz"))
	}
	var order []uint64
	for n := range 9 {
		if n == 8 {
			close(release)
		}
		cookie, errno, _ := c.reply(func(cookie uint64) int {
			if cookie == 100 {
				return 4096
			}
			return 0
		})
		if errno != 0 {
			t.Fatalf("cookie %d: errno %d", cookie, errno)
		}
		order = append(order, cookie)
	}
	if order[len(order)-1] != 100 {
		t.Errorf("reply order %v: the slow read should come last", order)
	}
}

func TestDiscAnswersInFlightFirst(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Delay = func(op api.Op, off, length int64) time.Duration { return 50 * time.Millisecond }
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	for i := range uint64(16) {
		c.send(cmdWrite, 0, i, i*4096, 4096, bytes.Repeat([]byte{byte(i + 1)}, 4096))
	}
	c.send(cmdDisc, 0, 99, 0, 0, nil)
	seen := map[uint64]bool{}
	for range 16 {
		cookie, errno, _ := c.reply(nil)
		if errno != 0 {
			t.Fatalf("write %d: errno %d", cookie, errno)
		}
		seen[cookie] = true
	}
	c.expectEOF()
	if len(seen) != 16 {
		t.Fatalf("got %d distinct replies", len(seen))
	}
	for i := range 16 {
		if got := disk.Bytes(i*4096, 1); got[0] != byte(i+1) {
			t.Errorf("block %d holds %d after DISC", i, got[0])
		}
	}
}

func TestInFlightIsBounded(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Gate = make(chan struct{})
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), MaxInFlight: 4})
	c := open(t, ts.sock, "disk")
	for i := range uint64(10) {
		c.send(cmdRead, 0, i, i*4096, 4096, nil)
	}
	disk.WaitSubmitted(t, 4)
	time.Sleep(100 * time.Millisecond) // time to (wrongly) submit more
	if n := disk.Submitted.Load(); n != 4 {
		t.Fatalf("%d requests submitted with MaxInFlight 4", n)
	}
	for range 10 {
		disk.Gate <- struct{}{}
	}
	for range 10 {
		if _, errno, _ := c.reply(func(uint64) int { return 4096 }); errno != 0 {
			t.Fatalf("errno %d", errno)
		}
	}
}

func TestMultiConnSharesBackend(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	a := open(t, ts.sock, "disk")
	b := open(t, ts.sock, "disk")
	if a.flags&flagCanMultiConn == 0 {
		t.Fatal("CAN_MULTI_CONN not advertised")
	}
	if errno, _ := a.do(cmdWrite, cmdFlagFUA, 8192, 5, []byte("hello")); errno != 0 {
		t.Fatal(errno)
	}
	if errno, got := b.do(cmdRead, 0, 8192, 5, nil); errno != 0 || string(got) != "hello" {
		t.Fatalf("other connection reads %q (errno %d)", got, errno)
	}
}

func TestShutdownFinishesInFlight(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Delay = func(op api.Op, off, length int64) time.Duration { return 100 * time.Millisecond }
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	idle := dial(t, ts.sock) // still in the handshake
	idle.greet(flagCFixedNewstyle)
	c.send(cmdWrite, 0, 1, 0, 4, []byte("data"))
	disk.WaitSubmitted(t, 1) // in flight when Shutdown begins
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ts.Shutdown(ctx) }()
	if cookie, errno, _ := c.reply(nil); cookie != 1 || errno != 0 {
		t.Fatalf("in-flight write during shutdown: cookie %d errno %d", cookie, errno)
	}
	c.expectEOF()
	idle.expectEOF()
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-ts.serveCh; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v", err)
	}
	if got := disk.Bytes(0, 4); string(got) != "data" {
		t.Fatalf("write lost: %q", got)
	}
	if disk.Pending.Load() != 0 {
		t.Fatal("backend IO still pending after Shutdown")
	}
}

func TestShutdownAnswersBufferedWithESHUTDOWN(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Gate = make(chan struct{})
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), MaxInFlight: 1})
	c := open(t, ts.sock, "disk")
	// First read is held by the gate; the second waits in the server's buffer
	// because only one request may be in flight. Both go in one write, so the
	// server's first read of the socket takes both: the second is read from its
	// buffer however long after Shutdown's grace the gate opens.
	c.write(append(encodeRequest(cmdRead, 0, 1, 0, 512, nil), encodeRequest(cmdRead, 0, 2, 512, 512, nil)...))
	disk.WaitSubmitted(t, 1)
	done := make(chan error, 1)
	go func() { done <- ts.Shutdown(context.Background()) }()
	waitFor(t, 60*time.Second, "Shutdown begun", func() error {
		if !ts.conns.Closing() {
			return errors.New("not closing")
		}
		return nil
	})
	disk.Gate <- struct{}{}
	got := map[uint64]uint32{}
	for range 2 {
		cookie, errno, _ := c.reply(func(uint64) int { return 512 })
		got[cookie] = errno
	}
	if got[1] != 0 || got[2] != ESHUTDOWN {
		t.Errorf("replies %v, want 1:0 2:ESHUTDOWN", got)
	}
	c.expectEOF()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCloseDropsReplies(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Delay = func(op api.Op, off, length int64) time.Duration { return 50 * time.Millisecond }
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	c.send(cmdRead, 0, 1, 0, 4096, nil)
	disk.WaitSubmitted(t, 1) // in the backend when Close begins
	ts.Close()
	if disk.Pending.Load() != 0 {
		t.Fatal("Close returned before the backend called back")
	}
	c.expectEOF()
}

func TestBadRequestMagicCloses(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	c.write(make([]byte, requestHeaderLen))
	c.expectEOF()
}

func TestNewServerRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Exports: frontendtest.Disks{}.Exports(), MaxPayload: 64 << 20},
		{Exports: frontendtest.Disks{}.Exports(), MaxPayload: 2048},
	} {
		if _, err := NewServer(cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("NewServer(%+v) = %v, want ErrBadConfig", cfg, err)
		}
	}
}

func TestShutdownDeadlineClosesHard(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Gate = make(chan struct{})
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	c.send(cmdRead, 0, 1, 0, 512, nil)
	disk.WaitSubmitted(t, 1) // held by the gate
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ts.Shutdown(ctx) }()
	c.expectEOF() // closed hard when the context ended, reply dropped
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v while the backend still held a buffer", err)
	case <-time.After(50 * time.Millisecond):
	}
	disk.Gate <- struct{}{}
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
}

func TestServeTCP(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	s, err := NewServer(Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.Serve(ln) }()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	if typ := c.infoGo(optGo, "disk"); typ != repAck {
		t.Fatalf("GO over TCP: %#x", typ)
	}
	if errno, _ := c.do(cmdWrite, 0, 0, 3, []byte("tcp")); errno != 0 {
		t.Fatal(errno)
	}
	if errno, got := c.do(cmdRead, 0, 0, 3, nil); errno != 0 || string(got) != "tcp" {
		t.Fatalf("read %q errno %d", got, errno)
	}
	c.send(cmdDisc, 0, 0, 0, 0, nil)
	c.expectEOF()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-serveErr; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(ln2); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Shutdown = %v, want ErrServerClosed", err)
	}
}

// TestPipelinedRandomIO drives several connections with deep pipelines against a
// backend that completes after random (seeded) delays, so replies come back in
// a scrambled order and in batches; every reply must match its request.
func TestPipelinedRandomIO(t *testing.T) {
	const conns, blocks, bs, depth = 4, 256, 4096, 48
	disk := frontendtest.NewDisk(conns * blocks * bs)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 8))
	disk.Delay = func(op api.Op, off, length int64) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(rng.IntN(2000)) * time.Microsecond
	}
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), MaxInFlight: 32})
	pattern := func(block int) []byte {
		return bytes.Repeat([]byte{byte(block), byte(block >> 8), 0xa5, 0x5a}, bs/4)
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for ci := range conns {
		c := open(t, ts.sock, "disk")
		order := rand.New(rand.NewPCG(uint64(ci), 9)).Perm(blocks)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pipeline(c, ci*blocks, order, pattern, depth)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// pipeline writes every block of its region in the given order, then reads each
// back, keeping depth requests outstanding; it checks cookies and data.
func pipeline(c *client, first int, order []int, pattern func(int) []byte, depth int) error {
	for _, write := range []bool{true, false} {
		sent, got := 0, 0
		pending := map[uint64]int{} // cookie → block
		sendErr := make(chan error, 1)
		slots := make(chan struct{}, depth)
		var mu sync.Mutex
		go func() {
			for sent < len(order) {
				slots <- struct{}{}
				b := first + order[sent]
				cookie := uint64(sent)<<1 | 1
				mu.Lock()
				pending[cookie] = b
				mu.Unlock()
				var payload []byte
				typ := uint16(cmdRead)
				if write {
					typ, payload = cmdWrite, pattern(b)
				}
				hdr := reqBytes(typ, 0, uint64(b)*4096, 4096, payload)
				binary.BigEndian.PutUint64(hdr[8:], cookie)
				if _, err := c.nc.Write(hdr); err != nil {
					sendErr <- err
					return
				}
				sent++
			}
			sendErr <- nil
		}()
		for got < len(order) {
			var h [replyHeaderLen]byte
			if _, err := io.ReadFull(c.br, h[:]); err != nil {
				return err
			}
			cookie := binary.BigEndian.Uint64(h[8:])
			mu.Lock()
			b, ok := pending[cookie]
			delete(pending, cookie)
			mu.Unlock()
			if !ok || binary.BigEndian.Uint32(h[:]) != simpleReplyMagic || binary.BigEndian.Uint32(h[4:]) != 0 {
				return fmt.Errorf("bad reply % x (known cookie %v)", h, ok)
			}
			if !write {
				data := make([]byte, 4096)
				if _, err := io.ReadFull(c.br, data); err != nil {
					return err
				}
				if !bytes.Equal(data, pattern(b)) {
					return fmt.Errorf("block %d read back wrong data", b)
				}
			}
			got++
			<-slots
		}
		if err := <-sendErr; err != nil {
			return err
		}
	}
	return nil
}

func TestClientThatStopsReadingIsDisconnected(t *testing.T) {
	disk := frontendtest.NewDisk(32 << 20)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), WriteTimeout: 100 * time.Millisecond})
	c := open(t, ts.sock, "disk")
	// 64 reads of 1 MiB: far more than the socket buffers hold; never read.
	for i := range uint64(64) {
		c.send(cmdRead, 0, i, (i%32)<<20, 1<<20, nil)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		n := ts.conns.Len()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a client that never reads replies kept its connection")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestInFlightBytesAreBounded(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Gate = make(chan struct{})
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), MaxInFlightBytes: 3 * 4096})
	c := open(t, ts.sock, "disk")
	for i := range uint64(6) {
		c.send(cmdRead, 0, i, i*4096, 4096, nil)
	}
	disk.WaitSubmitted(t, 3)
	time.Sleep(100 * time.Millisecond) // time to (wrongly) submit more
	if n := disk.Submitted.Load(); n != 3 {
		t.Fatalf("%d reads of 4 KiB submitted with a 12 KiB budget", n)
	}
	for range 6 {
		disk.Gate <- struct{}{}
	}
	for range 6 {
		if _, errno, _ := c.reply(func(uint64) int { return 4096 }); errno != 0 {
			t.Fatalf("errno %d", errno)
		}
	}
}

// A reply far larger than the socket buffer, to a client that reads it only
// later: the writer waits for the socket until the client reads. The reply and
// the replies after it must arrive whole and correct.
func TestLargeReplyToASlowReader(t *testing.T) {
	disk := frontendtest.NewDisk(17 << 20)
	rng := rand.New(rand.NewPCG(3, 4))
	fill := make([]byte, 17<<20)
	for i := range fill {
		fill[i] = byte(rng.Uint32())
	}
	disk.Put(0, fill)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports(), MaxPayload: 16 << 20})
	c := open(t, ts.sock, "disk")
	c.send(cmdRead, 0, 1, 1<<20, 16<<20, nil)
	time.Sleep(50 * time.Millisecond) // the reply waits in the socket, partly written
	cookie, errno, got := c.reply(func(uint64) int { return 16 << 20 })
	if cookie != 1 || errno != 0 || !bytes.Equal(got, disk.Bytes(1<<20, 16<<20)) {
		t.Fatalf("16 MiB read: cookie %d, errno %d, data equal %v", cookie, errno, bytes.Equal(got, disk.Bytes(1<<20, 16<<20)))
	}
	for i := range 50 {
		off := uint64(i) * 4096
		if errno, got := c.do(cmdRead, 0, off, 4096, nil); errno != 0 || !bytes.Equal(got, disk.Bytes(int(off), 4096)) {
			t.Fatalf("4 KiB read %d after the large one: errno %d", i, errno)
		}
	}
}

// TestExportGrowsWhileAttached: a volume that grew while a client is in
// transmission serves IO in the added part (a kernel client told the new
// size with NBD_SET_SIZE sends it there); before it grew, the same request
// is refused.
func TestExportGrowsWhileAttached(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	ts := startServer(t, Config{Exports: frontendtest.Disks{"disk": disk}.Exports()})
	c := open(t, ts.sock, "disk")
	if errno, _ := c.do(cmdRead, 0, 1<<20, 4096, nil); errno != EINVAL {
		t.Fatalf("read past the end: errno %d, want EINVAL", errno)
	}
	disk.Grow(1 << 20)
	payload := bytes.Repeat([]byte{0x77}, 4096)
	waitFor(t, 60*time.Second, "a write in the part the export grew by", func() error {
		if errno, _ := c.do(cmdWrite, 0, 1<<20, 4096, payload); errno != 0 {
			return fmt.Errorf("errno %d", errno)
		}
		return nil
	})
	if got := disk.Bytes(1<<20, 4096); !bytes.Equal(got, payload) {
		t.Fatal("the write in the added part did not land")
	}
	if errno, _ := c.do(cmdRead, 0, 2<<20, 4096, nil); errno != EINVAL {
		t.Fatalf("read past the new end: errno %d, want EINVAL", errno)
	}
}
