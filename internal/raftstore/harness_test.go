package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/cryptotest"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/basalt-storage/basalt/internal/raftstore/memlog"
	"github.com/basalt-storage/basalt/pkg/api"
)

// errDisk is what testSM.Apply returns to simulate a failing disk.
var errDisk = errors.New("test: disk failure")

// testSM is a key-value state machine: entries are "key=value" blind overwrites, so
// applying one twice is harmless, as with block writes. "fence:..." entries return
// api.ErrFenced, a normal replicated result.
type testSM struct {
	mu      sync.Mutex
	kv      map[string]string
	applied uint64
	// durable is what survives a restart: set by Persist and InstallSnapshot.
	durIndex    uint64
	durKV       map[string]string
	staged      map[string]string
	stagedIndex uint64
	failAt      uint64 // Apply at this index returns errDisk (0: never)
	// failInstall makes InstallSnapshot fail (after Log.Save persisted the snapshot:
	// a crash at the worst moment).
	failInstall bool
	// failPersist makes Persist fail with errDisk (a failed fsync of the chunks).
	failPersist bool
	// panicky makes Apply panic on "panic:..." entries (a bug on one replica).
	panicky  bool
	persists int // Persist calls
	// beforePersist, if set, runs at the start of Persist (without the lock):
	// the cluster can move on while a snapshot is being written.
	beforePersist func()
	onApply       func(index uint64, data string)
	applies       int
}

func newTestSM() *testSM { return &testSM{kv: map[string]string{}, durKV: map[string]string{}} }

// restarted returns the state machine as a restart finds it: what was made durable.
func (s *testSM) restarted() *testSM {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &testSM{kv: maps.Clone(s.durKV), applied: s.durIndex, durIndex: s.durIndex, durKV: maps.Clone(s.durKV), staged: maps.Clone(s.staged), stagedIndex: s.stagedIndex}
}

func (s *testSM) Apply(index uint64, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failAt != 0 && index >= s.failAt {
		return errDisk
	}
	if s.onApply != nil {
		s.onApply(index, string(data))
	}
	s.applied = index
	s.applies++
	if s.panicky && strings.HasPrefix(string(data), "panic:") {
		panic("test: state machine panics on " + string(data))
	}
	if strings.HasPrefix(string(data), "fence:") {
		return api.ErrFenced
	}
	k, v, _ := strings.Cut(string(data), "=")
	s.kv[k] = v
	return nil
}

func (s *testSM) Capture() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return binary.BigEndian.AppendUint64(nil, s.applied)
}

func (s *testSM) Persist(index uint64, state []byte) error {
	if f := s.beforePersist; f != nil {
		f()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.persists++
	if s.failPersist {
		return errDisk
	}
	// The state is as of the last entry the state machine saw at or before index
	// (conf changes and empty entries do not reach it).
	if at := binary.BigEndian.Uint64(state); at > index || at < s.durIndex {
		return fmt.Errorf("test: state as of %d persisted at %d (last persist %d)", at, index, s.durIndex)
	}
	// Every effect up to at least index is in kv (maybe later ones too).
	s.durKV = maps.Clone(s.kv)
	s.durIndex = index
	return nil
}

func (s *testSM) Recover() (uint64, []byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durIndex, binary.BigEndian.AppendUint64(nil, s.durIndex), nil
}

func (s *testSM) WriteSnapshot(w io.Writer) error {
	s.mu.Lock()
	kv := maps.Clone(s.kv)
	s.mu.Unlock()
	return json.NewEncoder(w).Encode(kv)
}

func (s *testSM) ReceiveSnapshot(index uint64, r io.Reader) error {
	var kv map[string]string
	if err := json.NewDecoder(r).Decode(&kv); err != nil {
		return err
	}
	s.mu.Lock()
	s.staged, s.stagedIndex = kv, index
	s.mu.Unlock()
	return nil
}

// stagedSnapshot is the data ReceiveSnapshot staged last (nil: none).
func (s *testSM) stagedSnapshot() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.staged
}

func (s *testSM) InstallSnapshot(index uint64, state []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failInstall {
		return errDisk
	}
	if s.staged == nil {
		return errors.New("test: nothing staged")
	}
	if s.stagedIndex != index {
		return fmt.Errorf("test: install of snapshot %d with the data of %d", index, s.stagedIndex)
	}
	s.kv = maps.Clone(s.staged)
	s.durKV = maps.Clone(s.staged)
	s.staged = nil
	s.applied, s.durIndex = index, index
	return nil
}

func (s *testSM) get(k string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.kv[k]
	return v, ok
}

func (s *testSM) snapshotKV() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.kv)
}

// packet is a raft message in flight in the simulated network.
type packet struct {
	from, to uint64
	at       int // step at which it may be delivered
	m        Message
}

// simNet is a deterministic network between manual-mode hosts: it drops, delays,
// reorders and partitions messages, all decided by one seeded rand.
type simNet struct {
	rng      *rand.Rand
	hosts    map[uint64]*Host
	q        []packet
	now      int
	drop     float64
	maxDelay int
	cut      map[[2]uint64]bool
	sent     int
	// holdSnap: snapshots to these nodes fail (a rebuild that has not finished yet).
	holdSnap map[uint64]bool
	// paused nodes neither tick nor run, and messages to them wait in q
	// (a SIGSTOPped process: its peers' connections stay open).
	paused map[uint64]bool
}

func (n *simNet) linked(a, b uint64) bool { return !n.cut[[2]uint64{a, b}] }

func (n *simNet) partition(side []uint64) {
	for id := range n.hosts {
		for _, s := range side {
			if !slices.Contains(side, id) {
				n.cut[[2]uint64{id, s}] = true
				n.cut[[2]uint64{s, id}] = true
			}
		}
	}
}

func (n *simNet) heal() { clear(n.cut) }

type simTransport struct {
	n    *simNet
	from uint64
}

func (t simTransport) Send(msgs []Message) {
	n := t.n
	for _, m := range msgs {
		n.sent++
		to := m.Msg.GetTo()
		if !n.linked(t.from, to) || n.rng.Float64() < n.drop {
			continue
		}
		c := Message{Group: m.Group, Msg: proto.Clone(m.Msg).(*raftpb.Message)}
		n.q = append(n.q, packet{from: t.from, to: to, at: n.now + n.rng.Intn(n.maxDelay+1), m: c})
	}
}

func (t simTransport) SendSnapshot(m Message, write func(io.Writer) error) error {
	n := t.n
	to := m.Msg.GetTo()
	h := n.hosts[to]
	if h == nil || !n.linked(t.from, to) {
		return errors.New("sim: unreachable")
	}
	if n.holdSnap[to] {
		return errors.New("sim: snapshot held back")
	}
	var buf bytes.Buffer
	if err := write(&buf); err != nil {
		return err
	}
	return h.ReceiveSnapshot(Message{Group: m.Group, Msg: proto.Clone(m.Msg).(*raftpb.Message)}, &buf)
}

// deliver hands every due packet to its host, in a random order.
func (n *simNet) deliver() {
	var due, later []packet
	for _, p := range n.q {
		if p.at <= n.now && !n.paused[p.to] {
			due = append(due, p)
		} else {
			later = append(later, p)
		}
	}
	n.q = later
	n.rng.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
	for _, p := range due {
		if h := n.hosts[p.to]; h != nil && n.linked(p.from, p.to) {
			h.Step([]Message{p.m})
		}
	}
}

// cluster is N manual-mode hosts on a simNet, each hosting several groups.
type cluster struct {
	t      testing.TB
	seed   int64
	net    *simNet
	ids    []uint64
	logs   map[uint64]LogStore
	hosts  map[uint64]*Host
	sms    map[uint64]map[uint64]*testSM // node → group → state machine
	groups map[uint64][]uint64           // group → members
	tweak  func(*Config)
	// committed is the one sequence every replica must apply a prefix of (with gaps
	// for entries the state machine does not see): group → index → data.
	committed map[uint64]map[uint64]string
	lastApply map[[2]uint64]uint64         // (node, group) → last applied index
	leaders   map[uint64]map[uint64]uint64 // group → term → leader
	tickEvery int
}

func newCluster(t testing.TB, seed int64, nodes int, groups map[uint64][]uint64, tweak func(*Config)) *cluster {
	return newClusterWith(t, seed, nodes, groups, tweak, func(uint64) LogStore { return memlog.New() })
}

// newClusterWith is newCluster with the log of each node made by newLog.
func newClusterWith(t testing.TB, seed int64, nodes int, groups map[uint64][]uint64, tweak func(*Config), newLog func(id uint64) LogStore) *cluster {
	// raft draws its randomized election timeouts from crypto/rand: seed that too,
	// so that one seed replays a run exactly.
	if tt, ok := t.(*testing.T); ok {
		cryptotest.SetGlobalRandom(tt, uint64(seed))
	}
	c := &cluster{
		t: t, seed: seed,
		net:       &simNet{rng: rand.New(rand.NewSource(seed)), hosts: map[uint64]*Host{}, cut: map[[2]uint64]bool{}, paused: map[uint64]bool{}},
		logs:      map[uint64]LogStore{},
		hosts:     map[uint64]*Host{},
		sms:       map[uint64]map[uint64]*testSM{},
		groups:    groups,
		tweak:     tweak,
		committed: map[uint64]map[uint64]string{},
		lastApply: map[[2]uint64]uint64{},
		leaders:   map[uint64]map[uint64]uint64{},
		tickEvery: 2,
	}
	for i := 1; i <= nodes; i++ {
		id := uint64(i)
		c.ids = append(c.ids, id)
		c.logs[id] = newLog(id)
		c.sms[id] = map[uint64]*testSM{}
	}
	for _, id := range c.ids {
		c.startHost(id)
	}
	for _, gid := range slices.Sorted(maps.Keys(groups)) {
		for _, id := range groups[gid] {
			sm := newTestSM()
			c.createGroup(id, gid, sm, false)
		}
	}
	return c
}

func (c *cluster) fatalf(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("seed %d, step %d: "+format, append([]any{c.seed, c.net.now}, args...)...)
}

func (c *cluster) startHost(id uint64) {
	cfg := Config{
		NodeID: id, Log: c.logs[id], Transport: simTransport{n: c.net, from: id},
		Manual: true, TickInterval: 100 * time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		SnapshotEntries: 10000, CatchUpEntries: 100,
		Logger: slog.New(slog.DiscardHandler),
	}
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.hosts[id] = h
	c.net.hosts[id] = h
}

func (c *cluster) createGroup(id, gid uint64, sm *testSM, join bool) {
	key := [2]uint64{id, gid}
	sm.onApply = func(index uint64, data string) {
		if last := c.lastApply[key]; index <= last && index > sm.durIndex {
			c.fatalf("node %d group %d applied %d after %d", id, gid, index, last)
		}
		c.lastApply[key] = index
		m := c.committed[gid]
		if m == nil {
			m = map[uint64]string{}
			c.committed[gid] = m
		}
		if prev, ok := m[index]; ok && prev != data {
			c.fatalf("group %d index %d: node %d applied %q, another replica %q", gid, index, id, data, prev)
		}
		m[index] = data
	}
	c.sms[id][gid] = sm
	c.lastApply[key] = sm.durIndex
	if err := c.hosts[id].CreateGroup(gid, c.groups[gid], sm, join); err != nil {
		c.t.Fatal(err)
	}
}

// step advances the simulation by one step: maybe a tick, deliveries, then every
// host runs until idle. It checks the one-leader-per-term rule.
func (c *cluster) step() {
	c.net.now++
	if c.net.now%c.tickEvery == 0 {
		for _, id := range c.ids {
			if h := c.hosts[id]; h != nil && !c.net.paused[id] {
				h.Tick()
			}
		}
	}
	c.net.deliver()
	for _, id := range c.ids {
		if h := c.hosts[id]; h != nil && !c.net.paused[id] {
			h.ProcessReady()
		}
	}
	c.checkLeaders()
}

func (c *cluster) run(steps int) {
	for range steps {
		c.step()
	}
}

func (c *cluster) checkLeaders() {
	for _, id := range c.ids {
		h := c.hosts[id]
		if h == nil {
			continue
		}
		for _, st := range h.Groups() {
			if !st.IsLeader {
				continue
			}
			m := c.leaders[st.ID]
			if m == nil {
				m = map[uint64]uint64{}
				c.leaders[st.ID] = m
			}
			if other, ok := m[st.Term]; ok && other != id {
				c.fatalf("group %d term %d has two leaders: %d and %d", st.ID, st.Term, other, id)
			}
			m[st.Term] = id
		}
	}
}

// leader returns the group's leader that a majority follows, or 0.
func (c *cluster) leader(gid uint64) uint64 {
	for _, id := range c.groups[gid] {
		if h := c.hosts[id]; h != nil {
			if st, ok := h.Status(gid); ok && st.IsLeader {
				return id
			}
		}
	}
	return 0
}

// waitLeader steps until the group has a leader.
func (c *cluster) waitLeader(gid uint64) uint64 {
	for range 2000 {
		if l := c.leader(gid); l != 0 {
			return l
		}
		c.step()
	}
	c.fatalf("group %d: no leader", gid)
	return 0
}

// propose proposes data on host id and steps until done ran; it returns the result.
func (c *cluster) proposeWait(id, gid uint64, data string) error {
	var res error
	called := 0
	c.hosts[id].Propose(gid, propData(data), func(err error) { res = err; called++ })
	for i := 0; called == 0; i++ {
		if i > 2000 {
			c.fatalf("proposal %q never answered", data)
		}
		c.step()
	}
	if called != 1 {
		c.fatalf("proposal %q answered %d times", data, called)
	}
	return res
}

// converged reports whether every live replica of every group applied the same state.
func (c *cluster) converged() (bool, string) {
	for _, gid := range slices.Sorted(maps.Keys(c.groups)) {
		var ref map[string]string
		var refID uint64
		var refCommit uint64
		for _, id := range c.groups[gid] {
			h := c.hosts[id]
			if h == nil {
				continue
			}
			st, ok := h.Status(gid)
			if !ok {
				continue
			}
			if st.Applied != st.Commit {
				return false, fmt.Sprintf("group %d node %d applied %d of %d", gid, id, st.Applied, st.Commit)
			}
			kv := c.sms[id][gid].snapshotKV()
			if ref == nil {
				ref, refID, refCommit = kv, id, st.Commit
				continue
			}
			if st.Commit != refCommit {
				return false, fmt.Sprintf("group %d: node %d commit %d, node %d commit %d", gid, refID, refCommit, id, st.Commit)
			}
			if !maps.Equal(kv, ref) {
				return false, fmt.Sprintf("group %d: node %d and %d differ (%d vs %d keys)", gid, refID, id, len(ref), len(kv))
			}
		}
	}
	return true, ""
}

func (c *cluster) waitConverged(maxSteps int) {
	var why string
	for range maxSteps {
		var ok bool
		if ok, why = c.converged(); ok {
			return
		}
		c.step()
	}
	c.fatalf("not converged: %s", why)
}

func (c *cluster) stop() {
	for _, id := range c.ids {
		if h := c.hosts[id]; h != nil {
			h.Stop()
		}
	}
}

// propData makes proposal data for s: the room Propose reserves, then s.
func propData(s string) []byte {
	return append(make([]byte, ProposalHeader, ProposalHeader+len(s)), s...)
}
