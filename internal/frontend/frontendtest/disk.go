package frontendtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Disk is an in-memory frontend.Backend. Its exported knobs are set before
// the disk serves IO; its counters may be read at any time.
type Disk struct {
	// ReadOnly makes Info report a read-only device; a write, trim or
	// write-zeroes submitted to it breaks the contract.
	ReadOnly    bool
	Description string
	// BlockSizes are reported as they are (zero fields: Exports' defaults).
	BlockSizes frontend.BlockSizes
	// Fail, if set, decides an error per IO (nil: do the IO).
	Fail func(op api.Op, off, length int64) error
	// Delay, if set, completes the IO on another goroutine after the
	// duration it returns.
	Delay func(op api.Op, off, length int64) time.Duration
	// Gate, if set, holds every completion until a value is received from it.
	Gate chan struct{}
	// T, if set, is failed (Errorf) by a Submit that breaks the contract, as
	// well as counting it in Violations.
	T testing.TB

	Submitted  atomic.Int64 // every Submit
	Mutations  atomic.Int64 // Submits of write, trim, write-zeroes
	Violations atomic.Int64 // Submits that break the Backend contract
	Pending    atomic.Int64 // submitted, done not yet called
	Checks     atomic.Int64 // Check calls
	Closes     atomic.Int64 // Close calls
	Opens      atomic.Int64 // Disks.Open calls that returned this disk

	mu    sync.Mutex
	data  []byte // guarded by mu
	alloc []bool // per api.MapGranule: holds data (Mapped); guarded by mu
}

// NewDisk returns a zeroed disk of size bytes.
func NewDisk(size int) *Disk { return &Disk{data: make([]byte, size)} }

// Info describes the disk as it is now (Grow changes its size): it serves
// every command.
func (d *Disk) Info() frontend.Info {
	d.mu.Lock()
	size := len(d.data)
	d.mu.Unlock()
	return frontend.Info{
		Size: int64(size), ReadOnly: d.ReadOnly, Description: d.Description,
		CanFlush: true, CanFUA: true, CanTrim: true, CanWriteZeroes: true,
		BlockSizes: d.BlockSizes,
	}
}

// Check counts the call; a Disk never stops serving.
func (d *Disk) Check(context.Context) error {
	d.Checks.Add(1)
	return nil
}

// Close counts the call; the disk keeps its data (Disks opens it again).
func (d *Disk) Close() error {
	d.Closes.Add(1)
	return nil
}

// Submit does the IO at once, or as Delay and Gate say.
func (d *Disk) Submit(op api.Op, buf []byte, off, length int64, done func(error)) {
	d.Submitted.Add(1)
	d.Pending.Add(1)
	mutation := op == api.OpWrite || op == api.OpTrim || op == api.OpWriteZeroes
	if mutation {
		d.Mutations.Add(1)
	}
	if err := d.contract(op, buf, off, length, mutation); err != nil {
		d.Violations.Add(1)
		if d.T != nil {
			d.T.Errorf("%v", err)
		}
		d.finish(done, err)
		return
	}
	var delay time.Duration
	if d.Delay != nil {
		delay = d.Delay(op, off, length)
	}
	switch {
	case delay > 0:
		time.AfterFunc(delay, func() { d.run(op, buf, off, length, done) })
	case d.Gate != nil:
		go d.run(op, buf, off, length, done)
	default:
		d.run(op, buf, off, length, done)
	}
}

// contract returns why a Submit breaks the Backend contract, or nil.
func (d *Disk) contract(op api.Op, buf []byte, off, length int64, mutation bool) error {
	d.mu.Lock()
	size := int64(len(d.data))
	d.mu.Unlock()
	bad := off < 0 || length < 0 || off+length > size
	switch op {
	case api.OpRead, api.OpWrite:
		bad = bad || length == 0 || int64(len(buf)) != length
	case api.OpTrim, api.OpWriteZeroes:
		bad = bad || length == 0 || buf != nil
	case api.OpFlush:
		bad = bad || buf != nil || off != 0 || length != 0
	default:
		bad = true
	}
	if !bad && !(mutation && d.ReadOnly) {
		return nil
	}
	return fmt.Errorf("%w: frontendtest: the Backend contract is broken: op %v off %d length %d buf %d, size %d read-only %v",
		frontend.ErrInvalid, op, off, length, len(buf), size, d.ReadOnly)
}

func (d *Disk) run(op api.Op, buf []byte, off, length int64, done func(error)) {
	if d.Gate != nil {
		<-d.Gate
	}
	if d.Fail != nil {
		if err := d.Fail(op, off, length); err != nil {
			d.finish(done, err)
			return
		}
	}
	d.mu.Lock()
	switch op {
	case api.OpRead:
		copy(buf, d.data[off:off+length])
	case api.OpWrite:
		d.writeLocked(buf, off, length)
	case api.OpTrim, api.OpWriteZeroes:
		clear(d.data[off : off+length])
		for g := (off + api.MapGranule - 1) / api.MapGranule; g < (off+length)/api.MapGranule && g < int64(len(d.alloc)); g++ {
			d.alloc[g] = false
		}
	}
	d.mu.Unlock()
	d.finish(done, nil)
}

// CompareAndWrite implements frontend.CompareAndWriter: the compare and the
// write happen under the disk's lock, so no other IO of it comes between.
// Fail is asked with api.OpCompareAndWrite; Gate and Delay apply as to Submit.
func (d *Disk) CompareAndWrite(buf []byte, off, length int64, done func(error)) {
	d.Submitted.Add(1)
	d.Pending.Add(1)
	d.Mutations.Add(1)
	d.mu.Lock()
	size := int64(len(d.data))
	d.mu.Unlock()
	if off < 0 || length <= 0 || length > api.MaxCompareAndWrite || off+length > size || int64(len(buf)) != 2*length ||
		off/api.MaxCompareAndWrite != (off+length-1)/api.MaxCompareAndWrite || d.ReadOnly {
		d.Violations.Add(1)
		err := fmt.Errorf("%w: frontendtest: the CompareAndWriter contract is broken: off %d length %d buf %d, size %d read-only %v",
			frontend.ErrInvalid, off, length, len(buf), size, d.ReadOnly)
		if d.T != nil {
			d.T.Errorf("%v", err)
		}
		d.finish(done, err)
		return
	}
	run := func() {
		if d.Gate != nil {
			<-d.Gate
		}
		if d.Fail != nil {
			if err := d.Fail(api.OpCompareAndWrite, off, length); err != nil {
				d.finish(done, err)
				return
			}
		}
		d.mu.Lock()
		for i, b := range d.data[off : off+length] {
			if b != buf[i] {
				d.mu.Unlock()
				d.finish(done, &frontend.MiscompareError{Offset: int64(i)})
				return
			}
		}
		d.writeLocked(buf[length:], off, length)
		d.mu.Unlock()
		d.finish(done, nil)
	}
	var delay time.Duration
	if d.Delay != nil {
		delay = d.Delay(api.OpCompareAndWrite, off, length)
	}
	switch {
	case delay > 0:
		time.AfterFunc(delay, run)
	case d.Gate != nil:
		go run()
	default:
		run()
	}
}

// writeLocked writes buf at off and allocates the granules it touches.
func (d *Disk) writeLocked(buf []byte, off, length int64) {
	copy(d.data[off:off+length], buf)
	for g := off / api.MapGranule; g < (off+length+api.MapGranule-1)/api.MapGranule; g++ {
		for int64(len(d.alloc)) <= g {
			d.alloc = append(d.alloc, false)
		}
		d.alloc[g] = true
	}
}

// Mapped implements frontend.Mapper as a thin device would (a chunk file):
// a write allocates the api.MapGranule granules it touches, a trim or
// write-zeroes frees those it covers whole. Fail is asked with api.OpMapped.
func (d *Disk) Mapped(bits []byte, off, length int64, done func(error)) {
	d.mu.Lock()
	size := int64(len(d.data))
	d.mu.Unlock()
	if off < 0 || length <= 0 || off%api.MapAlign != 0 || length%api.MapAlign != 0 || off+length > size ||
		int64(len(bits)) != api.MappedBytes(length) {
		d.Violations.Add(1)
		err := fmt.Errorf("%w: frontendtest: the Mapper contract is broken: off %d length %d bits %d, size %d",
			frontend.ErrInvalid, off, length, len(bits), size)
		if d.T != nil {
			d.T.Errorf("%v", err)
		}
		done(err)
		return
	}
	if d.Fail != nil {
		if err := d.Fail(api.OpMapped, off, length); err != nil {
			done(err)
			return
		}
	}
	d.mu.Lock()
	clear(bits)
	for i := range length / api.MapGranule {
		if g := off/api.MapGranule + i; g < int64(len(d.alloc)) && d.alloc[g] {
			bits[i/8] |= 1 << (i % 8)
		}
	}
	d.mu.Unlock()
	done(nil)
}

func (d *Disk) finish(done func(error), err error) {
	d.Pending.Add(-1)
	done(err)
}

// Bytes returns a copy of the n bytes at off.
func (d *Disk) Bytes(off, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]byte(nil), d.data[off:off+n]...)
}

// Put copies p to the disk at off, behind the backend's back.
func (d *Disk) Put(off int, p []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.data[off:off+len(p)], p)
}

// Grow makes the disk n bytes larger (zeroes), as a volume resize does.
func (d *Disk) Grow(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.data = append(d.data, make([]byte, n)...)
}

// WaitSubmitted waits (up to a minute) until the disk got at least n
// requests.
func (d *Disk) WaitSubmitted(t testing.TB, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for d.Submitted.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("requests submitted to the backend: %d of %d after a minute", d.Submitted.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Disks is a frontend.Opener over a fixed set of Disks: Open returns the
// same Disk for a name every time.
type Disks map[string]*Disk

// Open returns the named disk, or ErrNoSuchExport.
func (ds Disks) Open(_ context.Context, name string) (frontend.Backend, error) {
	d, ok := ds[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", frontend.ErrNoSuchExport, name)
	}
	d.Opens.Add(1)
	return d, nil
}

// Stat describes the named disk without counting an open.
func (ds Disks) Stat(_ context.Context, name string) (frontend.Info, error) {
	d, ok := ds[name]
	if !ok {
		return frontend.Info{}, fmt.Errorf("%w: %q", frontend.ErrNoSuchExport, name)
	}
	return d.Info(), nil
}

// List returns the names, sorted.
func (ds Disks) List(context.Context) ([]string, error) {
	names := make([]string, 0, len(ds))
	for n := range ds {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// Classify leaves errors as they are: tests inject classified ones.
func (ds Disks) Classify(err error) error { return err }

// Exports is the export lifecycle over ds, logging nowhere.
func (ds Disks) Exports() *frontend.Exports {
	return frontend.NewExports(frontend.ExportsConfig{Opener: ds, Logger: QuietLogger()})
}

// QuietLogger discards what it is given.
func QuietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
