package scrub

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/testutil"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// fakeReplica is one chunkserver's replica of one copyset, answering
// OpChecksum over a real transport.Server.
type fakeReplica struct {
	id   uint64
	addr string

	mu       sync.Mutex
	sums     map[chunkKey]uint32
	status   api.Status
	requests int
	// before runs (under mu) before each answer, with the request number from 1:
	// it lets a test apply writes between rounds.
	before func(f *fakeReplica, n int)
	asked  [][2]uint32 // (pool, copyset) of every request
}

func (f *fakeReplica) ServeFrame(rw transport.ReplyWriter, h api.Header, _ []byte) {
	if h.Op != api.OpChecksum {
		h.Status = api.StatusBadRequest
		rw.Reply(h, nil, nil)
		return
	}
	f.mu.Lock()
	f.requests++
	f.asked = append(f.asked, [2]uint32{uint32(h.Volume), h.Copyset})
	if f.before != nil {
		f.before(f, f.requests)
	}
	h.Status = f.status
	var payload []byte
	if h.Status == api.StatusOK {
		payload = encodeSums(f.sums)
	}
	f.mu.Unlock()
	rw.Reply(h, payload, nil)
}

// set changes a chunk; callers hold mu (before) or use with.
func (f *fakeReplica) set(vol, idx uint64, crc uint32) { f.sums[chunkKey{vol, idx}] = crc }

// with runs fn under mu: the test goroutine and the server's share f.
func (f *fakeReplica) with(fn func(f *fakeReplica)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeReplica) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

func (f *fakeReplica) member() Member { return Member{ID: f.id, Addr: f.addr} }

// encodeSums is the OpChecksum reply format (internal/chunkserver doc.go).
func encodeSums(m map[chunkKey]uint32) []byte {
	keys := make([]chunkKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b chunkKey) int {
		if a.volume != b.volume {
			return int(a.volume) - int(b.volume)
		}
		return int(a.index) - int(b.index)
	})
	b := binary.BigEndian.AppendUint32(nil, uint32(len(keys)))
	for _, k := range keys {
		b = binary.BigEndian.AppendUint64(b, k.volume)
		b = binary.BigEndian.AppendUint64(b, k.index)
		b = binary.BigEndian.AppendUint32(b, m[k])
	}
	return b
}

// newReplicas starts n fake replicas (ids 1..n) holding the same chunks.
func newReplicas(t *testing.T, n int, chunks map[chunkKey]uint32) []*fakeReplica {
	t.Helper()
	var out []*fakeReplica
	for i := range n {
		f := &fakeReplica{id: uint64(i + 1), sums: map[chunkKey]uint32{}}
		for k, v := range chunks {
			f.sums[k] = v
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := transport.NewServer(transport.ServerConfig{}, f)
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		f.addr = ln.Addr().String()
		out = append(out, f)
	}
	return out
}

func target(rs []*fakeReplica) Target {
	t := Target{Pool: 2, Copyset: 5, ChunkSize: 1 << 20}
	for _, r := range rs {
		t.Members = append(t.Members, r.member())
	}
	return t
}

func someChunks(n int) map[chunkKey]uint32 {
	m := map[chunkKey]uint32{}
	for i := range n {
		m[chunkKey{7, uint64(i)}] = 0x1000 + uint32(i)
	}
	return m
}

func fastChecker(t *testing.T, cfg Config) *Checker {
	if cfg.RecheckDelay == 0 {
		cfg.RecheckDelay = 5 * time.Millisecond
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	c := NewChecker(cfg)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestCheckClean(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(10))
	rep := fastChecker(t, Config{}).Check(context.Background(), target(rs))
	if err := rep.Err(); err != nil {
		t.Fatalf("clean copyset: %v (%+v)", err, rep)
	}
	if rep.Chunks != 10 || rep.Rounds != 1 || rep.Compared != 3 || rep.Bytes != 3*10<<20 {
		t.Fatalf("report %+v: want 10 chunks, 1 round, 3 compared, 30 MiB", rep)
	}
	for _, r := range rs {
		r.with(func(f *fakeReplica) {
			if !slices.Equal(f.asked, [][2]uint32{{2, 5}}) {
				t.Fatalf("replica %d asked for %v, want pool 2 copyset 5 once", f.id, f.asked)
			}
		})
	}
}

func TestCheckPersistentDifference(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(10))
	rs[1].with(func(f *fakeReplica) {
		f.set(7, 3, 0xbad) // a corrupted chunk on member 2
		f.set(9, 0, 0xdef) // member 1 has one content of volume 9's chunk, 2 another, 3 none: no majority
	})
	rs[2].with(func(f *fakeReplica) { delete(f.sums, chunkKey{7, 6}) }) // member 3 lost a chunk (reads as zeros)
	rs[0].with(func(f *fakeReplica) { f.set(9, 0, 0xabc) })
	rep := fastChecker(t, Config{}).Check(context.Background(), target(rs))
	if !errors.Is(rep.Err(), ErrReplicasDiffer) {
		t.Fatalf("Err = %v, want ErrReplicasDiffer", rep.Err())
	}
	if rep.Rounds != 1+DefaultRechecks || len(rep.Unsettled) != 0 {
		t.Fatalf("rounds %d unsettled %v: want %d rounds, nothing unsettled", rep.Rounds, rep.Unsettled, 1+DefaultRechecks)
	}
	type got struct {
		vol, idx uint64
		differ   []uint64
	}
	var g []got
	for _, d := range rep.Mismatches {
		if d.Pool != 2 || d.Copyset != 5 || len(d.Replicas) != 3 {
			t.Fatalf("difference %+v: wrong ids or replica count", d)
		}
		g = append(g, got{d.Volume, d.Index, d.Differ})
	}
	want := []got{{7, 3, []uint64{2}}, {7, 6, []uint64{3}}, {9, 0, []uint64{1, 2, 3}}}
	if len(g) != len(want) {
		t.Fatalf("mismatches %+v, want %+v", g, want)
	}
	for i := range want {
		if g[i].vol != want[i].vol || g[i].idx != want[i].idx || !slices.Equal(g[i].differ, want[i].differ) {
			t.Fatalf("mismatch %d = %+v, want %+v", i, g[i], want[i])
		}
	}
	d := rep.Mismatches[0]
	if d.Replicas[1] != (ReplicaCRC{Member: 2, CRC32C: 0xbad}) || d.Replicas[0].CRC32C != 0x1003 {
		t.Fatalf("replica CRCs %+v", d.Replicas)
	}
	if z := rep.Mismatches[1].Replicas[2]; !z.Zero || FormatReplica(z) != "3=zeros" {
		t.Fatalf("lost chunk shown as %+v (%s), want zeros", z, FormatReplica(z))
	}
	if s := FormatReplica(d.Replicas[1]); s != "2=0x00000bad" {
		t.Fatalf("FormatReplica = %q", s)
	}
}

// A follower that applies a write a moment after the leader differs in the
// first round only: that is no mismatch.
func TestCheckTransientDifference(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(4))
	rs[0].with(func(f *fakeReplica) { f.set(7, 2, 0x2222) }) // the leader applied a write...
	rs[1].with(func(f *fakeReplica) { f.set(7, 2, 0x2222) })
	rs[2].with(func(f *fakeReplica) {
		f.before = func(f *fakeReplica, n int) { // ...the third member applies it after answering once
			if n == 2 {
				f.set(7, 2, 0x2222)
			}
		}
	})
	rep := fastChecker(t, Config{}).Check(context.Background(), target(rs))
	if err := rep.Err(); err != nil {
		t.Fatalf("transient difference reported: %v (%+v)", err, rep)
	}
	if rep.Rounds != 2 {
		t.Fatalf("rounds = %d, want 2 (one re-check cleared it)", rep.Rounds)
	}
}

// A chunk under constant writes that a follower trails differs in every round
// but changes between rounds: unsettled, not a mismatch.
func TestCheckBusyChunkIsUnsettled(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(4))
	for _, r := range rs {
		r.with(func(f *fakeReplica) {
			f.before = func(f *fakeReplica, n int) {
				v := uint32(n) // every round a new write; member 3 is one write behind
				if f.id == 3 {
					v--
				}
				f.set(7, 1, 0x5000+v)
			}
		})
	}
	rep := fastChecker(t, Config{}).Check(context.Background(), target(rs))
	if !errors.Is(rep.Err(), ErrIncomplete) || len(rep.Mismatches) != 0 || len(rep.Unsettled) != 1 {
		t.Fatalf("busy chunk: Err %v mismatches %v unsettled %v; want one unsettled", rep.Err(), rep.Mismatches, rep.Unsettled)
	}
	if u := rep.Unsettled[0]; u.Volume != 7 || u.Index != 1 || !slices.Equal(u.Differ, []uint64{3}) {
		t.Fatalf("unsettled %+v", u)
	}
	// The same, with one quiet last round: the difference stood still, so it counts.
	for _, r := range rs {
		r.with(func(f *fakeReplica) { f.before = nil })
	}
	rs[2].with(func(f *fakeReplica) { f.set(7, 1, 0x4fff) })
	rep = fastChecker(t, Config{}).Check(context.Background(), target(rs))
	if len(rep.Mismatches) != 1 {
		t.Fatalf("quiet difference: %+v", rep)
	}
}

func TestCheckRechecksDisabled(t *testing.T) {
	rs := newReplicas(t, 2, someChunks(3))
	rs[1].with(func(f *fakeReplica) { f.set(7, 0, 1) })
	rep := fastChecker(t, Config{Rechecks: -1}).Check(context.Background(), target(rs))
	if rep.Rounds != 1 || len(rep.Mismatches) != 1 || !slices.Equal(rep.Mismatches[0].Differ, []uint64{1, 2}) {
		t.Fatalf("no re-checks, two replicas: %+v", rep)
	}
}

func TestCheckUnreachableMember(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(5))
	rs[1].with(func(f *fakeReplica) { f.status = api.StatusNoSuchCopyset })
	tg := target(rs)
	// A fourth member whose address refuses connections.
	dead := testutil.FreeAddr(t) // nobody listens there
	tg.Members = append(tg.Members, Member{ID: 4, Addr: dead}, Member{ID: 5})
	rep := fastChecker(t, Config{}).Check(context.Background(), tg)
	if !errors.Is(rep.Err(), ErrIncomplete) {
		t.Fatalf("Err = %v, want ErrIncomplete", rep.Err())
	}
	var ids []uint64
	for _, u := range rep.Unreachable {
		ids = append(ids, u.Member)
	}
	if !slices.Equal(ids, []uint64{2, 4, 5}) || !strings.Contains(rep.Unreachable[0].Err, "NO_SUCH_COPYSET") {
		t.Fatalf("unreachable %+v, want members 2 (NO_SUCH_COPYSET), 4, 5", rep.Unreachable)
	}
	if rep.Compared != 2 || rep.Chunks != 5 || len(rep.Mismatches) != 0 {
		t.Fatalf("the two live replicas were not compared: %+v", rep)
	}

	// Only one replica answers: nothing compared.
	rs[2].with(func(f *fakeReplica) { f.status = api.StatusIOError })
	rep = fastChecker(t, Config{}).Check(context.Background(), tg)
	if rep.Chunks != 0 || rep.Compared != 1 || len(rep.Unreachable) != 4 {
		t.Fatalf("one live replica: %+v", rep)
	}
}

// A replica that answers BUSY (it bounds the checksum requests it serves at
// once) is asked again, not reported unreachable: `basalt check` against a
// real cluster failed so when its requests met the chunkserver's bound.
func TestCheckBusyReplicaAskedAgain(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(5))
	rs[1].with(func(f *fakeReplica) {
		f.before = func(f *fakeReplica, n int) {
			f.status = api.StatusOK
			if n <= 2 {
				f.status = api.StatusBusy
			}
		}
	})
	rep := fastChecker(t, Config{}).Check(context.Background(), target(rs))
	if rep.Err() != nil || len(rep.Unreachable) != 0 || rep.Compared != 3 || rep.Chunks != 5 {
		t.Fatalf("%+v (unreachable %+v): want all three replicas compared", rep, rep.Unreachable)
	}
	if n := rs[1].count(); n != 3 {
		t.Fatalf("the busy replica was asked %d times, want 3 (two BUSY answers, then one)", n)
	}
}

// A replica that becomes unreachable during the re-checks leaves the pending
// difference unjudged.
func TestCheckMemberLostDuringRecheck(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(2))
	rs[2].with(func(f *fakeReplica) { f.set(7, 0, 0xbad) })
	rs[0].with(func(f *fakeReplica) {
		f.before = func(f *fakeReplica, n int) {
			if n == 2 {
				f.status = api.StatusIOError
			}
		}
	})
	rep := fastChecker(t, Config{}).Check(context.Background(), target(rs))
	if len(rep.Mismatches) != 0 || len(rep.Unsettled) != 1 || len(rep.Unreachable) != 1 || rep.Unreachable[0].Member != 1 {
		t.Fatalf("%+v: want the difference unsettled and member 1 unreachable", rep)
	}
}

// A copyset with more chunks than the first reply buffer holds.
func TestCheckLargeReply(t *testing.T) {
	rs := newReplicas(t, 2, someChunks(5000))
	c := fastChecker(t, Config{})
	for range 2 { // the second check starts with the remembered size
		rep := c.Check(context.Background(), target(rs))
		if rep.Err() != nil || rep.Chunks != 5000 {
			t.Fatalf("%+v", rep.Unreachable)
		}
	}
	if n := rs[0].count(); n != 3 {
		t.Fatalf("requests = %d, want 3 (one retried with a larger buffer)", n)
	}
}

func TestCheckRateLimited(t *testing.T) {
	rs := newReplicas(t, 3, someChunks(4))
	tg := target(rs)
	tg.ChunkSize = 64 << 10 // a round reads 3 × 4 × 64 KiB = 768 KiB
	// 2 MiB/s with a 256 KiB bucket: four checks read 3 MiB, at least
	// (3 MiB - 256 KiB) / 2 MiB/s ≈ 1.37 s.
	c := fastChecker(t, Config{Limiter: NewLimiter(2<<20, 256<<10)})
	start := time.Now()
	var bytes int64
	for range 4 {
		rep := c.Check(context.Background(), tg)
		bytes += rep.Bytes
	}
	el := time.Since(start)
	if bytes != 3<<20 {
		t.Fatalf("bytes = %d, want 3 MiB", bytes)
	}
	// The limit is a lower bound; the upper one only catches a limiter far
	// slower than asked (generous: a loaded machine is slow too).
	if el < 1300*time.Millisecond || el > time.Minute {
		t.Fatalf("4 checks took %v, want about 1.4 s at 2 MiB/s", el)
	}
}

// fakeClock drives a Limiter without sleeping.
type fakeClock struct {
	now   time.Time
	slept []time.Duration
}

func newFakeLimiter(rate, burst int64) (*Limiter, *fakeClock) {
	fc := &fakeClock{now: time.Unix(1000, 0)}
	l := NewLimiter(rate, burst)
	l.now = func() time.Time { return fc.now }
	l.last = fc.now
	l.sleep = func(ctx context.Context, d time.Duration) error {
		fc.slept = append(fc.slept, d)
		fc.now = fc.now.Add(d)
		return nil
	}
	return l, fc
}

func TestLimiter(t *testing.T) {
	l, fc := newFakeLimiter(1000, 500) // 1000 B/s, bucket 500 B, starts full
	ctx := context.Background()
	if err := l.Wait(ctx, 500); err != nil || len(fc.slept) != 0 {
		t.Fatalf("a full bucket made Wait sleep: %v %v", err, fc.slept)
	}
	_ = l.Wait(ctx, 250)
	if !slices.Equal(fc.slept, []time.Duration{250 * time.Millisecond}) {
		t.Fatalf("slept %v, want 250ms", fc.slept)
	}
	// Debt: a charge after the fact delays the next Wait.
	l.Charge(1000)
	_ = l.Wait(ctx, 0)
	if fc.slept[1] != time.Second {
		t.Fatalf("slept %v after a 1000 B charge, want 1s", fc.slept)
	}
	// An idle stretch refills to the burst only.
	fc.now = fc.now.Add(time.Hour)
	_ = l.Wait(ctx, 600)
	if fc.slept[2] != 100*time.Millisecond {
		t.Fatalf("slept %v, want 100ms (burst 500 B)", fc.slept)
	}
	// A refund never makes the bucket larger than its burst.
	l.Charge(-1 << 20)
	_ = l.Wait(ctx, 1000)
	if fc.slept[3] != 500*time.Millisecond {
		t.Fatalf("slept %v, want 500ms", fc.slept)
	}
	var none *Limiter
	if err := none.Wait(ctx, 1<<40); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := NewLimiter(1, 1).Wait(cctx, 100); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a cancelled ctx = %v", err)
	}
}

func TestScrubberFindsMismatch(t *testing.T) {
	a := newReplicas(t, 3, someChunks(3))
	b := newReplicas(t, 3, someChunks(2))
	b[0].with(func(f *fakeReplica) { f.set(7, 1, 0xbad) })
	ta, tb := target(a), target(b)
	tb.Copyset = 9
	// A member with no address in both: warned about once per pass.
	ta.Members = append(ta.Members, Member{ID: 4})
	tb.Members = append(tb.Members, Member{ID: 4})
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	s := NewScrubber(ScrubberConfig{
		Targets:      func() []Target { return []Target{tb, ta} },
		Interval:     time.Millisecond,
		PassInterval: 20 * time.Millisecond,
		BytesPerSec:  1 << 40,
		Check:        Config{RecheckDelay: time.Millisecond, Rechecks: 2},
		Logger:       log,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for s.Stats().Passes < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	st := s.Stats()
	if st.Passes < 2 || st.CopysetsScrubbed < 4 || st.Mismatches < 2 || st.Mismatches != st.CopysetsScrubbed/2 {
		t.Fatalf("stats %+v: want >= 2 passes of 2 copysets, one mismatch per pass", st)
	}
	if st.ChunksCompared < 10 || st.BytesChecksummed == 0 {
		t.Fatalf("stats %+v", st)
	}
	// Copysets are walked in id order: copyset 5 before 9.
	a[0].with(func(f *fakeReplica) {
		if !slices.Equal(f.asked[:1], [][2]uint32{{2, 5}}) {
			t.Fatalf("asked %v", f.asked)
		}
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector("basalt_chunkserver_"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var exported float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "basalt_chunkserver_scrub_mismatches_total" {
			exported = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if len(mfs) != 7 || exported != float64(st.Mismatches) {
		t.Fatalf("metrics: %d families, mismatches %v; want 7 and %d", len(mfs), exported, st.Mismatches)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, `level=WARN msg="replicas differ" component=scrub pool=2 copyset=9 group=8589934601 volume=7 chunk=1 differ=[1]`) {
		t.Fatalf("no Warn with ids in the log:\n%s", out)
	}
	if n := strings.Count(out, `level=WARN msg="replica could not be scrubbed"`); n == 0 || uint64(2*n) > st.CopysetsScrubbed+1 {
		t.Fatalf("%d Warns about the unreachable member over %d copyset checks: want one per pass", n, st.CopysetsScrubbed)
	}
}

// A Scrubber that finds nothing to scrub (no leader yet) looks again after
// Interval, not after PassInterval.
func TestScrubberWaitsForTargets(t *testing.T) {
	rs := newReplicas(t, 2, someChunks(1))
	var calls sync.Mutex
	n := 0
	s := NewScrubber(ScrubberConfig{
		Targets: func() []Target {
			calls.Lock()
			defer calls.Unlock()
			if n++; n < 3 {
				return nil
			}
			return []Target{target(rs)}
		},
		Interval:     5 * time.Millisecond,
		PassInterval: time.Hour,
		Logger:       slog.New(slog.DiscardHandler),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for s.Stats().Passes < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if st := s.Stats(); st.Passes != 1 || st.CopysetsScrubbed != 1 || st.ChunksCompared != 1 {
		t.Fatalf("stats %+v: want one pass over the target that appeared", st)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestNextTarget(t *testing.T) {
	ts := []Target{{Pool: 2, Copyset: 1}, {Pool: 1, Copyset: 7}, {Pool: 1, Copyset: 3}}
	var order []uint32
	for from := uint64(0); ; {
		tg, ok := nextTarget(ts, from)
		if !ok {
			break
		}
		order = append(order, tg.Pool*100+tg.Copyset)
		from = uint64(tg.Pool)<<32 | uint64(tg.Copyset) + 1
	}
	if !slices.Equal(order, []uint32{103, 107, 201}) {
		t.Fatalf("order %v", order)
	}
}

func TestLeaderTargets(t *testing.T) {
	addr := func(id uint64) string { return "cs" + string(rune('0'+id)) }
	size := func(pool uint32) uint64 {
		if pool == 9 {
			return 0
		}
		return 4 << 20
	}
	g := func(pool, cs uint32) uint64 { return uint64(pool)<<32 | uint64(cs) }
	good := raftstore.GroupStatus{ID: g(1, 2), IsLeader: true, Healthy: true, Commit: 5000,
		Voters: []uint64{1, 2, 3}, Progress: map[uint64]uint64{1: 5000, 2: 4990, 3: 4500}}
	groups := []raftstore.GroupStatus{good}
	add := func(mod func(s *raftstore.GroupStatus)) {
		s := good
		s.Progress = map[uint64]uint64{1: 5000, 2: 4990, 3: 4500}
		mod(&s)
		groups = append(groups, s)
	}
	add(func(s *raftstore.GroupStatus) { s.ID = g(1, 1); s.IsLeader = false })                       // follower here
	add(func(s *raftstore.GroupStatus) { s.ID = g(1, 3); s.Healthy = false })                        // stopped by a disk error
	add(func(s *raftstore.GroupStatus) { s.ID = g(1, 4); s.Learners = []uint64{4} })                 // move in flight
	add(func(s *raftstore.GroupStatus) { s.ID = g(1, 5); s.Progress[3] = 3000 })                     // follower far behind
	add(func(s *raftstore.GroupStatus) { s.ID = g(9, 1) })                                           // pool unknown
	add(func(s *raftstore.GroupStatus) { s.ID = g(1, 0); s.Voters = []uint64{1}; s.Progress = nil }) // one replica
	add(func(s *raftstore.GroupStatus) { s.ID = g(0, 7) })                                           // also good
	ts := LeaderTargets(groups, addr, size)
	if len(ts) != 2 || ts[0].Pool != 0 || ts[0].Copyset != 7 || ts[1].Pool != 1 || ts[1].Copyset != 2 {
		t.Fatalf("targets %+v", ts)
	}
	if ts[1].ChunkSize != 4<<20 || !slices.Equal(ts[1].Members, []Member{{1, "cs1"}, {2, "cs2"}, {3, "cs3"}}) {
		t.Fatalf("target %+v", ts[1])
	}
}
