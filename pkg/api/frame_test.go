package api

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// goldenHeaders are frozen: their encodings in testdata must never change.
var goldenHeaders = []struct {
	name string
	h    Header
}{
	{"zero", Header{}},
	{"write_request", Header{Op: OpWrite, Flags: FlagFUA, ID: 7, PayloadLen: 4096,
		Volume: 42, Epoch: 3, Offset: 16<<20 + 8192, Length: 4096, Copyset: 17, Seq: 12, Settled: 10}},
	{"read_reply_not_leader", Header{Op: OpRead, Flags: FlagReply, ID: 0x0102030405060708,
		Status: StatusNotLeader, Volume: 0xdeadbeefcafe, Epoch: 1, Offset: 1 << 40,
		Length: 65536, Copyset: 0xffffffff, Hint: 9}},
	{"raft", Header{Op: OpRaft, ID: 1, PayloadLen: MaxPayload, Hint: 3}},
}

// TestHeaderGolden freezes the wire encoding of the header (STYLE 12).
func TestHeaderGolden(t *testing.T) {
	for _, g := range goldenHeaders {
		t.Run(g.name, func(t *testing.T) {
			var b [HeaderSize]byte
			g.h.Encode(b[:])
			path := filepath.Join("testdata", "header_"+g.name+".golden")
			got := hexDump(b[:])
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if got != string(want) {
				t.Fatalf("encoding changed:\ngot:\n%swant:\n%s", got, want)
			}
			raw, err := hex.DecodeString(strings.Join(strings.Fields(string(want)), ""))
			if err != nil {
				t.Fatal(err)
			}
			dec, err := DecodeHeader(raw)
			if err != nil || dec != g.h {
				t.Fatalf("decode golden: %+v, %v; want %+v", dec, err, g.h)
			}
		})
	}
}

// hexDump renders 16 bytes per line, as in the header table's offsets.
func hexDump(b []byte) string {
	var sb strings.Builder
	for i := 0; i < len(b); i += 16 {
		sb.WriteString(hex.EncodeToString(b[i : i+16]))
		sb.WriteByte('\n')
	}
	return sb.String()
}

func randHeader(r *rand.Rand) Header {
	return Header{
		Op: Op(r.Uint32()), Flags: Flags(r.Uint32()), ID: r.Uint64(), Status: Status(r.Uint32()),
		PayloadLen: r.Uint32N(MaxPayload + 1), Volume: r.Uint64(), Epoch: r.Uint64(),
		Offset: r.Uint64(), Length: r.Uint32(), Copyset: r.Uint32(), Hint: r.Uint64(),
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var b [HeaderSize]byte
	for range 10000 {
		h := randHeader(r)
		h.Encode(b[:])
		got, err := DecodeHeader(b[:])
		if err != nil || got != h {
			t.Fatalf("round trip %+v: got %+v, %v", h, got, err)
		}
	}
}

func TestDecodeHeaderRejects(t *testing.T) {
	var b [HeaderSize]byte
	(&Header{Op: OpRead}).Encode(b[:])
	if _, err := DecodeHeader(b[:HeaderSize-1]); err == nil {
		t.Fatal("short header accepted")
	}
	bad := b
	bad[0] ^= 1
	if _, err := DecodeHeader(bad[:]); !errors.Is(err, ErrBadMagic) {
		t.Fatalf("bad magic: %v", err)
	}
	bad = b
	bad[4] = 3
	if _, err := DecodeHeader(bad[:]); !errors.Is(err, ErrBadVersion) {
		t.Fatalf("bad version: %v", err)
	}
	// A version-1 peer's frames (testdata/v1, frozen when version 2 came) are
	// refused by their version, whatever follows them.
	v1, _ := filepath.Glob(filepath.Join("testdata", "v1", "*.golden"))
	if len(v1) == 0 {
		t.Fatal("no testdata/v1 headers")
	}
	for _, path := range v1 {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := hex.DecodeString(strings.Join(strings.Fields(string(want)), ""))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeHeader(append(raw, make([]byte, HeaderSize)...)); !errors.Is(err, ErrBadVersion) {
			t.Fatalf("%s: %v, want ErrBadVersion", path, err)
		}
	}
	(&Header{Op: OpWrite, PayloadLen: MaxPayload + 1}).Encode(bad[:])
	if _, err := DecodeHeader(bad[:]); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("too large: %v", err)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	for _, g := range goldenHeaders {
		var b [HeaderSize]byte
		g.h.Encode(b[:])
		f.Add(b[:])
	}
	f.Add([]byte("BSLT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			return
		}
		if h.PayloadLen > MaxPayload {
			t.Fatalf("accepted payload %d", h.PayloadLen)
		}
		var out [HeaderSize]byte
		h.Encode(out[:])
		if !bytes.Equal(out[:], b[:HeaderSize]) {
			t.Fatalf("re-encoding differs:\n%x\n%x", out, b[:HeaderSize])
		}
	})
}

func BenchmarkHeaderEncode(b *testing.B) {
	h := goldenHeaders[2].h
	var buf [HeaderSize]byte
	b.SetBytes(HeaderSize)
	for b.Loop() {
		h.Encode(buf[:])
	}
}

func BenchmarkHeaderDecode(b *testing.B) {
	var buf [HeaderSize]byte
	goldenHeaders[2].h.Encode(buf[:])
	b.SetBytes(HeaderSize)
	for b.Loop() {
		if _, err := DecodeHeader(buf[:]); err != nil {
			b.Fatal(err)
		}
	}
}
