package scrub_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/basalt-storage/basalt/internal/chunkserver"
	"github.com/basalt-storage/basalt/internal/scrub"
)

// scrub decodes OpChecksum replies itself (the chunkserver imports scrub):
// its decoder must agree with the chunkserver's.
func TestDecodeChecksumsMatchesChunkserver(t *testing.T) {
	b := binary.BigEndian.AppendUint32(nil, 3)
	for i := range uint64(3) {
		b = binary.BigEndian.AppendUint64(b, 1<<40+i)
		b = binary.BigEndian.AppendUint64(b, 7*i)
		b = binary.BigEndian.AppendUint32(b, 0xdeadbeef-uint32(i))
	}
	ours, err := scrub.DecodeChecksums(b)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := chunkserver.DecodeChecksums(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(ours) != 3 || len(theirs) != 3 {
		t.Fatalf("decoded %d and %d entries, want 3", len(ours), len(theirs))
	}
	for i := range ours {
		if ours[i] != scrub.ChunkSum(theirs[i]) {
			t.Fatalf("entry %d: %+v vs chunkserver's %+v", i, ours[i], theirs[i])
		}
	}
	for _, bad := range [][]byte{nil, {0, 0, 0}, b[:len(b)-1], append(b, 0)} {
		_, e1 := scrub.DecodeChecksums(bad)
		_, e2 := chunkserver.DecodeChecksums(bad)
		if !errors.Is(e1, scrub.ErrBadReply) || e2 == nil {
			t.Fatalf("malformed %x: scrub %v, chunkserver %v", bad, e1, e2)
		}
	}
}
