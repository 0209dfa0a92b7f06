package scrub_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/scrub"
)

// The OpChecksum reply format of internal/chunkserver's doc.go, decoded; the
// check test against a real cluster (cmd/basalt) covers the chunkserver's encoder.
func TestDecodeChecksums(t *testing.T) {
	b := binary.BigEndian.AppendUint32(nil, 3)
	for i := range uint64(3) {
		b = binary.BigEndian.AppendUint64(b, 1<<40+i)
		b = binary.BigEndian.AppendUint64(b, 7*i)
		b = binary.BigEndian.AppendUint32(b, 0xdeadbeef-uint32(i))
	}
	sums, err := scrub.DecodeChecksums(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) != 3 {
		t.Fatalf("decoded %d entries, want 3", len(sums))
	}
	for i, s := range sums {
		want := scrub.ChunkSum{Volume: 1<<40 + uint64(i), Index: 7 * uint64(i), CRC32C: 0xdeadbeef - uint32(i)}
		if s != want {
			t.Fatalf("entry %d: %+v, want %+v", i, s, want)
		}
	}
	for _, bad := range [][]byte{nil, {0, 0, 0}, b[:len(b)-1], append(b, 0)} {
		if _, err := scrub.DecodeChecksums(bad); !errors.Is(err, scrub.ErrBadReply) {
			t.Fatalf("malformed %x: got %v, want ErrBadReply", bad, err)
		}
	}
}
