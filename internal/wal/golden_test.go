package wal

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite testdata/segment.golden from the current encoder")

// TestGoldenSegment freezes the on-disk format: a fixed sequence of calls
// must produce exactly the bytes of testdata/segment.golden. A difference
// means the format changed; if that is deliberate, bump segVersion, update
// doc.go and regenerate with `go test ./internal/wal -run Golden -update`.
func TestGoldenSegment(t *testing.T) {
	dir := t.TempDir()
	w := openT(t, dir, func(c *Config) { c.SegmentSize = 4 << 10 })
	mustSave(t, w, Update{Group: 0x0000000100000002, HardState: hs(2, 1, 1), Entries: []*pb.Entry{
		{Term: new(uint64(1)), Index: new(uint64(1)), Type: new(pb.EntryType_EntryNormal)},
		{Term: new(uint64(2)), Index: new(uint64(2)), Type: new(pb.EntryType_EntryNormal), Data: []byte("write")},
		{Term: new(uint64(2)), Index: new(uint64(3)), Type: new(pb.EntryType_EntryConfChangeV2), Data: []byte{}},
	}})
	snap := &pb.Snapshot{Data: []byte("epochs"), Metadata: &pb.SnapshotMetadata{
		Index: new(uint64(2)), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}}}
	if err := w.CreateSnapshot(0x0000000100000002, snap, 1); err != nil {
		t.Fatal(err)
	}
	// An entry written from where it lies (refMinBytes lowered for the test):
	// padded to agree with its address modulo dioAlign, after a pad record
	// that starts its batch on a dioAlign boundary.
	defer func(n int) { refMinBytes = n }(refMinBytes)
	refMinBytes = 64
	mem, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	big := mem[37 : 37+100]
	copy(big, bytes.Repeat([]byte("by reference "), 8))
	mustSave(t, w, Update{Group: 0x0000000100000002, Entries: []*pb.Entry{
		{Term: new(uint64(2)), Index: new(uint64(4)), Type: new(pb.EntryType_EntryNormal), Data: big},
	}})
	recv := &pb.Snapshot{Data: []byte("r"), Metadata: &pb.SnapshotMetadata{
		Index: new(uint64(10)), Term: new(uint64(3)), ConfState: &pb.ConfState{Voters: []uint64{5}, AutoLeave: new(true)}}}
	mustSave(t, w, Update{Group: 7, Snapshot: recv})
	if err := w.RemoveGroup(7); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	end := w.writeOff
	w.mu.Unlock()
	w.Close()
	// What the segment holds reads back: the entry written by reference too.
	w = openT(t, dir, nil)
	ents, err := w.Storage(0x0000000100000002).Entries(4, 5, 1<<20)
	w.Close()
	if err != nil || len(ents) != 1 || !bytes.Equal(ents[0].Data, big) {
		t.Fatalf("entry 4 read back: %v %v", ents, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, segmentName(1)))
	if err != nil {
		t.Fatal(err)
	}
	got := b[:end]
	golden := filepath.Join("testdata", "segment.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("segment bytes differ from %s:\ngot:\n%s\nwant:\n%s", golden, hex.Dump(got), hex.Dump(want))
	}
}
