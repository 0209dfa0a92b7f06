package scrub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Fetcher asks one replica for the checksums of its copy of a copyset.
// *Dialer implements it over the data-plane transport; tests may stub it.
type Fetcher interface {
	Checksums(ctx context.Context, addr string, pool, copyset uint32) ([]ChunkSum, error)
}

// ChunkSum is one entry of an OpChecksum reply.
type ChunkSum struct {
	Volume, Index uint64
	CRC32C        uint32
}

// DecodeChecksums parses an OpChecksum reply payload: uint32 n, then n ×
// (uint64 volume, uint64 chunk index, uint32 crc32c), big-endian — the format
// internal/chunkserver's doc.go specifies. This is the one decoder of it (the
// chunkserver imports this package to run its Scrubber).
func DecodeChecksums(b []byte) ([]ChunkSum, error) {
	if len(b) < 4 {
		return nil, ErrBadReply
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if uint64(len(b)) != 20*uint64(n) {
		return nil, ErrBadReply
	}
	out := make([]ChunkSum, 0, n)
	for ; len(b) > 0; b = b[20:] {
		out = append(out, ChunkSum{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint32(b[16:])})
	}
	return out, nil
}

// minReplyBuf is the first reply buffer for a copyset never asked before
// (room for 3276 chunks); a larger reply is asked for again with the size the
// replica announced.
const minReplyBuf = 64 << 10

// Dialer is the default Fetcher: one transport connection per chunkserver
// address (a transport.ConnCache), kept open across requests and redialled
// once it died.
type Dialer struct {
	conns *transport.ConnCache[string] // by address

	mu    sync.Mutex     // guards sizes
	sizes map[uint64]int // last reply size per copyset (pool<<32|id)
}

// NewDialer returns a Dialer; Close it to drop its connections.
func NewDialer(log *slog.Logger, sec transport.Security) *Dialer {
	if log == nil {
		log = slog.Default()
	}
	conns := transport.NewConnCache(transport.ConnCacheConfig[string]{
		Addr: func(addr string) (string, error) { return addr, nil },
		Conn: transport.ConnConfig{Logger: log, Security: sec},
	})
	return &Dialer{conns: conns, sizes: map[uint64]int{}}
}

// busyWait is the first pause before asking a BUSY replica again; it
// doubles up to maxBusyWait.
const (
	busyWait    = 10 * time.Millisecond
	maxBusyWait = 500 * time.Millisecond
)

// Checksums implements Fetcher. A BUSY replica is asked again, with a
// growing pause, until ctx ends; a transport failure or another non-OK
// status is returned wrapped in ErrUnreachable.
func (d *Dialer) Checksums(ctx context.Context, addr string, pool, copyset uint32) ([]ChunkSum, error) {
	if addr == "" {
		return nil, fmt.Errorf("%w: no address known", ErrUnreachable)
	}
	key := uint64(pool)<<32 | uint64(copyset)
	d.mu.Lock()
	size := max(d.sizes[key], minReplyBuf)
	d.mu.Unlock()
	grown, wait := false, busyWait
	for {
		conn, err := d.conns.Conn(ctx, addr)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
		}
		call := &transport.Call{
			Header:  api.Header{Op: api.OpChecksum, Volume: uint64(pool), Copyset: copyset},
			ReadBuf: make([]byte, size),
		}
		err = conn.Do(ctx, call)
		if errors.Is(err, transport.ErrShortBuffer) && !grown {
			// The replica announced its reply size: ask again with room for it.
			size, grown = int(call.Reply.PayloadLen), true
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
		}
		if call.Reply.Status == api.StatusBusy {
			// The replica serves only a few checksum requests at once (per
			// identity and in all): ask again a little later.
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: %s stayed busy: %v", ErrUnreachable, addr, ctx.Err())
			case <-time.After(wait):
			}
			wait = min(2*wait, maxBusyWait)
			continue
		}
		if err := api.StatusError(call.Reply.Status, call.Reply.Hint); err != nil {
			return nil, fmt.Errorf("%w: %s answered %v", ErrUnreachable, addr, err)
		}
		n := int(call.Reply.PayloadLen)
		sums, err := DecodeChecksums(call.ReadBuf[:n])
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, addr, err)
		}
		d.mu.Lock()
		d.sizes[key] = n + n/4
		d.mu.Unlock()
		return sums, nil
	}
}

// Close closes every connection.
func (d *Dialer) Close() error {
	d.conns.Close()
	return nil
}
