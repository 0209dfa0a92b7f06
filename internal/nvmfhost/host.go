package nvmfhost

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Options configures Connect.
type Options struct {
	HostNQN      string // default DefaultHostNQN
	HeaderDigest bool
	DataDigest   bool
	Queues       int // I/O queues; default 1
	QueueSize    int // entries per I/O queue; default 128 (at most depth 127 in flight)
	// NoInCapsule sends every write's data by R2T, even when it fits the
	// controller's in-capsule data size.
	NoInCapsule bool
}

// DefaultHostNQN is the host NQN Connect uses when Options.HostNQN is empty.
const DefaultHostNQN = "nqn.2014-08.org.nvmexpress:uuid:6261736c-7420-6265-6e63-680000000001"

// Controller properties.
const (
	PropCAP  = 0x00
	PropCC   = 0x14
	PropCSTS = 0x1c
)

// Host is a connected controller: its admin queue and I/O queues, and
// namespace 1.
type Host struct {
	Admin *Conn
	IO    []*Queue
	// BlockSize and Blocks describe namespace 1; MaxTransfer is the
	// controller's MDTS in bytes (0: no limit); InCapsule the most write
	// data a capsule may carry.
	BlockSize   int
	Blocks      uint64
	MaxTransfer int
	InCapsule   int
	noInCapsule bool
}

// Connect connects to subsystem subnqn at addr: the admin queue, CC.EN,
// Identify, the number of queues, and the I/O queues.
func Connect(ctx context.Context, addr, subnqn string, o Options) (h *Host, err error) {
	if o.HostNQN == "" {
		o.HostNQN = DefaultHostNQN
	}
	if o.Queues <= 0 {
		o.Queues = 1
	}
	if o.QueueSize <= 1 {
		o.QueueSize = 128
	}
	admin, err := Dial(ctx, addr, o.HeaderDigest, o.DataDigest)
	if err != nil {
		return nil, err
	}
	h = &Host{Admin: admin, noInCapsule: o.NoInCapsule}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	if dl, ok := ctx.Deadline(); ok {
		admin.nc.SetDeadline(dl)
		defer admin.nc.SetDeadline(time.Time{})
	}
	must := func(r Result, err error) (Result, error) {
		if err == nil {
			err = r.Err()
		}
		return r, err
	}
	if _, err := must(admin.Connect(subnqn, o.HostNQN, 0, 0xffff, 32, 0)); err != nil {
		return nil, fmt.Errorf("connect admin queue: %w", err)
	}
	r, err := must(admin.Property(true, PropCAP, 0))
	if err != nil {
		return nil, fmt.Errorf("get CAP: %w", err)
	}
	if mqes := int(r.DW0&0xffff) + 1; o.QueueSize > mqes {
		o.QueueSize = mqes
	}
	if _, err := must(admin.Property(false, PropCC, 1|4<<20|6<<16)); err != nil { // EN, IOSQES 64, IOCQES 16
		return nil, fmt.Errorf("set CC: %w", err)
	}
	for {
		r, err := must(admin.Property(true, PropCSTS, 0))
		if err != nil {
			return nil, fmt.Errorf("get CSTS: %w", err)
		}
		if r.DW0&1 == 1 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("controller not ready: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	r, err = must(admin.Do(NewSQE(AdminIdentify, 0, 1), nil, false, 4096))
	if err != nil {
		return nil, fmt.Errorf("identify controller: %w", err)
	}
	id := r.Data
	if len(id) < 4096 {
		return nil, fmt.Errorf("identify controller: %d bytes", len(id))
	}
	if mdts := id[77]; mdts > 0 {
		h.MaxTransfer = 4096 << mdts
	}
	h.InCapsule = int(binary.LittleEndian.Uint32(id[1792:]))*16 - SQELen
	r, err = must(admin.Do(NewSQE(AdminIdentify, 1, 0), nil, false, 4096))
	if err != nil {
		return nil, fmt.Errorf("identify namespace: %w", err)
	}
	ns := r.Data
	if len(ns) < 4096 {
		return nil, fmt.Errorf("identify namespace: %d bytes", len(ns))
	}
	h.Blocks = binary.LittleEndian.Uint64(ns[0:])
	lbaf := ns[128+4*int(ns[26]&0xf):]
	h.BlockSize = 1 << lbaf[2]
	n := uint32(o.Queues - 1)
	r, err = must(admin.Do(NewSQE(AdminSetFeatures, 0, 0x07, n|n<<16), nil, false, 0))
	if err != nil {
		return nil, fmt.Errorf("set number of queues: %w", err)
	}
	if got := int(min(r.DW0&0xffff, r.DW0>>16)) + 1; got < o.Queues {
		o.Queues = got
	}
	for i := 1; i <= o.Queues; i++ {
		c, err := Dial(ctx, addr, o.HeaderDigest, o.DataDigest)
		if err != nil {
			return nil, fmt.Errorf("I/O queue %d: %w", i, err)
		}
		if _, err := must(c.Connect(subnqn, o.HostNQN, uint16(i), admin.CNTLID, o.QueueSize, 0)); err != nil {
			c.Close()
			return nil, fmt.Errorf("connect I/O queue %d: %w", i, err)
		}
		h.IO = append(h.IO, c.Pipeline(o.QueueSize-1))
	}
	return h, nil
}

// Close closes every queue.
func (h *Host) Close() error {
	for _, q := range h.IO {
		q.Close()
	}
	return h.Admin.Close()
}

// Size is namespace 1's size in bytes.
func (h *Host) Size() int64 { return int64(h.Blocks) * int64(h.BlockSize) }

// ReadAt reads len(p) bytes at off through queue qi (several commands at
// once when len(p) exceeds MaxTransfer). off and len(p) are multiples of
// the block size.
func (h *Host) ReadAt(qi int, p []byte, off int64) error {
	return h.split(p, off, func(p []byte, off int64) error {
		r, err := h.IO[qi].Submit(RW(IORead, uint64(off)/uint64(h.BlockSize), len(p)/h.BlockSize), nil, false, p)
		if err == nil {
			err = r.Err()
		}
		return err
	})
}

// WriteAt writes p at off through queue qi: in the capsule when it fits,
// else by R2T.
func (h *Host) WriteAt(qi int, p []byte, off int64) error {
	return h.split(p, off, func(p []byte, off int64) error {
		inCapsule := !h.noInCapsule && len(p) <= h.InCapsule
		r, err := h.IO[qi].Submit(RW(IOWrite, uint64(off)/uint64(h.BlockSize), len(p)/h.BlockSize), p, inCapsule, nil)
		if err == nil {
			err = r.Err()
		}
		return err
	})
}

func (h *Host) split(p []byte, off int64, do func([]byte, int64) error) error {
	if len(p) == 0 || len(p)%h.BlockSize != 0 || off%int64(h.BlockSize) != 0 {
		return fmt.Errorf("nvmfhost: %d bytes at %d: not whole %d-byte blocks", len(p), off, h.BlockSize)
	}
	if h.MaxTransfer == 0 || len(p) <= h.MaxTransfer {
		return do(p, off)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for o := 0; o < len(p); o += h.MaxTransfer {
		e := min(o+h.MaxTransfer, len(p))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := do(p[o:e], off+int64(o)); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
