package datastore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzChunk is the chunk size of FuzzReceiveSnapshot's copyset: small, so
// that a stream of many chunk records allocates little disk.
const fuzzChunk = 4096

// fuzzStream is a version-1 snapshot stream of group with one data record
// per chunk.
func fuzzStream(group uint64, chunks []ChunkID, off uint64, data []byte) []byte {
	be := binary.BigEndian
	b := be.AppendUint32(nil, snapMagic)
	b = be.AppendUint32(b, snapVersion)
	b = be.AppendUint64(b, fuzzChunk)
	b = be.AppendUint64(b, group)
	for _, id := range chunks {
		b = append(b, recChunk)
		b = be.AppendUint64(b, id.Volume)
		b = be.AppendUint64(b, id.Index)
		b = be.AppendUint64(b, fuzzChunk)
		b = append(b, recData)
		b = be.AppendUint64(b, off)
		b = be.AppendUint32(b, uint32(len(data)))
		b = append(b, data...)
	}
	b = append(b, recEnd)
	b = be.AppendUint64(b, uint64(len(chunks)))
	return be.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// FuzzReceiveSnapshot feeds the real snapshot receiver (the one a peer's
// stream reaches through raftnet and the chunkserver) arbitrary streams for
// copyset 7 whose chunks are those of an even volume: whatever arrives, it
// neither panics nor stages anything unless the stream is whole and every
// record fits (the group, the chunk size, a chunk of the copyset), and
// what it staged installs to exactly the chunks it named.
func FuzzReceiveSnapshot(f *testing.F) {
	const group = 7
	belongs := func(id ChunkID) bool { return id.Volume%2 == 0 }
	data := bytes.Repeat([]byte{0xab}, 512)
	f.Add(fuzzStream(group, []ChunkID{{2, 0}, {4, 1}}, 0, data))
	f.Add(fuzzStream(group, []ChunkID{{3, 0}}, 0, data))              // a chunk of another copyset
	f.Add(fuzzStream(group, []ChunkID{{2, 0}}, fuzzChunk-100, data))  // past the chunk's end
	f.Add(fuzzStream(group+1, []ChunkID{{2, 0}}, 0, data))            // another group's stream
	f.Add(fuzzStream(group, []ChunkID{{2, 0}, {2, 0}}, 0, data))      // a chunk twice
	f.Add(fuzzStream(group, nil, 0, nil))                             // empty
	f.Add(fuzzStream(group, []ChunkID{{2, 0}}, 0, data)[:40])         // truncated
	f.Add(append(fuzzStream(group, []ChunkID{{2, 0}}, 0, data), 'x')) // trailing bytes (not read)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 256<<10 {
			return // many chunk records: disk, not new code paths
		}
		s := openStore(t, t.TempDir(), 0, Knobs{})
		defer s.Close()
		cs, err := s.Copyset(group, fuzzChunk)
		if err != nil {
			t.Fatal(err)
		}
		err = cs.ReceiveSnapshotChecked(9, bytes.NewReader(in), belongs)
		staged := filepath.Join(cs.dir, stagedName(9))
		_, serr := os.Stat(staged)
		if err != nil {
			if serr == nil {
				t.Fatalf("refused (%v) but staged %s", err, staged)
			}
			if _, err := os.Stat(filepath.Join(cs.dir, stagingDirName)); err == nil {
				t.Fatalf("refused and left the staging area behind")
			}
			return
		}
		if serr != nil {
			t.Fatalf("accepted but nothing staged: %v", serr)
		}
		if err := cs.InstallStaged(9); err != nil {
			t.Fatalf("install: %v", err)
		}
		ids, err := cs.Chunks()
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if !belongs(id) {
				t.Fatalf("installed chunk %v of another copyset", id)
			}
		}
		if !strings.HasPrefix(string(in), string(binary.BigEndian.AppendUint32(nil, snapMagic))) {
			t.Fatal("accepted a stream without the magic")
		}
	})
}

// TestReceiveSnapshotChecksRecords: a stream whose records fit is staged; one
// with a chunk of another copyset, a record past the chunk's end, another
// group's header or a chunk twice is refused with ErrCorrupt.
func TestReceiveSnapshotChecksRecords(t *testing.T) {
	const group = 7
	belongs := func(id ChunkID) bool { return id.Volume%2 == 0 }
	data := bytes.Repeat([]byte{0xab}, 512)
	for _, tc := range []struct {
		name   string
		stream []byte
		ok     bool
	}{
		{"fits", fuzzStream(group, []ChunkID{{2, 0}, {4, 1}}, 0, data), true},
		{"a chunk of another copyset", fuzzStream(group, []ChunkID{{3, 0}}, 0, data), false},
		{"past the chunk's end", fuzzStream(group, []ChunkID{{2, 0}}, fuzzChunk-100, data), false},
		{"another group's stream", fuzzStream(group+1, []ChunkID{{2, 0}}, 0, data), false},
		{"a chunk twice", fuzzStream(group, []ChunkID{{2, 0}, {2, 0}}, 0, data), false},
	} {
		s := openStore(t, t.TempDir(), 0, Knobs{})
		cs, err := s.Copyset(group, fuzzChunk)
		if err != nil {
			t.Fatal(err)
		}
		err = cs.ReceiveSnapshotChecked(9, bytes.NewReader(tc.stream), belongs)
		if tc.ok && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if !tc.ok && !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
		s.Close()
	}
}
