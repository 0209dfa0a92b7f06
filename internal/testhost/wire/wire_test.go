package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// The header layout is frozen: the agent in a cached initramfs and the host may
// come from different builds.
func TestFrameGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, Frame{Kind: Run, ID: 0x01020304, Payload: []byte("ls")}); err != nil {
		t.Fatal(err)
	}
	want := []byte{'b', 'h', 2, 0, 1, 2, 3, 4, 0, 0, 0, 2, 'l', 's'}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("frame bytes % x, want % x", buf.Bytes(), want)
	}
}

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	out := []byte("line\x00with NUL and \xff and a fake header bh\x02\x00")
	frames := []Frame{
		{Kind: Ready, Payload: []byte("5.93")},
		{Kind: Result, ID: 7, Payload: ResultPayload(-1, out)},
		{Kind: Poweroff, Payload: []byte{}},
	}
	for _, f := range frames {
		if err := Write(&buf, f); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range frames {
		got, err := Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if got.Kind != want.Kind || got.ID != want.ID || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("read %+v, want %+v", got, want)
		}
	}
	if _, err := Read(&buf); err != io.EOF {
		t.Fatalf("read at the end: %v, want io.EOF", err)
	}
	status, got, err := ParseResult(frames[1].Payload)
	if err != nil || status != -1 || !bytes.Equal(got, out) {
		t.Fatalf("ParseResult = %d, %q, %v", status, got, err)
	}
}

func TestReadRejectsGarbage(t *testing.T) {
	for name, in := range map[string][]byte{
		"bad magic":     []byte("hello, world"),
		"torn header":   {'b', 'h', 2},
		"torn payload":  {'b', 'h', 4, 0, 0, 0, 0, 1, 0, 0, 0, 9, 1, 2},
		"huge payload":  {'b', 'h', 4, 0, 0, 0, 0, 1, 0xff, 0, 0, 0},
		"nonzero spare": {'b', 'h', 4, 1, 0, 0, 0, 1, 0, 0, 0, 0},
	} {
		if _, err := Read(bytes.NewReader(in)); !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: err %v, want ErrBadFrame", name, err)
		}
	}
}
