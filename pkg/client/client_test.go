package client

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestSplitPieces(t *testing.T) {
	v := &Volume{id: tVolume, chunkSize: tChunk, maxPiece: tChunk, csCount: tCS}
	o := &ioOp{v: v}
	buf := make([]byte, 3*tChunk)
	ps := v.split(o, buf, tChunk-100, 2*tChunk+200)
	want := []struct{ off, n int64 }{{tChunk - 100, 100}, {tChunk, tChunk}, {2 * tChunk, tChunk}, {3 * tChunk, 100}}
	if len(ps) != len(want) {
		t.Fatalf("%d pieces, want %d", len(ps), len(want))
	}
	pos := int64(0)
	for i := range ps {
		p := &ps[i]
		if p.off != want[i].off || p.n != want[i].n || int64(len(p.buf)) != p.n || &p.buf[0] != &buf[pos] {
			t.Fatalf("piece %d: off %d n %d len %d", i, p.off, p.n, len(p.buf))
		}
		pos += p.n
	}
	if ps := v.split(o, nil, 5, 10); len(ps) != 1 || ps[0].off != 5 || ps[0].n != 10 {
		t.Fatalf("small IO split: %+v", ps)
	}
}

// TestReadWriteAcrossChunks writes random data of random sizes at random offsets
// (most crossing chunk boundaries) and checks reads, and the fake's view: every
// frame within one chunk, to the right copyset, straight to the leader.
func TestReadWriteAcrossChunks(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	r := rand.New(rand.NewPCG(1, 1))
	model := make([]byte, tSize)
	for range 60 {
		n := 1 + r.IntN(3*tChunk)
		off := r.Int64N(tSize - int64(n))
		p := randBytes(r, n)
		if _, err := v.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
		got := make([]byte, n+r.IntN(1000))
		roff := min(off, tSize-int64(len(got)))
		if _, err := v.ReadAt(got, roff); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model[roff:roff+int64(len(got))]) {
			t.Fatalf("read at %d: mismatch", roff)
		}
	}
	if err := v.Trim(tChunk-10, 20); err != nil {
		t.Fatal(err)
	}
	if err := v.WriteZeroes(5*tChunk, tChunk+1); err != nil {
		t.Fatal(err)
	}
	clear(model[tChunk-10 : tChunk+10])
	clear(model[5*tChunk : 6*tChunk+1])
	got := make([]byte, tSize)
	if _, err := v.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("whole-volume read differs from the model")
	}
	if bad := c.violations(); len(bad) > 0 {
		t.Fatalf("client sent bad frames: %v", bad)
	}
	if c.notLeaders() != 0 {
		t.Fatalf("%d NOT_LEADER answers though the MDS hints were right", c.notLeaders())
	}
}

func TestOutOfRangeRefusedLocally(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	for _, tc := range []struct{ off, n int64 }{{tSize - 1, 2}, {tSize, 1}, {-1, 1}, {1 << 62, 1 << 62}} {
		if err := v.WriteZeroes(tc.off, tc.n); !errors.Is(err, api.ErrOutOfRange) {
			t.Fatalf("IO %d+%d: %v", tc.off, tc.n, err)
		}
	}
	if _, err := v.ReadAt(make([]byte, 10), tSize-5); !errors.Is(err, api.ErrOutOfRange) {
		t.Fatalf("read past end: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.frames) != 0 {
		t.Fatalf("frames were sent: %v", c.frames)
	}
}

// TestRedirectWithHint: the MDS hints a follower; the follower redirects; the
// leader is cached, so a second IO on the copyset goes straight there.
func TestRedirectWithHint(t *testing.T) {
	c := newFakeCluster(t)
	for cs := range uint32(tCS) {
		c.mds.hints[cs] = c.members[cs][1] // a follower
	}
	v := c.open(t, nil)
	p := []byte("hello")
	for range 2 {
		if _, err := v.WriteAt(p, 3*tChunk); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.notLeaders(); n != 1 {
		t.Fatalf("NOT_LEADER answers: %d, want 1 (then cached)", n)
	}
}

// TestNotLeaderNoHint: no hints anywhere; the client walks the members.
func TestNotLeaderNoHint(t *testing.T) {
	c := newFakeCluster(t)
	c.noHint = true
	for cs := range uint32(tCS) {
		c.mds.hints[cs] = 0
		c.leaders[cs] = c.members[cs][2]
	}
	v := c.open(t, nil)
	buf := make([]byte, 4*tChunk)
	if _, err := v.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if c.notLeaders() == 0 {
		t.Fatal("expected NOT_LEADER answers")
	}
}

// TestLeaderDown: the leader's connections die and it refuses new ones; another
// member has become leader (without the client being told).
func TestLeaderDown(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	if _, err := v.WriteAt([]byte("a"), 0); err != nil { // connections exist
		t.Fatal(err)
	}
	cs := uint32(0)
	for ; cs < tCS; cs++ {
		if c.leaders[cs] == 1 {
			break
		}
	}
	c.mu.Lock()
	for id := range uint32(tCS) {
		if c.leaders[id] == 1 {
			c.leaders[id] = c.members[id][1]
			if c.leaders[id] == 1 {
				c.leaders[id] = c.members[id][2]
			}
		}
	}
	c.mu.Unlock()
	c.servers[1].setDown(true)
	buf := make([]byte, tSize)
	r := rand.New(rand.NewPCG(2, 2))
	copy(buf, randBytes(r, tSize))
	if _, err := v.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, tSize)
	if _, err := v.ReadAt(got, 0); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read back after failover: %v", err)
	}
}

// TestDroppedConnection: a chunkserver drops the connection on some requests; the
// client redials and retries.
func TestDroppedConnection(t *testing.T) {
	c := newFakeCluster(t)
	var n int
	c.setHook(func(_ uint64, h api.Header) action {
		n++
		if n%3 == 1 {
			return drop
		}
		return serve
	})
	v := c.open(t, nil)
	r := rand.New(rand.NewPCG(3, 3))
	p := randBytes(r, 5*tChunk)
	if _, err := v.WriteAt(p, 100); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if _, err := v.ReadAt(got, 100); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read back: %v", err)
	}
}

func TestBusyBackoff(t *testing.T) {
	c := newFakeCluster(t)
	busyLeft := 5
	c.setHook(func(_ uint64, h api.Header) action {
		if busyLeft > 0 {
			busyLeft--
			return busy
		}
		return serve
	})
	v := c.open(t, nil)
	start := time.Now()
	if _, err := v.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	// Backoff 1,2,4,8,16 ms with jitter in [d/2, d]: at least ~15 ms in total.
	if el := time.Since(start); el < 15*time.Millisecond {
		t.Fatalf("5 BUSY answers retried within %v: no backoff", el)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if busyLeft != 0 {
		t.Fatalf("busy answers left: %d", busyLeft)
	}
}

// A chunkserver learns of a grown volume at its next heartbeat; until then it
// answers OUT_OF_RANGE for IO the client knows to be inside the volume. The
// client retries such IO like BUSY.
func TestStaleSizeRetried(t *testing.T) {
	c := newFakeCluster(t)
	stale := 3
	c.setHook(func(_ uint64, h api.Header) action {
		if stale > 0 {
			stale--
			return outOfRange
		}
		return serve
	})
	v := c.open(t, nil)
	if _, err := v.WriteAt([]byte("x"), 0); err != nil {
		t.Fatalf("write answered OUT_OF_RANGE by a stale chunkserver: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if stale != 0 {
		t.Fatalf("stale answers left: %d", stale)
	}
}

func TestFencedIsFinal(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	c.mu.Lock()
	c.minEpoch = 6 // a newer writer came
	c.mu.Unlock()
	_, err := v.WriteAt([]byte("stale"), 0)
	var ae *api.Error
	if !errors.Is(err, api.ErrFenced) || !errors.As(err, &ae) {
		t.Fatalf("write: %v", err)
	}
	c.mu.Lock()
	before := c.frames[api.OpRead]
	c.mu.Unlock()
	if _, err := v.ReadAt(make([]byte, 4), 0); !errors.Is(err, api.ErrFenced) {
		t.Fatalf("IO after fencing: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.frames[api.OpRead] != before {
		t.Fatal("a fenced volume still sent IO")
	}
}

func TestFinalStatuses(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	for _, st := range []api.Status{api.StatusIOError, api.StatusNoSpace, api.StatusNoSuchVolume,
		api.StatusReadOnly, api.StatusBadRequest, api.StatusStaleRequest} { // OUT_OF_RANGE: TestStaleSizeRetried
		disk := st == api.StatusIOError || st == api.StatusNoSpace
		c.mu.Lock()
		c.force, c.forceAll = st, api.StatusOK
		if disk {
			c.force, c.forceAll = api.StatusOK, st // final once every member answered it
		}
		before := c.frames[api.OpWrite]
		c.mu.Unlock()
		_, err := v.WriteAt([]byte("x"), 0)
		var ae *api.Error
		if !errors.Is(err, api.StatusError(st, 0)) || !errors.As(err, &ae) {
			t.Fatalf("status %v: got %v", st, err)
		}
		c.mu.Lock()
		sent := c.frames[api.OpWrite] - before
		c.mu.Unlock()
		want := 1
		if disk {
			want = 2 // a majority of the three members
		}
		if sent != want {
			t.Fatalf("status %v: %d attempts, want %d (final)", st, sent, want)
		}
	}
}

// TestDiskErrorTriesOtherMembers: the leader's disk fills (it answers
// NO_SPACE or IO_ERROR) and, a moment later, another member becomes leader;
// the client keeps trying the members and the write succeeds there. It is
// not final while some member has not answered with a disk error.
func TestDiskErrorTriesOtherMembers(t *testing.T) {
	for _, st := range []api.Status{api.StatusNoSpace, api.StatusIOError} {
		c := newFakeCluster(t)
		v := c.open(t, nil)
		cs := api.CopysetOf(tVolume, 0, tCS)
		c.mu.Lock()
		c.force = st
		c.mu.Unlock()
		time.AfterFunc(150*time.Millisecond, func() {
			c.mu.Lock()
			c.force = api.StatusOK
			for _, m := range c.members[cs] {
				if m != c.leaders[cs] {
					c.leaders[cs] = m
					break
				}
			}
			c.mu.Unlock()
		})
		if _, err := v.WriteAt([]byte("x"), 0); err != nil {
			t.Fatalf("status %v from the old leader: %v", st, err)
		}
	}
}

// TestDiskErrorMajority: two of three replicas stopped on full disks answer
// NO_SPACE and the leader (without a quorum) never answers: the write fails
// with NO_SPACE after one round, not after the whole OpTimeout.
func TestDiskErrorMajority(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, func(cfg *Config) { cfg.OpTimeout = 20 * time.Second })
	cs := api.CopysetOf(tVolume, 0, tCS)
	c.mu.Lock()
	leader := c.leaders[cs]
	c.mu.Unlock()
	c.setHook(func(server uint64, h api.Header) action {
		if h.Op != api.OpWrite {
			return serve
		}
		if server == leader {
			return ignore
		}
		return noSpace
	})
	start := time.Now()
	_, err := v.WriteAt([]byte("x"), 0)
	if !errors.Is(err, api.ErrNoSpace) {
		t.Fatalf("got %v, want NO_SPACE", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("NO_SPACE after %v: the client waited for its deadline (60 s)", took)
	}
}

// TestAttemptTimeout: the first member never answers; after IOTimeout the client
// tries the next one, which has become the leader.
func TestAttemptTimeout(t *testing.T) {
	c := newFakeCluster(t)
	cs := uint32(0)
	hung := c.members[cs][0]
	c.setHook(func(server uint64, h api.Header) action {
		if server == hung {
			return ignore
		}
		return serve
	})
	c.mu.Lock()
	for id := range uint32(tCS) {
		if c.leaders[id] == hung {
			c.leaders[id] = c.members[id][1]
			if c.leaders[id] == hung {
				c.leaders[id] = c.members[id][2]
			}
		}
	}
	c.mu.Unlock()
	v := c.open(t, func(cfg *Config) { cfg.IOTimeout = 50 * time.Millisecond })
	buf := make([]byte, tCS*tChunk)
	if _, err := v.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
}

// TestOpDeadline: nobody answers; the IO fails with ErrTimeout after OpTimeout.
func TestOpDeadline(t *testing.T) {
	c := newFakeCluster(t)
	c.setHook(func(uint64, api.Header) action { return ignore })
	v := c.open(t, func(cfg *Config) { cfg.IOTimeout = 30 * time.Millisecond; cfg.OpTimeout = 200 * time.Millisecond })
	start := time.Now()
	_, err := v.WriteAt([]byte("x"), 0)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, transport.ErrAborted) {
		t.Fatalf("write: %v", err)
	}
	// Not before OpTimeout; the upper bound only catches an IO that waits for
	// something else (generous for a loaded machine).
	if el := time.Since(start); el < 200*time.Millisecond || el > 30*time.Second {
		t.Fatalf("gave up after %v, OpTimeout 200ms", el)
	}
}

// TestStalledServersIOTimesOut: the chunkservers take requests but answer none
// and stop reading them (as one whose WAL hangs does once MaxInFlight requests
// wait), so the writes fill the socket and the connection's writer blocks
// mid-frame. Each IO still ends with ErrTimeout at about OpTimeout; none waits
// on the blocked write. (The attempt timeout used to leave a call the writer
// held in flight: these IOs never returned.)
func TestStalledServersIOTimesOut(t *testing.T) {
	c := newFakeCluster(t)
	c.setHook(func(uint64, api.Header) action { return stall })
	const opTimeout = 3 * time.Second
	v := c.open(t, func(cfg *Config) { cfg.IOTimeout = 300 * time.Millisecond; cfg.OpTimeout = opTimeout })
	// 32 MiB to one copyset: more than the socket buffers between a client and
	// a server hold.
	const n = 512
	buf := make([]byte, tChunk)
	errs := make(chan error, n)
	start := time.Now()
	for range n {
		v.Submit(api.OpWrite, buf, 0, tChunk, func(err error) { errs <- err })
	}
	hang := time.After(opTimeout + time.Minute) // a hang, not slowness
	for i := range n {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("write: %v, want ErrTimeout", err)
			}
		case <-hang:
			t.Errorf("%d of %d writes still in flight %v after they were submitted (OpTimeout %v)", n-i, n, time.Since(start), opTimeout)
			for _, s := range c.servers {
				s.setDown(true) // end them, so that the volume closes
			}
			return
		}
	}
	t.Logf("%d writes failed with ErrTimeout %v after they were submitted (OpTimeout %v)", n, time.Since(start), opTimeout)
}

// TestRefreshCopysets: the copyset moved to other members since Open; the old
// members answer NO_SUCH_COPYSET; the client refreshes from the MDS.
func TestRefreshCopysets(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	s5 := c.addServer(5)
	s6 := c.addServer(6)
	_ = s6
	c.mu.Lock()
	for id := range uint32(tCS) {
		c.members[id] = []uint64{s5.id, 6}
		c.leaders[id] = 6
	}
	c.mu.Unlock()
	r := rand.New(rand.NewPCG(4, 4))
	p := randBytes(r, 3*tChunk)
	if _, err := v.WriteAt(p, tChunk/2); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if _, err := v.ReadAt(got, tChunk/2); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read back: %v", err)
	}
	c.mds.mu.Lock()
	defer c.mds.mu.Unlock()
	if c.mds.getCopysets == 0 {
		t.Fatal("no refresh from the MDS")
	}
}

// TestLeaseRenewedAndExpires: renewals keep a session usable past its lease;
// when they fail for a whole lease, IO stops with ErrLeaseExpired, and stays
// stopped when the MDS answers again. The lease is seconds long and every
// step is polled, so a renewal that runs late on a loaded machine cannot
// make it lapse.
func TestLeaseRenewedAndExpires(t *testing.T) {
	c := newFakeCluster(t)
	const lease = 3 * time.Second
	c.mds.leaseMs = lease.Milliseconds()
	renewals := func() int {
		c.mds.mu.Lock()
		defer c.mds.mu.Unlock()
		return c.mds.renewals
	}
	v := c.open(t, nil)
	// Three renewals at lease/3 each: the first lease is over by now.
	pollUntil(t, 60*time.Second, "three lease renewals", func() error {
		if n := renewals(); n < 3 {
			return fmt.Errorf("%d renewals", n)
		}
		return nil
	})
	if _, err := v.WriteAt([]byte("x"), 0); err != nil {
		t.Fatalf("IO with a renewed lease: %v", err)
	}
	c.mds.mu.Lock()
	c.mds.renewErr = status.Error(codes.Unavailable, "mds down")
	c.mds.mu.Unlock()
	pollUntil(t, 60*time.Second, "IO stopped by the lapsed lease", func() error {
		_, err := v.WriteAt([]byte("x"), 0)
		switch {
		case err == nil:
			return errors.New("IO still accepted")
		case !errors.Is(err, ErrLeaseExpired):
			t.Fatalf("IO while renewals fail: %v, want success or ErrLeaseExpired", err)
		}
		return nil
	})
	c.mds.mu.Lock()
	c.mds.renewErr = nil
	c.mds.mu.Unlock()
	// Give a (wrongly) surviving renewer time to renew again.
	time.Sleep(lease / 3)
	if _, err := v.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("a lapsed volume must stay stopped: %v", err)
	}
}

// pollUntil calls cond until it returns nil, failing the test after within.
func pollUntil(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSessionSuperseded(t *testing.T) {
	c := newFakeCluster(t)
	// The first renewal (after lease/3 = 3 s) is answered "superseded"; IO must
	// stop with ErrFenced then, not with ErrLeaseExpired when the 9 s lease
	// lapses. Polled, not slept: on a loaded machine the renewal may run late.
	c.mds.leaseMs = 9000
	c.mds.renewErr = status.Error(codes.FailedPrecondition, "mds: session superseded by a newer writer")
	v := c.open(t, nil)
	pollUntil(t, 60*time.Second, "IO stopped after a renewal answered superseded", func() error {
		_, err := v.WriteAt([]byte("x"), 0)
		if err == nil {
			return errors.New("IO still accepted")
		}
		if !errors.Is(err, api.ErrFenced) {
			t.Fatalf("IO after supersession: %v, want ErrFenced", err)
		}
		return nil
	})
}

func TestReadOnly(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, func(cfg *Config) { cfg.ReadOnly = true })
	if v.Epoch() != 0 {
		t.Fatalf("read-only epoch %d", v.Epoch())
	}
	if _, err := v.WriteAt([]byte("x"), 0); !errors.Is(err, api.ErrReadOnly) {
		t.Fatalf("write on read-only: %v", err)
	}
	if _, err := v.ReadAt(make([]byte, 10), 0); err != nil {
		t.Fatal(err)
	}
}

// TestFlushWaitsForEarlierWrites: writes are slow; Flush returns only after them.
func TestFlushWaitsForEarlierWrites(t *testing.T) {
	c := newFakeCluster(t)
	c.delay = 50 * time.Millisecond
	c.setHook(func(_ uint64, h api.Header) action {
		if h.Op == api.OpWrite {
			return delayed
		}
		return serve
	})
	v := c.open(t, nil)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		v.Submit(api.OpWrite, []byte("data"), int64(i)*tChunk, 4, func(err error) {
			mu.Lock()
			order = append(order, "write")
			mu.Unlock()
			wg.Done()
		})
	}
	if err := v.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	order = append(order, "flush")
	got := append([]string(nil), order...)
	mu.Unlock()
	wg.Wait()
	if len(got) != 5 || got[4] != "flush" {
		t.Fatalf("flush returned before the earlier writes: %v", got)
	}
	if err := v.Flush(); err != nil { // nothing in flight: at once
		t.Fatal(err)
	}
}

// TestConcurrentIO: many goroutines, each on its own region, async and sync.
func TestConcurrentIO(t *testing.T) {
	c := newFakeCluster(t)
	var n int
	c.setHook(func(uint64, api.Header) action {
		n++
		switch n % 50 {
		case 7:
			return busy
		case 23:
			return drop
		}
		return serve
	})
	v := c.open(t, func(cfg *Config) { cfg.IOTimeout = 500 * time.Millisecond })
	const workers = 8
	region := int64(tSize / workers)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 5))
			base := int64(w) * region
			for range 20 {
				n := 1 + r.Int64N(region/2)
				off := base + r.Int64N(region-n)
				p := randBytes(r, int(n))
				if _, err := v.WriteAt(p, off); err != nil {
					errs <- err
					return
				}
				got := make([]byte, n)
				if _, err := v.ReadAt(got, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, p) {
					errs <- errors.New("read back differs")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	if _, err := v.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := v.WriteAt([]byte("x"), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("IO after Close: %v", err)
	}
	if c.mds.closed != 1 {
		t.Fatalf("CloseSession calls: %d", c.mds.closed)
	}
}

// TestPiecesInParallel: an IO over 4 chunks sends its 4 pieces at once: the
// servers hold every answer until all 4 pieces have arrived, which a client
// that waits for one piece before sending the next never gets to.
func TestPiecesInParallel(t *testing.T) {
	c := newFakeCluster(t)
	c.gate = make(chan struct{})
	var mu sync.Mutex
	arrived := map[uint64]bool{} // offsets of the pieces the servers hold
	c.setHook(func(_ uint64, h api.Header) action {
		if h.Op != api.OpWrite {
			return serve
		}
		mu.Lock()
		arrived[h.Offset] = true
		mu.Unlock()
		return gated
	})
	// No attempt times out while the answers are held.
	v := c.open(t, func(cfg *Config) { cfg.IOTimeout, cfg.OpTimeout = time.Hour, time.Hour })
	errc := make(chan error, 1)
	go func() {
		_, err := v.WriteAt(make([]byte, 4*tChunk), 0)
		errc <- err
	}()
	pollUntil(t, 60*time.Second, "all 4 pieces at the servers before any answer", func() error {
		mu.Lock()
		n := len(arrived)
		mu.Unlock()
		if n < 4 {
			return fmt.Errorf("%d of 4 pieces arrived: not parallel", n)
		}
		return nil
	})
	close(c.gate)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestRedirectToUnknownServer: the leader moved to a chunkserver added after Open;
// the redirect names an id the client has no address for, so it refreshes first.
func TestRedirectToUnknownServer(t *testing.T) {
	c := newFakeCluster(t)
	v := c.open(t, nil)
	s5 := c.addServer(5)
	c.mu.Lock()
	for id := range uint32(tCS) {
		c.members[id] = append(c.members[id], s5.id)
		c.leaders[id] = s5.id
	}
	c.mu.Unlock()
	if _, err := v.WriteAt([]byte("moved"), 7); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := v.ReadAt(got, 7); err != nil || string(got) != "moved" {
		t.Fatalf("read back %q: %v", got, err)
	}
}

// TestCloseWithIOInFlight: Close fails IO that would otherwise wait for a hung
// server, and returns promptly.
func TestCloseWithIOInFlight(t *testing.T) {
	c := newFakeCluster(t)
	c.setHook(func(uint64, api.Header) action { return ignore })
	// Only Close can end the IO: its attempts would wait for an hour.
	v := c.open(t, func(cfg *Config) { cfg.IOTimeout, cfg.OpTimeout = time.Hour, time.Hour })
	errc := make(chan error, 1)
	v.Submit(api.OpWrite, []byte("x"), 0, 1, func(err error) { errc <- err })
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("in-flight IO: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the in-flight IO still waits a minute after Close")
	}
	if el := time.Since(start); el > time.Minute {
		t.Fatalf("Close took %v: it waited for the hung server", el)
	}
}
