package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// PortName is the name of the virtio-serial port that carries the channel:
// the host gives it to QEMU's virtserialport, the agent finds it in sysfs.
const PortName = "org.basalt.testhost.agent"

// Kind says what a frame carries.
type Kind uint8

const (
	Ready    Kind = 1 // guest → host, once: the agent runs commands from now on
	Run      Kind = 2 // host → guest: run the payload with /bin/sh -c
	Cancel   Kind = 3 // host → guest: SIGKILL the process group of command id
	Result   Kind = 4 // guest → host: exit status and output of command id
	Poweroff Kind = 5 // host → guest: stop taking commands, sync, power off
)

const (
	headerSize = 12
	// MaxPayload bounds one frame: a command's output beyond it is cut by the agent.
	MaxPayload = 64 << 20
)

// ErrBadFrame means the stream holds something that is not a frame: the channel
// is out of step and cannot be used any more.
var ErrBadFrame = errors.New("wire: bad frame")

// Frame is one message on the channel.
type Frame struct {
	Kind    Kind
	ID      uint32
	Payload []byte
}

// Write sends f in one Write call, so frames written under one lock never interleave.
func Write(w io.Writer, f Frame) error {
	if len(f.Payload) > MaxPayload {
		return fmt.Errorf("wire: payload of %d bytes exceeds %d", len(f.Payload), MaxPayload)
	}
	b := make([]byte, headerSize+len(f.Payload))
	b[0], b[1], b[2] = 'b', 'h', byte(f.Kind)
	binary.BigEndian.PutUint32(b[4:], f.ID)
	binary.BigEndian.PutUint32(b[8:], uint32(len(f.Payload)))
	copy(b[headerSize:], f.Payload)
	_, err := w.Write(b)
	return err
}

// Read reads the next frame. At a clean end of stream it returns io.EOF.
func Read(r io.Reader) (Frame, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("%w: stream ended inside a header", ErrBadFrame)
		}
		return Frame{}, err
	}
	if h[0] != 'b' || h[1] != 'h' || h[3] != 0 {
		return Frame{}, fmt.Errorf("%w: header % x", ErrBadFrame, h)
	}
	n := binary.BigEndian.Uint32(h[8:])
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("%w: payload length %d exceeds %d", ErrBadFrame, n, MaxPayload)
	}
	f := Frame{Kind: Kind(h[2]), ID: binary.BigEndian.Uint32(h[4:]), Payload: make([]byte, n)}
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		return Frame{}, fmt.Errorf("%w: stream ended inside a payload: %v", ErrBadFrame, err)
	}
	return f, nil
}

// ResultPayload encodes a Result's payload.
func ResultPayload(status int32, output []byte) []byte {
	b := make([]byte, 4+len(output))
	binary.BigEndian.PutUint32(b, uint32(status))
	copy(b[4:], output)
	return b
}

// ParseResult decodes a Result's payload.
func ParseResult(p []byte) (status int32, output []byte, err error) {
	if len(p) < 4 {
		return 0, nil, fmt.Errorf("%w: result payload of %d bytes", ErrBadFrame, len(p))
	}
	return int32(binary.BigEndian.Uint32(p)), p[4:], nil
}
