package wal

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzReplay feeds Open a segment whose records carry valid CRCs around
// arbitrary payloads: whatever they say, Open must return an error or a
// usable WAL, never panic.
//
//	go test ./internal/wal -run '^$' -fuzz FuzzReplay -fuzztime 30s
func FuzzReplay(f *testing.F) {
	golden, err := os.ReadFile(filepath.Join("testdata", "segment.golden"))
	if err != nil {
		f.Fatal(err)
	}
	// Seed with each golden record's payload.
	for off := segHeaderSize; off < len(golden); {
		n, st := checkRecord(golden[off:], segTag(1))
		if st != recOK {
			break
		}
		f.Add(golden[off+recHeaderSize:off+recHeaderSize+n], []byte(nil))
		off += recHeaderSize + n
	}
	f.Fuzz(func(t *testing.T, p1, p2 []byte) {
		if len(p1) == 0 {
			return
		}
		seg := appendSegmentHeader(nil, 1)
		for _, p := range [][]byte{p1, p2} {
			if len(p) == 0 {
				continue
			}
			var start int
			seg, start = beginRecord(seg)
			seg = append(seg, p...)
			endRecord(seg, start)
		}
		sealRecords(seg[segHeaderSize:], nil, 1)
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), seg, 0o644); err != nil {
			t.Fatal(err)
		}
		w, err := Open(Config{Dir: dir, SegmentSize: 4 << 10, Logger: quietLogger()})
		if err != nil {
			return
		}
		for _, g := range w.Groups() {
			s := w.Storage(g)
			first, _ := s.FirstIndex()
			last, _ := s.LastIndex()
			if last >= first && last-first < 1<<16 {
				s.Entries(first, last+1, 1<<20)
			}
			s.Term(last)
			s.Snapshot()
			s.InitialState()
		}
		w.Close()
	})
}
