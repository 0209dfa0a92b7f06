package nbd

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

func handshakeServer(t *testing.T) *testServer {
	disk := frontendtest.NewDisk(1 << 20)
	disk.Description = "test disk"
	ro := frontendtest.NewDisk(64 << 10)
	ro.ReadOnly = true
	return startServer(t, Config{Exports: frontendtest.Disks{"disk": disk, "ro": ro}.Exports()})
}

func TestGoReportsExportInfo(t *testing.T) {
	ts := handshakeServer(t)
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	if typ := c.infoGo(optGo, "disk", infoName, infoDescription, infoBlockSize, 999); typ != repAck {
		t.Fatalf("GO reply %#x, want ACK", typ)
	}
	if c.size != 1<<20 {
		t.Errorf("size %d, want %d", c.size, 1<<20)
	}
	want := uint16(flagHasFlags | flagSendFlush | flagSendFUA | flagSendTrim | flagSendWriteZeroes | flagCanMultiConn)
	if c.flags != want {
		t.Errorf("transmission flags %#x, want %#x", c.flags, want)
	}
	if got := string(c.infos[infoName]); got != "disk" {
		t.Errorf("NBD_INFO_NAME %q", got)
	}
	if got := string(c.infos[infoDescription]); got != "test disk" {
		t.Errorf("NBD_INFO_DESCRIPTION %q", got)
	}
	bs := c.infos[infoBlockSize]
	if len(bs) != 12 {
		t.Fatalf("NBD_INFO_BLOCK_SIZE payload %d bytes", len(bs))
	}
	if mn, pr, mx := binary.BigEndian.Uint32(bs), binary.BigEndian.Uint32(bs[4:]), binary.BigEndian.Uint32(bs[8:]); mn != 1 || pr != 4096 || mx != 32<<20 {
		t.Errorf("block sizes %d/%d/%d, want 1/4096/32MiB", mn, pr, mx)
	}
	// Transmission works right after the ACK.
	if errno, _ := c.do(cmdRead, 0, 0, 512, nil); errno != 0 {
		t.Fatalf("read after GO: errno %d", errno)
	}
}

func TestInfoThenGoAndReadOnlyFlags(t *testing.T) {
	ts := handshakeServer(t)
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle)
	if typ := c.infoGo(optInfo, "ro"); typ != repAck {
		t.Fatalf("INFO reply %#x", typ)
	}
	if _, ok := c.infos[infoName]; ok {
		t.Errorf("NBD_INFO_NAME sent without being asked")
	}
	want := uint16(flagHasFlags | flagReadOnly | flagSendFlush | flagCanMultiConn)
	if c.flags != want || c.size != 64<<10 {
		t.Fatalf("INFO: flags %#x size %d, want %#x %d", c.flags, c.size, want, 64<<10)
	}
	// INFO does not end the handshake: further options work.
	if typ := c.infoGo(optGo, "ro"); typ != repAck || c.flags != want {
		t.Fatalf("GO after INFO: reply %#x flags %#x", typ, c.flags)
	}
	if errno, _ := c.do(cmdWrite, 0, 0, 4, []byte("abcd")); errno != EPERM {
		t.Errorf("write on read-only export: errno %d, want EPERM", errno)
	}
	if errno, _ := c.do(cmdTrim, 0, 0, 4, nil); errno != EPERM {
		t.Errorf("trim on read-only export: errno %d, want EPERM", errno)
	}
	if errno, _ := c.do(cmdRead, 0, 0, 4, nil); errno != 0 {
		t.Errorf("read on read-only export: errno %d", errno)
	}
}

func TestExportName(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cflags uint32
		zeroes int
	}{
		{"no-zeroes", flagCFixedNewstyle | flagCNoZeroes, 0},
		{"zeroes", flagCFixedNewstyle, 124},
		{"non-fixed client", 0, 124},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := handshakeServer(t)
			c := dial(t, ts.sock)
			c.greet(tc.cflags)
			c.sendOpt(optExportName, []byte("disk"))
			b := make([]byte, 10+tc.zeroes)
			c.read(b)
			if size := binary.BigEndian.Uint64(b); size != 1<<20 {
				t.Errorf("size %d", size)
			}
			if fl := binary.BigEndian.Uint16(b[8:]); fl&flagHasFlags == 0 || fl&flagCanMultiConn == 0 {
				t.Errorf("flags %#x", fl)
			}
			if !bytes.Equal(b[10:], make([]byte, tc.zeroes)) {
				t.Errorf("padding is not zeroes")
			}
			if errno, _ := c.do(cmdWrite, cmdFlagFUA, 0, 3, []byte("xyz")); errno != 0 {
				t.Errorf("write: errno %d", errno)
			}
		})
	}
}

func TestExportNameUnknownCloses(t *testing.T) {
	ts := handshakeServer(t)
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle)
	c.sendOpt(optExportName, []byte("nope"))
	c.expectEOF()
}

func TestList(t *testing.T) {
	ts := handshakeServer(t)
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle)
	c.sendOpt(optList, nil)
	var names []string
	for {
		r := c.readOptReply()
		if r.typ == repAck {
			break
		}
		if r.typ != repServer {
			t.Fatalf("LIST reply type %#x", r.typ)
		}
		n := binary.BigEndian.Uint32(r.data)
		names = append(names, string(r.data[4:4+n]))
	}
	if len(names) != 2 || names[0] != "disk" || names[1] != "ro" {
		t.Errorf("LIST = %q, want [disk ro]", names)
	}
	c.sendOpt(optList, []byte{1})
	if r := c.readOptReply(); r.typ != repErrInvalid {
		t.Errorf("LIST with data: reply %#x, want ERR_INVALID", r.typ)
	}
}

func TestOptionErrors(t *testing.T) {
	ts := handshakeServer(t)
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle | flagCNoZeroes)
	cases := []struct {
		name string
		opt  uint32
		data []byte
		want uint32
	}{
		{"structured reply refused", optStructuredReply, nil, repErrUnsup},
		{"starttls refused", optStartTLS, nil, repErrUnsup},
		{"unknown option", 0x7777, []byte("whatever"), repErrUnsup},
		{"meta context", 10, goData("disk"), repErrUnsup},
		{"go too short", optGo, []byte{0, 0, 0}, repErrInvalid},
		{"go name too long", optGo, []byte{0, 0, 0, 9, 'd', 0, 0}, repErrInvalid},
		{"go count mismatch", optGo, append(goData("disk"), 0, 3), repErrInvalid},
		{"go info count too big", optGo, []byte{0, 0, 0, 0, 0, 2, 0, 3}, repErrInvalid},
		{"go name with NUL", optGo, goData("di\x00sk"), repErrInvalid},
		{"go unknown export", optGo, goData("nope"), repErrUnknown},
		{"info unknown export", optInfo, goData("nope", infoBlockSize), repErrUnknown},
		{"longest legal name", optGo, goData(strings.Repeat("n", maxStringLen)), repErrUnknown},
		{"name over 4096 bytes", optInfo, goData(strings.Repeat("n", maxStringLen+1)), repErrInvalid},
	}
	for _, tc := range cases {
		c.sendOpt(tc.opt, tc.data)
		r := c.readOptReply()
		if r.opt != tc.opt || r.typ != tc.want {
			t.Errorf("%s: reply opt %d type %#x, want %d %#x", tc.name, r.opt, r.typ, tc.opt, tc.want)
		}
	}
	// After all those errors the client can still go.
	if typ := c.infoGo(optGo, "disk"); typ != repAck {
		t.Fatalf("GO after errors: %#x", typ)
	}
}

func TestAbort(t *testing.T) {
	ts := handshakeServer(t)
	c := dial(t, ts.sock)
	c.greet(flagCFixedNewstyle)
	c.sendOpt(optAbort, []byte("ignored"))
	if r := c.readOptReply(); r.opt != optAbort || r.typ != repAck {
		t.Fatalf("ABORT reply %+v", r)
	}
	c.expectEOF()
}

func TestHandshakeViolationsClose(t *testing.T) {
	t.Run("unknown client flags", func(t *testing.T) {
		ts := handshakeServer(t)
		c := dial(t, ts.sock)
		c.greet(flagCFixedNewstyle | 1<<5)
		c.expectEOF()
	})
	t.Run("bad option magic", func(t *testing.T) {
		ts := handshakeServer(t)
		c := dial(t, ts.sock)
		c.greet(flagCFixedNewstyle)
		c.write(make([]byte, 16))
		c.expectEOF()
	})
	t.Run("option too long", func(t *testing.T) {
		ts := handshakeServer(t)
		c := dial(t, ts.sock)
		c.greet(flagCFixedNewstyle)
		b := binary.BigEndian.AppendUint64(nil, ihaveOpt)
		b = binary.BigEndian.AppendUint32(b, optGo)
		b = binary.BigEndian.AppendUint32(b, 1<<20)
		c.write(b)
		if r := c.readOptReply(); r.typ != repErrTooBig {
			t.Errorf("reply %#x, want ERR_TOO_BIG", r.typ)
		}
		c.expectEOF()
	})
	t.Run("export name too long", func(t *testing.T) {
		ts := handshakeServer(t)
		c := dial(t, ts.sock)
		c.greet(flagCFixedNewstyle)
		b := binary.BigEndian.AppendUint64(nil, ihaveOpt)
		b = binary.BigEndian.AppendUint32(b, optExportName)
		b = binary.BigEndian.AppendUint32(b, 1<<20)
		c.write(b)
		c.expectEOF()
	})
}

func TestTruncateKeepsValidUTF8(t *testing.T) {
	long := strings.Repeat("é", 3000) // 6000 bytes
	got := truncate(long)
	if len(got) > maxStringLen || len(got) < maxStringLen-1 || !validName(got) {
		t.Errorf("truncate: %d bytes, valid %v", len(got), validName(got))
	}
	if truncate("short") != "short" {
		t.Error("short string changed")
	}
}
