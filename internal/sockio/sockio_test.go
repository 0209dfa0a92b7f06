package sockio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// socketPair returns the two ends of a Unix stream connection.
func socketPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("unix", fmt.Sprintf("@sockio-test/%d/%s", os.Getpid(), t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err = net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-accepted
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestReaderWaitsReadsAndEnds(t *testing.T) {
	a, b := socketPair(t)
	r := NewReader(b)
	if _, ok := r.(*Reader); !ok {
		t.Fatalf("NewReader of a socket returned %T", r)
	}
	go func() {
		time.Sleep(20 * time.Millisecond) // the first Read waits for the data
		a.Write([]byte("hello, "))
		a.Write([]byte("world"))
		a.Close()
	}()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "hello, world" {
		t.Fatalf("read %q, %v; want \"hello, world\" and the end of the stream", got, err)
	}
	if n, err := r.Read(make([]byte, 4)); n != 0 || err != io.EOF {
		t.Fatalf("Read after the end: %d, %v; want 0, EOF", n, err)
	}
}

func TestReaderDeadlineAndClose(t *testing.T) {
	_, b := socketPair(t)
	r := NewReader(b)
	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := r.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v; want ErrDeadlineExceeded", err)
	}
	b.SetReadDeadline(time.Time{})
	go func() {
		time.Sleep(20 * time.Millisecond)
		b.Close()
	}()
	if _, err := r.Read(make([]byte, 8)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read of a closed connection: %v; want net.ErrClosed", err)
	}
}

// A write larger than the socket buffers: TryWrite takes part of it without
// waiting, Write waits for the reader and sends the rest in order.
func TestWriterTryAndWrite(t *testing.T) {
	a, b := socketPair(t)
	w := NewWriter(a)
	if !w.CanTry() {
		t.Fatal("CanTry false for a socket")
	}
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i * 7 / 5)
	}
	bufs := [][]byte{data[:100], {}, data[100 : 8<<20], data[8<<20:]}
	n := w.TryWrite(bufs)
	if n <= 0 || n >= len(data) {
		t.Fatalf("TryWrite wrote %d of %d bytes; want part of them", n, len(data))
	}
	if again := w.TryWrite([][]byte{data[n:]}); again != 0 {
		t.Fatalf("TryWrite on a full socket wrote %d bytes; want 0", again)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(b)
		got <- b
	}()
	if m, err := w.Write(Advance(bufs, n)); err != nil || m != len(data)-n {
		t.Fatalf("Write: %d, %v; want %d, nil", m, err, len(data)-n)
	}
	a.Close()
	if !bytes.Equal(<-got, data) {
		t.Fatal("the reader got other bytes than were written")
	}
}

func TestWriterDeadline(t *testing.T) {
	a, _ := socketPair(t)
	w := NewWriter(a)
	a.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := w.Write([][]byte{make([]byte, 16<<20)}) // nobody reads
	if !errors.Is(err, os.ErrDeadlineExceeded) || n >= 16<<20 {
		t.Fatalf("Write to a socket nobody reads: %d, %v; want a short write and ErrDeadlineExceeded", n, err)
	}
}

// Not a socket (net.Pipe): reads and writes go through the net.Conn, TryWrite
// writes nothing.
func TestNotASocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if r := NewReader(b); r != io.Reader(b) {
		t.Fatalf("NewReader of a pipe returned %T; want the pipe", r)
	}
	w := NewWriter(a)
	if w.CanTry() || w.TryWrite([][]byte{[]byte("x")}) != 0 {
		t.Fatal("TryWrite on a pipe claims to write")
	}
	go w.Write([][]byte{[]byte("ab"), []byte("cd")})
	got := make([]byte, 4)
	if _, err := io.ReadFull(b, got); err != nil || string(got) != "abcd" {
		t.Fatalf("read %q, %v through the pipe; want abcd", got, err)
	}
}
