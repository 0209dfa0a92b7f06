package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/basalt-storage/basalt/internal/wal"
	"github.com/basalt-storage/basalt/pkg/api"
)

// LogStore is the durable Raft log of every group on this host. *wal.WAL implements
// it; memlog.Log is an in-memory one for tests.
type LogStore interface {
	// SaveAsync makes every update durable (one fsync for all of them) and then
	// calls done; afterwards Storage(u.Group) reflects the update. The updates
	// take their place in the log before SaveAsync returns, so a group's appends
	// are in call order however many are in flight, and done calls come in call
	// order too. done must not block (*wal.WAL calls it on its committer).
	SaveAsync(updates []wal.Update, done func(error))
	// Storage is the read side raft uses for a group (created empty if unknown).
	Storage(group uint64) raft.Storage
	// CreateSnapshot records snap as the group's latest snapshot and drops the log
	// up to compactTo (0: keep it). It must not fail for a snapshot older than the
	// group's current one (a snapshot received meanwhile); it may ignore it.
	CreateSnapshot(group uint64, snap *raftpb.Snapshot, compactTo uint64) error
	// RemoveGroup forgets the group's log.
	RemoveGroup(group uint64) error
	// SetApplied tells the log the group applied its entries up to index, so
	// that it may stop caching them.
	SetApplied(group, index uint64)
}

// StateMachine is a group's replicated state: the copyset's chunks and epochs. All
// calls but Persist, WriteSnapshot and ReceiveSnapshot come from the worker that holds
// the group, one at a time.
type StateMachine interface {
	// Apply one committed normal entry, in index order. After a restart, entries after
	// the last Persist arrive again (applying twice is harmless). The result goes to
	// the proposer: nil or an *api.Error is a normal result; any other error stops
	// the group.
	Apply(index uint64, data []byte) error
	// Capture returns small state (epochs) exactly as of the last applied entry.
	Capture() []byte
	// Persist makes every effect up to at least index durable (sync dirty chunks), then
	// records (index, state). Runs off the apply path; Apply may run concurrently.
	// An error stops the group (like Apply's disk errors); Persist is not retried.
	Persist(index uint64, state []byte) error
	// Recover returns what Persist or InstallSnapshot recorded last.
	Recover() (index uint64, state []byte, err error)
	// WriteSnapshot streams the data to a follower (leader side; writes may go on).
	WriteSnapshot(w io.Writer) error
	// ReceiveSnapshot stages streamed data durably (follower side), as the data
	// of the snapshot of index: InstallSnapshot(index) must use that data and
	// no other (a follower can have two snapshots staged).
	ReceiveSnapshot(index uint64, r io.Reader) error
	// InstallSnapshot swaps the staged data in as of index, with state from the
	// snapshot. It is called again after a restart when the log holds a snapshot newer
	// than Recover's index, so the staged data must survive until it succeeded.
	InstallSnapshot(index uint64, state []byte) error
}

// FollowerApplier is an optional StateMachine extension. A replica that is
// not its group's leader applies normal entries with ApplyFollower instead of
// Apply: the same effect, but nothing reads what it writes soon (reads are
// the leader's), so a chunk store may write around the page cache.
type FollowerApplier interface {
	ApplyFollower(index uint64, data []byte) error
}

// Message is one raft message of one group.
type Message struct {
	Group uint64
	Msg   *raftpb.Message
}

// Transport moves raft messages between hosts.
type Transport interface {
	// Send is best effort and must not block; never given MsgSnap. Messages to the
	// same peer should travel in one frame.
	Send(msgs []Message)
	// SendSnapshot streams m (MsgSnap) and the data written by write to m.Msg.To, and
	// returns when the receiver staged it (Host.ReceiveSnapshot returned) or failed.
	SendSnapshot(m Message, write func(io.Writer) error) error
}

// Config configures a Host. Zero values take the defaults named below.
type Config struct {
	NodeID    uint64 // this chunkserver's id; its raft id in every group (required)
	Log       LogStore
	Transport Transport
	// Workers is the number of worker goroutines driving the groups (default 4).
	Workers int
	// TickInterval is the raft tick (default 100 ms). ElectionTicks (default 10) and
	// HeartbeatTicks (default 1) count in ticks.
	TickInterval                  time.Duration
	ElectionTicks, HeartbeatTicks int
	// SnapshotEntries: applied entries between automatic snapshots (default 10000).
	// CatchUpEntries: entries kept below a snapshot for slow followers (default 1000).
	SnapshotEntries, CatchUpEntries uint64
	// MaxBatchGroups bounds the groups one worker handles in one round, i.e. in one
	// LogStore.Save (default 128).
	MaxBatchGroups int
	// MaxSizePerMsg and MaxInflightMsgs are raft's flow control (1 MiB, 256).
	MaxSizePerMsg   uint64
	MaxInflightMsgs int
	// MaxInflightBytes bounds the entry bytes a leader has sent one follower
	// and not yet heard acknowledged (default DefaultMaxInflightBytes, at
	// least MaxSizePerMsg). It bounds what one round reads from the log for
	// a follower that fell behind: raft reads a catch-up's entries inside
	// the Step of the follower's answer, on the worker, while the worker
	// holds its whole batch of groups (see doc.go, "Catching up a follower").
	MaxInflightBytes uint64
	// Manual turns the host into a test harness's puppet: no workers, no ticker, no
	// background goroutines. The test calls Tick and ProcessReady; snapshot creation
	// and streaming run inside ProcessReady. Lease time is Tick count × TickInterval.
	Manual bool
	Logger *slog.Logger
}

// DefaultMaxInflightBytes is Config.MaxInflightBytes's default: 2 MiB,
// a pipeline of 2 GB/s at a 1 ms round trip (follower fsync included), and at
// most 2 MiB read from the log per group and round for a follower catching up.
// (Unbounded, a follower back from a pause made raft read up to
// MaxInflightMsgs × MaxSizePerMsg = 256 MiB per group in one Step.)
const DefaultMaxInflightBytes = 2 << 20

func (c *Config) setDefaults() error {
	if c.NodeID == 0 || c.Log == nil || c.Transport == nil {
		return fmt.Errorf("%w: NodeID, Log and Transport are required", ErrConfig)
	}
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.TickInterval <= 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks <= 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks <= 0 {
		c.HeartbeatTicks = 1
	}
	if c.HeartbeatTicks >= c.ElectionTicks {
		return fmt.Errorf("%w: HeartbeatTicks %d must be below ElectionTicks %d", ErrConfig, c.HeartbeatTicks, c.ElectionTicks)
	}
	if c.ElectionTicks < 3 {
		return fmt.Errorf("%w: ElectionTicks %d < 3 leaves no room for a lease", ErrConfig, c.ElectionTicks)
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = 10000
	}
	if c.CatchUpEntries == 0 {
		c.CatchUpEntries = 1000
	}
	if c.MaxBatchGroups <= 0 {
		c.MaxBatchGroups = 128
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = 1 << 20
	}
	if c.MaxInflightMsgs <= 0 {
		c.MaxInflightMsgs = 256
	}
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = DefaultMaxInflightBytes
	}
	c.MaxInflightBytes = max(c.MaxInflightBytes, c.MaxSizePerMsg)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Host runs many raft groups on one chunkserver. See the package doc for the
// goroutines and what each owns.
type Host struct {
	cfg      Config
	log      *slog.Logger
	sched    *scheduler
	stats    *stats
	leaseDur time.Duration
	start    time.Time
	ticks    atomic.Int64 // Tick calls (the lease clock in manual mode)
	propSeq  atomic.Uint64

	// mu guards groups and stopped. Lock order: Host.mu before group.procMu before
	// inbox.mu before scheduler.mu; none is held while calling a callback, the
	// Transport or the LogStore, except procMu (held by the worker for a round).
	mu      sync.RWMutex
	groups  map[uint64]*group
	order   []*group // groups sorted by id: ticks signal them in a fixed order
	started bool
	stopped bool

	// draining: this node takes no leadership handed to it (SetDraining).
	draining atomic.Bool
	// noScreen (tests only) steps network messages unscreened, so that a test
	// can make raft itself panic.
	noScreen bool

	stopc   chan struct{}
	workers sync.WaitGroup // workers and the ticker
	bg      sync.WaitGroup // snapshot creation and streaming goroutines (Stop waits)

	// tasks holds background work in manual mode, run at the end of ProcessReady.
	tasksMu sync.Mutex
	tasks   []func()
}

// New validates cfg and returns a host with no groups. Start it (unless Manual).
func New(cfg Config) (*Host, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h := &Host{
		cfg:   cfg,
		log:   cfg.Logger.With("node", cfg.NodeID),
		sched: newScheduler(),
		stats: newStats(),
		// The lease: a follower ignores vote requests for at least ElectionTicks-1
		// of its ticks after it heard from the leader; 10% of that is the margin for
		// clock-rate differences (see doc.go).
		leaseDur: time.Duration(cfg.ElectionTicks-1) * cfg.TickInterval * 9 / 10,
		start:    time.Now(),
		groups:   make(map[uint64]*group),
		stopc:    make(chan struct{}),
	}
	// Proposal ids only need to be unique per host incarnation (see doc.go); starting
	// from the clock keeps them distinct across restarts too, which helps debugging.
	h.propSeq.Store(uint64(time.Now().UnixNano()))
	return h, nil
}

// Start launches the workers and the ticker. A no-op in manual mode.
func (h *Host) Start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started || h.stopped || h.cfg.Manual {
		return
	}
	h.started = true
	for range h.cfg.Workers {
		h.workers.Add(1)
		go h.worker()
	}
	h.workers.Add(1)
	go h.ticker()
}

// Stop stops ticking and the workers, fails every outstanding callback with
// ErrStopped (wrapping a *NotLeaderError that names the leader), and waits for snapshot creation and streaming in progress to end (so
// the state machines are not used after Stop; the Transport must bound
// SendSnapshot). Groups stay in the LogStore.
func (h *Host) Stop() {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.stopped = true
	groups := slices.Clone(h.order)
	h.mu.Unlock()
	close(h.stopc)
	h.sched.stop()
	h.workers.Wait()
	for _, g := range groups {
		// ErrStopped, and who leads as far as this node knows: the proposer
		// can go there straight away.
		g.shutdown(fmt.Errorf("%w: %w", ErrStopped, g.notLeader()))
	}
	h.bg.Wait()
}

// worker is one of Config.Workers goroutines: it takes a batch of ready groups,
// runs one round over them, and gives them back.
func (h *Host) worker() {
	defer h.workers.Done()
	for {
		batch := h.sched.pop(h.cfg.MaxBatchGroups, true)
		if batch == nil {
			return
		}
		h.processBatch(batch)
		h.sched.done(batch)
	}
}

func (h *Host) ticker() {
	defer h.workers.Done()
	t := time.NewTicker(h.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stopc:
			return
		case <-t.C:
			h.tick()
		}
	}
}

// Tick advances every group's raft clock by one tick. Manual mode only; with a
// ticker it is called for you.
func (h *Host) Tick() { h.tick() }

func (h *Host) tick() {
	h.ticks.Add(1)
	h.mu.RLock()
	for _, g := range h.order {
		_ = g.in.add(func(ev *events) { ev.ticks++ })
		h.sched.signal(g)
	}
	h.mu.RUnlock()
}

// now is the host's clock for leases: monotonic wall time, or ticks in manual mode.
func (h *Host) now() time.Duration {
	if h.cfg.Manual {
		return time.Duration(h.ticks.Load()) * h.cfg.TickInterval
	}
	return time.Since(h.start)
}

// ProcessReady runs rounds over every group with work until none is left, running
// background tasks (snapshot creation and streaming) in between. Manual mode only.
// It returns the number of rounds run.
func (h *Host) ProcessReady() int {
	rounds := 0
	for {
		batch := h.sched.pop(0, false)
		if batch != nil {
			h.processBatch(batch)
			h.sched.done(batch)
			rounds++
			continue
		}
		h.tasksMu.Lock()
		tasks := h.tasks
		h.tasks = nil
		h.tasksMu.Unlock()
		if len(tasks) == 0 {
			return rounds
		}
		for _, t := range tasks {
			t()
		}
	}
}

// goBackground runs f off the worker: on a goroutine, or queued for ProcessReady in
// manual mode.
func (h *Host) goBackground(f func()) {
	if h.cfg.Manual {
		h.tasksMu.Lock()
		h.tasks = append(h.tasks, f)
		h.tasksMu.Unlock()
		return
	}
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		f()
	}()
}

// reorder rebuilds h.order; h.mu must be held for writing.
func (h *Host) reorder() {
	h.order = h.order[:0]
	for _, g := range h.groups {
		h.order = append(h.order, g)
	}
	slices.SortFunc(h.order, func(a, b *group) int { return cmpUint64(a.id, b.id) })
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (h *Host) group(id uint64) *group {
	h.mu.RLock()
	g := h.groups[id]
	h.mu.RUnlock()
	return g
}

// CreateGroup starts hosting group id. With state for it in the LogStore the group
// restarts from it (peers and join are ignored). Otherwise join=false bootstraps it
// with peers as the initial voters (every initial member must pass the same peers)
// and join=true starts it empty, to be filled by the leader (log or snapshot).
func (h *Host) CreateGroup(id uint64, peers []uint64, sm StateMachine, join bool) error {
	h.mu.RLock()
	_, exists := h.groups[id]
	h.mu.RUnlock()
	if exists {
		return fmt.Errorf("%w: %d", ErrGroupExists, id)
	}
	// Recovery (reading the log, maybe installing a staged snapshot) runs without
	// the host lock: ticks and messages for other groups go on meanwhile.
	g, err := newGroup(h, id, peers, sm, join)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return ErrStopped
	}
	if _, ok := h.groups[id]; ok {
		return fmt.Errorf("%w: %d", ErrGroupExists, id)
	}
	h.groups[id] = g
	h.reorder()
	h.sched.signal(g)
	return nil
}

// RemoveGroup stops hosting group id, fails its callbacks with ErrNoGroup, waits
// for its snapshot work and removes its log. The caller removes the state machine's
// data afterwards.
func (h *Host) RemoveGroup(id uint64) error {
	h.mu.Lock()
	g := h.groups[id]
	delete(h.groups, id)
	h.reorder()
	h.mu.Unlock()
	if g == nil {
		return fmt.Errorf("%w: %d", ErrNoGroup, id)
	}
	g.shutdown(fmt.Errorf("%w: %d removed", ErrNoGroup, id))
	g.bg.Wait()
	return h.cfg.Log.RemoveGroup(id)
}

// ProposalHeader is the room a proposal's data reserves at its start for the
// host (the proposal id): the entry is the data itself, not a copy.
const ProposalHeader = 8

// Propose replicates data[ProposalHeader:] through group id; the host owns data
// until done runs and writes the first ProposalHeader bytes — then the caller
// may reuse it: raft copies a proposal into its log (TestProposalBufferReused
// guards this). done runs exactly once:
// with the StateMachine.Apply result on this node when the entry applied, or with
// a *NotLeaderError when this node is not the leader, loses leadership before the
// entry applied, or raft dropped the proposal; with ErrConfig at once if data is
// shorter than ProposalHeader; or with the other errors of errors.go.
func (h *Host) Propose(id uint64, data []byte, done func(error)) {
	if len(data) < ProposalHeader {
		done(fmt.Errorf("%w: proposal of %d bytes has no room for its header", ErrConfig, len(data)))
		return
	}
	h.stats.proposals.Add(1)
	h.submit(id, &proposal{data: data, done: done, start: time.Now()})
}

// ProposeConfChange proposes a membership change. done gets nil once it applied here,
// ErrNotLeader, or ErrConfChangeRejected when another change was still pending.
func (h *Host) ProposeConfChange(id uint64, cc *raftpb.ConfChangeV2, done func(error)) {
	h.submit(id, &proposal{cc: cc, done: done, start: time.Now()})
}

func (h *Host) submit(id uint64, p *proposal) {
	g := h.group(id)
	if g == nil {
		p.done(fmt.Errorf("%w: %d", ErrNoGroup, id))
		return
	}
	if err := g.in.add(func(in *events) { in.props = append(in.props, p) }); err != nil {
		p.done(err)
		return
	}
	h.sched.signal(g)
}

// ReadBarrier calls done(nil) once a read served from this node's local state is
// linearizable: this node leads group id with a valid lease (or a ReadIndex a quorum
// confirmed), and the group applied every entry committed before the call. Otherwise
// done gets a *NotLeaderError (or another error of errors.go). done runs exactly once.
func (h *Host) ReadBarrier(id uint64, done func(error)) {
	g := h.group(id)
	if g == nil {
		done(fmt.Errorf("%w: %d", ErrNoGroup, id))
		return
	}
	// Fast path: a leader with a valid lease that had applied everything it knew
	// committed at the end of its last round (group.fastLease). Anything acknowledged
	// to a client was applied before its acknowledgement, so the read sees it.
	if until := g.fastLease.Load(); until != 0 {
		if now := h.now(); int64(now) < until {
			g.fastReadAt.Store(int64(now))
			h.stats.leaseReads.Add(1)
			done(nil)
			return
		}
	}
	r := &readReq{done: done}
	if err := g.in.add(func(in *events) { in.reads = append(in.reads, r) }); err != nil {
		done(err)
		return
	}
	h.sched.signal(g)
}

// ReadBarrierTerm is ReadBarrier that also tells the leader term the barrier
// held in: done(term, nil) means this node led group id in term, with every
// entry committed before the call applied. With ProposeInTerm, it lets a
// caller decide a write from what it read and have the write land only if no
// other leader can have written in between (a compare-and-write): every entry
// after the read in the log is then one this node proposed in term. done
// runs exactly once; term is 0 with an error.
func (h *Host) ReadBarrierTerm(id uint64, done func(term uint64, err error)) {
	g := h.group(id)
	if g == nil {
		done(0, fmt.Errorf("%w: %d", ErrNoGroup, id))
		return
	}
	// Fast path as ReadBarrier's. The term is loaded before the lease: the
	// worker clears fastLease before its term can change and stores fastTerm
	// before a new fastLease (publishFastLease), so a valid lease seen here
	// is never one of an older term than the term loaded (an older term
	// with a newer lease only fails ProposeInTerm: harmless).
	// The term is loaded again after the lease: a lease published between
	// the first load and the lease's (a first lease, the term still 0, or a
	// new term's) takes the slow path instead of answering a term the lease
	// is not of (a 0 made ProposeInTerm fail as a config error: IO_ERROR).
	term := g.fastTerm.Load()
	if until := g.fastLease.Load(); until != 0 && term != 0 && g.fastTerm.Load() == term {
		if now := h.now(); int64(now) < until {
			g.fastReadAt.Store(int64(now))
			h.stats.leaseReads.Add(1)
			done(term, nil)
			return
		}
	}
	r := &readReq{doneTerm: done}
	if err := g.in.add(func(in *events) { in.reads = append(in.reads, r) }); err != nil {
		done(0, err)
		return
	}
	h.sched.signal(g)
}

// ProposeInTerm is Propose, refused with a *NotLeaderError unless this node
// is still group id's leader in term (from ReadBarrierTerm) when raft takes
// the proposal.
func (h *Host) ProposeInTerm(id uint64, data []byte, term uint64, done func(error)) {
	if len(data) < ProposalHeader {
		done(fmt.Errorf("%w: proposal of %d bytes has no room for its header", ErrConfig, len(data)))
		return
	}
	if term == 0 {
		done(fmt.Errorf("%w: ProposeInTerm in term 0", ErrConfig))
		return
	}
	h.stats.proposals.Add(1)
	h.submit(id, &proposal{data: data, done: done, start: time.Now(), inTerm: term})
}

// TransferLeader asks group id's leader (this node) to hand leadership to peer to.
func (h *Host) TransferLeader(id, to uint64) {
	h.post(id, func(in *events) { in.transfers = append(in.transfers, to) })
}

// SetDraining makes this node, while on, refuse leaderships handed to it by
// transfers (it drops MsgTimeoutNow), for a planned stop that hands its own
// leaderships away: a peer's transfer (leader balancing) must not bring one
// back meanwhile. Elections are not affected: it still votes, and campaigns
// when a leader is lost.
func (h *Host) SetDraining(on bool) { h.draining.Store(on) }

// Snapshot makes group id take a snapshot now and compact its whole applied log
// (not keeping CatchUpEntries; followers behind get a snapshot). The chunkserver
// calls it for groups that keep old WAL segments alive. An idle group's leader first
// appends an empty entry, so that there is a newer index to snapshot at.
func (h *Host) Snapshot(id uint64) {
	h.post(id, func(in *events) { in.forceSnap = true })
}

// Step delivers raft messages from the transport. Unknown groups are ignored.
// Each message is screened before raft sees it (guard.go): only the types a
// peer sends, addressed to this node, with a term, from a member of the group,
// and consistent with the log; the rest is dropped and logged.
//
// MsgSnap is dropped here: a snapshot message is only valid together with its data,
// through ReceiveSnapshot (raft retries after the sender reports the failure).
func (h *Host) Step(msgs []Message) { h.step(msgs, false) }

func (h *Host) step(msgs []Message, snapOK bool) {
	var last *group
	for _, m := range msgs {
		if m.Msg == nil || (!snapOK && m.Msg.GetType() == raftpb.MsgSnap) {
			continue
		}
		g := last
		if g == nil || g.id != m.Group {
			if last != nil {
				h.sched.signal(last)
			}
			g = h.group(m.Group)
			last = g
			if g == nil {
				continue
			}
		}
		_ = g.in.add(func(in *events) { in.msgs = append(in.msgs, m.Msg) })
	}
	if last != nil {
		h.sched.signal(last)
	}
}

// ReceiveSnapshot stages a snapshot streamed by the leader (StateMachine.
// ReceiveSnapshot) and then steps its MsgSnap into the group, which installs it once
// raft accepts it. It returns when the data is staged.
func (h *Host) ReceiveSnapshot(m Message, r io.Reader) error {
	g := h.group(m.Group)
	if g == nil {
		return fmt.Errorf("%w: %d", ErrNoGroup, m.Group)
	}
	if m.Msg.GetType() != raftpb.MsgSnap {
		return fmt.Errorf("raftstore: ReceiveSnapshot with %v", m.Msg.GetType())
	}
	if why := snapshotRefusal(g.getStatus(), m.Msg, h.cfg.NodeID); why != "" {
		// Not g.dropped: that is the worker's. Streams are rare; each is logged.
		h.stats.msgsDropped.Add(1)
		g.log.Warn("raftstore: snapshot stream refused", "why", why, "from", m.Msg.GetFrom(),
			"term", m.Msg.GetTerm(), "index", m.Msg.GetSnapshot().GetMetadata().GetIndex())
		return fmt.Errorf("%w: %s", ErrSnapshotRefused, why)
	}
	if err := g.sm.ReceiveSnapshot(m.Msg.GetSnapshot().GetMetadata().GetIndex(), r); err != nil {
		return err
	}
	h.stats.snapsReceived.Add(1)
	h.step([]Message{m}, true)
	return nil
}

// SetMembers tells group id the members the control plane lists for it.
// Besides the members of its applied configuration, the group accepts raft
// messages from these (a replica that missed the conf changes that added
// its current leader must still hear from it).
func (h *Host) SetMembers(id uint64, members []uint64) {
	members = append(make([]uint64, 0, len(members)), members...)
	h.post(id, func(in *events) { in.members = members })
}

func (h *Host) post(id uint64, f func(*events)) {
	g := h.group(id)
	if g == nil {
		return
	}
	if g.in.add(f) == nil {
		h.sched.signal(g)
	}
}

// GroupStatus is a group's state as of its last round.
type GroupStatus struct {
	ID, Leader, Term, Commit, Applied uint64
	// Voters and Learners are the configuration, or a joint configuration's
	// incoming half; VotersOutgoing is a joint configuration's outgoing half
	// (empty when the group is not in one). AutoLeave: raft's leader leaves the
	// joint configuration by itself once it applied the entry that entered it.
	Voters, Learners, VotersOutgoing []uint64
	AutoLeave                        bool
	// LastIndex is the index of the last entry in this replica's log.
	LastIndex uint64
	IsLeader  bool
	// Healthy is false once the group stopped after a disk failure (Err says why).
	Healthy bool
	Err     error
	// Progress is the match index of every peer; only on the leader.
	Progress map[uint64]uint64
	// Replicating: the peers raft sends entries to normally (not probing, not
	// waiting for a snapshot to be installed); only on the leader.
	Replicating map[uint64]bool
	// Active: the peers the leader heard from within the last election
	// timeout (raft's RecentActive; this node included); only on the leader.
	Active map[uint64]bool
	// Snapshot is the index of the group's last snapshot (created or installed).
	Snapshot uint64
}

// Status returns group id's status.
func (h *Host) Status(id uint64) (GroupStatus, bool) {
	g := h.group(id)
	if g == nil {
		return GroupStatus{}, false
	}
	return g.getStatus(), true
}

// Groups returns the status of every group, ordered by id.
func (h *Host) Groups() []GroupStatus {
	h.mu.RLock()
	gs := make([]*group, 0, len(h.groups))
	for _, g := range h.groups {
		gs = append(gs, g)
	}
	h.mu.RUnlock()
	out := make([]GroupStatus, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.getStatus())
	}
	slices.SortFunc(out, func(a, b GroupStatus) int { return cmpUint64(a.ID, b.ID) })
	return out
}

// processBatch is one round over a batch of groups: the one Ready handler. It runs on
// a worker (or in ProcessReady) and holds every group's procMu for the round. Raft
// runs with AsyncStorageWrites: nothing in a round waits for the disk (see doc.go).
func (h *Host) processBatch(batch []*group) {
	type work struct {
		g     *group
		rd    raft.Ready
		apply *raftpb.Message // the Ready's MsgStorageApply, if any
	}
	works := make([]work, 0, len(batch))
	var out []Message
	var jobs []*appendJob
	for _, g := range batch {
		g.procMu.Lock()
		rd, ok := g.prepare()
		if ok {
			w := work{g: g, rd: rd}
			n := 0
			for _, m := range rd.Messages {
				switch m.GetTo() {
				case raft.LocalAppendThread:
					jobs = append(jobs, g.newAppend(rd, m))
				case raft.LocalApplyThread:
					w.apply = m
				default:
					rd.Messages[n] = m
					n++
				}
			}
			// 1. Messages to peers go at once: a leader's MsgApp before its own
			//    append is durable (raft counts the leader in a quorum only once it
			//    is); what must wait for durability raft keeps in the append's
			//    responses (a follower's MsgAppResp, a vote).
			g.contain(func() { out = g.outgoing(out, rd.Messages[:n]) })
			works = append(works, w)
		} else {
			g.contain(g.finishRound)
			g.procMu.Unlock()
		}
	}
	if len(works) > 0 {
		h.stats.readyRounds.Add(1)
		h.stats.readyGroups.Add(uint64(len(works)))
	}
	if len(out) > 0 {
		h.cfg.Transport.Send(out)
	}
	if len(jobs) > 0 {
		// 2. The round's appends, while the groups are held: their place in the log.
		h.saveAppends(jobs)
	}
	for i := range works {
		w := &works[i]
		g := w.g
		// 3. Apply the committed entries (raft hands out only entries durable here),
		//    answering their proposers, then tell raft; then the read states. A
		//    panic stops this group only (contain).
		g.contain(func() {
			if g.failed == nil && w.apply != nil && g.applyEntries(w.apply.GetEntries()) {
				h.cfg.Log.SetApplied(g.id, g.applied)
				for _, m := range w.apply.GetResponses() {
					_ = g.rn.Step(m)
				}
			}
			if g.failed == nil {
				g.handleReadStates(w.rd.ReadStates)
			}
		})
		g.contain(g.finishRound)
		g.procMu.Unlock()
	}
}

// saveAppends saves the round's appends with one LogStore.SaveAsync (group
// commit); appended delivers their responses once they are durable. In manual
// mode it waits for that, so a round leaves nothing in flight.
func (h *Host) saveAppends(jobs []*appendJob) {
	var updates []wal.Update
	for _, j := range jobs {
		updates = append(updates, j.updates...)
	}
	t := time.Now()
	var saved chan struct{}
	if h.cfg.Manual {
		saved = make(chan struct{})
	}
	h.bg.Add(1) // Stop waits for the appends in flight
	h.cfg.Log.SaveAsync(updates, func(err error) {
		defer h.bg.Done()
		h.stats.logSave.Observe(time.Since(t))
		h.appended(jobs, err)
		if saved != nil {
			close(saved)
		}
	})
	if saved != nil {
		<-saved
	}
}

// appended delivers the responses of durable appends: to peers at once, to this
// node through each group's inbox (with a received snapshot to install first). A
// failed save fails every group of it (the WAL refuses everything after a failed
// fsync anyway). It runs on the log's committer: nothing here blocks.
func (h *Host) appended(jobs []*appendJob, err error) {
	if err != nil {
		h.log.Error("raftstore: log save failed; stopping the groups of the round", "err", err, "groups", len(jobs))
	}
	var remote []Message
	for _, j := range jobs {
		res := appendResult{snap: j.snap, err: err}
		if err == nil {
			for _, m := range j.responses {
				if m.GetTo() == h.cfg.NodeID {
					res.local = append(res.local, m)
				} else {
					remote = append(remote, Message{Group: j.g.id, Msg: m})
				}
			}
		}
		if j.g.in.add(func(ev *events) { ev.appended = append(ev.appended, res) }) == nil {
			h.sched.signal(j.g)
		}
	}
	if len(remote) > 0 {
		h.cfg.Transport.Send(remote)
	}
}

// proposal is a pending Propose or ProposeConfChange.
type proposal struct {
	data  []byte
	cc    *raftpb.ConfChangeV2
	done  func(error)
	start time.Time
	seq   uint64 // proposal id, the first 8 bytes of the entry (conf change: Context)
	term  uint64 // leader term it was proposed in
	index uint64 // log index, once known (0 before)
	// inTerm, when not 0: propose only as the leader of this term
	// (ProposeInTerm).
	inTerm uint64
}

// readReq is a waiting ReadBarrier (done) or ReadBarrierTerm (doneTerm).
type readReq struct {
	done     func(error)
	doneTerm func(term uint64, err error)
	index    uint64 // commit index the read must see applied
	term     uint64 // leader term the read index was taken in
}

// finish answers the barrier: err, or nil in r.term.
func (r *readReq) finish(err error) {
	if r.doneTerm == nil {
		r.done(err)
		return
	}
	if err != nil {
		r.doneTerm(0, err)
		return
	}
	r.doneTerm(r.term, nil)
}

// inbox collects the events for a group between two rounds. Any goroutine adds; the
// worker holding the group drains it.
type inbox struct {
	mu     sync.Mutex
	closed error // once set, add fails with it
	ev     events
}

// events is what happened to a group since its last round.
type events struct {
	appended    []appendResult // outcomes of the group's log appends, in order
	ticks       int
	msgs        []*raftpb.Message
	props       []*proposal
	reads       []*readReq
	transfers   []uint64
	snapReports []snapReport
	snapDone    []snapResult
	forceSnap   bool
	members     []uint64 // Host.SetMembers (nil: no news)
}

type snapReport struct {
	to     uint64
	failed bool
}

type snapResult struct {
	index, term uint64
	err         error
}

func (in *inbox) add(f func(*events)) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed != nil {
		return in.closed
	}
	f(&in.ev)
	return nil
}

// drain hands the queued events to the caller.
func (in *inbox) drain() events {
	in.mu.Lock()
	defer in.mu.Unlock()
	ev := in.ev
	in.ev = events{}
	return ev
}

// close makes later adds fail with err and returns what was queued.
func (in *inbox) close(err error) events {
	in.mu.Lock()
	in.closed = err
	in.mu.Unlock()
	return in.drain()
}

func encodeSeq(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// isAPIError reports whether err is a normal (replicated) result.
func isAPIError(err error) bool {
	var ae *api.Error
	return err == nil || errors.As(err, &ae)
}
