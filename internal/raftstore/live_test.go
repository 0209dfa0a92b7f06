package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore/memlog"
)

// liveNet connects hosts running their own workers and tickers: each host has an
// inbound queue drained by one goroutine, like a real transport's reader.
type liveNet struct {
	mu    sync.Mutex
	hosts map[uint64]*Host
	inbox map[uint64]chan Message
	down  map[uint64]bool // isolated nodes
	// busy: nodes whose snapshot receives are refused ErrPeerBusy;
	// busyRefused counts those refusals.
	busy        map[uint64]bool
	busyRefused atomic.Int64
	wg          sync.WaitGroup
	stop        chan struct{}
}

func newLiveNet() *liveNet {
	return &liveNet{hosts: map[uint64]*Host{}, inbox: map[uint64]chan Message{}, down: map[uint64]bool{},
		busy: map[uint64]bool{}, stop: make(chan struct{})}
}

func (n *liveNet) add(id uint64, h *Host) {
	ch := make(chan Message, 4096)
	n.mu.Lock()
	n.hosts[id], n.inbox[id] = h, ch
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			select {
			case <-n.stop:
				return
			case m := <-ch:
				h.Step([]Message{m})
			}
		}
	}()
}

func (n *liveNet) isolate(id uint64, on bool) {
	n.mu.Lock()
	n.down[id] = on
	n.mu.Unlock()
}

type liveTransport struct {
	n    *liveNet
	from uint64
}

func (t liveTransport) Send(msgs []Message) {
	n := t.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range msgs {
		to := m.Msg.GetTo()
		if n.down[t.from] || n.down[to] {
			continue
		}
		select {
		case n.inbox[to] <- Message{Group: m.Group, Msg: proto.Clone(m.Msg).(*raftpb.Message)}:
		default: // full: dropped, as a real transport may
		}
	}
}

func (t liveTransport) SendSnapshot(m Message, write func(io.Writer) error) error {
	n := t.n
	to := m.Msg.GetTo()
	n.mu.Lock()
	h, down, busy := n.hosts[to], n.down[t.from] || n.down[to], n.busy[to]
	n.mu.Unlock()
	if h == nil || down {
		return errors.New("live: unreachable")
	}
	if busy {
		n.busyRefused.Add(1)
		return fmt.Errorf("live: %w", ErrPeerBusy)
	}
	var buf bytes.Buffer
	if err := write(&buf); err != nil {
		return err
	}
	return h.ReceiveSnapshot(Message{Group: m.Group, Msg: proto.Clone(m.Msg).(*raftpb.Message)}, &buf)
}

// TestLiveConcurrent runs hosts with real workers and tickers, many groups and
// concurrent clients (meant for -race): every proposal is answered once, every
// acknowledged write reaches every replica, and reads see acknowledged writes.
func TestLiveConcurrent(t *testing.T) {
	const nodes, ngroups, perGroup = 3, 8, 150
	n := newLiveNet()
	hosts := map[uint64]*Host{}
	sms := map[uint64]map[uint64]*testSM{}
	for id := uint64(1); id <= nodes; id++ {
		h, err := New(Config{
			NodeID: id, Log: memlog.New(), Transport: liveTransport{n: n, from: id},
			Workers: 2, TickInterval: 5 * time.Millisecond, ElectionTicks: 10,
			SnapshotEntries: 50, CatchUpEntries: 10,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		hosts[id] = h
		sms[id] = map[uint64]*testSM{}
		n.add(id, h)
	}
	for id, h := range hosts {
		for gid := uint64(1); gid <= ngroups; gid++ {
			sms[id][gid] = newTestSM()
			if err := h.CreateGroup(gid, []uint64{1, 2, 3}, sms[id][gid], false); err != nil {
				t.Fatal(err)
			}
		}
		h.Start()
	}
	defer func() {
		for _, h := range hosts {
			h.Stop()
		}
		close(n.stop)
		n.wg.Wait()
	}()

	var answered, acked atomic.Int64
	var wg sync.WaitGroup
	for gid := uint64(1); gid <= ngroups; gid++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := uint64(1)
			for i := 0; i < perGroup; i++ {
				key := fmt.Sprintf("g%d-k%d", gid, i)
				for attempt := 0; ; attempt++ {
					if attempt > 2000 {
						t.Errorf("%s: never acknowledged", key)
						return
					}
					res := make(chan error, 2)
					hosts[target].Propose(gid, propData(key+"=v"), func(err error) { answered.Add(1); res <- err })
					err := <-res
					if err == nil {
						acked.Add(1)
						break
					}
					var nl *NotLeaderError
					if !errors.As(err, &nl) {
						t.Errorf("%s: %v", key, err)
						return
					}
					if nl.Leader != 0 {
						target = nl.Leader
					} else {
						target = target%nodes + 1
						time.Sleep(2 * time.Millisecond)
					}
				}
				if i%25 == 0 {
					// The write just acknowledged must be visible behind a barrier.
					res := make(chan error, 1)
					hosts[target].ReadBarrier(gid, func(err error) { res <- err })
					if err := <-res; err == nil {
						if _, ok := sms[target][gid].get(key); !ok {
							t.Errorf("read barrier on %d passed without %s", target, key)
						}
					}
				}
				if i == perGroup/2 && gid == 1 {
					hosts[target].Snapshot(gid)
					hosts[target].TransferLeader(gid, target%nodes+1)
				}
			}
		}()
	}
	// Isolate and return one node meanwhile: it catches up by log or snapshot.
	time.Sleep(50 * time.Millisecond)
	n.isolate(3, true)
	time.Sleep(150 * time.Millisecond)
	n.isolate(3, false)
	wg.Wait()
	if got, want := acked.Load(), int64(ngroups*perGroup); got != want {
		t.Fatalf("%d of %d writes acknowledged", got, want)
	}
	deadline := time.Now().Add(60 * time.Second)
	for gid := uint64(1); gid <= ngroups; gid++ {
		for {
			ref := sms[1][gid].snapshotKV()
			same := len(ref) == perGroup
			for id := uint64(2); id <= nodes; id++ {
				same = same && maps.Equal(ref, sms[id][gid].snapshotKV())
			}
			if same {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("group %d did not converge", gid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var rounds, groups uint64
	for _, h := range hosts {
		s := h.Stats()
		rounds += s.ReadyRounds
		groups += s.ReadyGroups
	}
	t.Logf("%d answers for %d writes; %d rounds, %.2f groups per round (group commit)", answered.Load(), acked.Load(), rounds, float64(groups)/float64(rounds))
}

// TestSnapshotBusyBackoff: a follower that refuses a snapshot stream as busy
// (it receives another of the copyset, a former leader's) is not sent the
// next one at once: raft would retry on every heartbeat answer, ten times a
// second with a log line each (TestMoveKeepsRedundancy's logs had 290 in a
// minute). The leader waits snapBusyBackoff before raft hears of the
// refusal; once the follower takes streams again it catches up.
func TestSnapshotBusyBackoff(t *testing.T) {
	n := newLiveNet()
	hosts := map[uint64]*Host{}
	sms := map[uint64]*testSM{}
	for id := uint64(1); id <= 3; id++ {
		h, err := New(Config{
			NodeID: id, Log: memlog.New(), Transport: liveTransport{n: n, from: id},
			TickInterval: 10 * time.Millisecond, ElectionTicks: 10,
			SnapshotEntries: 20, CatchUpEntries: 5,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		hosts[id], sms[id] = h, newTestSM()
		n.add(id, h)
		if err := h.CreateGroup(1, []uint64{1, 2, 3}, sms[id], false); err != nil {
			t.Fatal(err)
		}
		h.Start()
	}
	defer func() {
		for _, h := range hosts {
			h.Stop()
		}
		close(n.stop)
		n.wg.Wait()
	}()
	// write proposes key=v until a leader acknowledges it.
	write := func(key string) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
			for _, h := range hosts {
				if st, _ := h.Status(1); !st.IsLeader {
					continue
				}
				res := make(chan error, 1)
				h.Propose(1, propData(key+"=v"), func(err error) { res <- err })
				if <-res == nil {
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%s: never acknowledged", key)
	}
	write("first")
	var f uint64
	for id, h := range hosts {
		if st, _ := h.Status(1); !st.IsLeader {
			f = id
		}
	}
	// Cut off (and not heard from for two election timeouts, so that it
	// holds no entries back), the follower falls behind the leader's
	// compactions.
	n.isolate(f, true)
	time.Sleep(500 * time.Millisecond)
	for i := range 60 {
		write(fmt.Sprintf("k%d", i))
	}
	n.mu.Lock()
	n.busy[f] = true
	n.mu.Unlock()
	n.isolate(f, false)
	// Refused as busy for two seconds, it is offered a stream about once a
	// second (a slow machine offers fewer), not on every heartbeat.
	for deadline := time.Now().Add(30 * time.Second); n.busyRefused.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the follower was never offered a snapshot")
		}
	}
	time.Sleep(2 * time.Second)
	refused := n.busyRefused.Load()
	t.Logf("%d streams refused as busy in about 2 s (the backoff is %v)", refused, snapBusyBackoff)
	if refused > 4 {
		t.Errorf("%d streams offered to a busy follower in about 2 s: the leader retried without waiting", refused)
	}
	n.mu.Lock()
	n.busy[f] = false
	n.mu.Unlock()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, ok := sms[f].get("k59"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the follower never caught up once it took streams again")
		}
	}
}
