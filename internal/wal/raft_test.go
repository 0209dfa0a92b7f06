package wal

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// raftNode is one member of a test cluster: a RawNode on its own WAL and a
// state machine that is the list of applied values.
type raftNode struct {
	id      uint64
	dir     string
	w       *WAL
	rn      *raft.RawNode
	cs      *pb.ConfState
	values  []string
	applied uint64
	down    bool
}

const raftGroup = 0x0000000100000001

func (n *raftNode) start(t *testing.T, peers []uint64) {
	t.Helper()
	n.w = openT(t, n.dir, func(c *Config) { c.SegmentSize = 16 << 10; c.CacheBytes = 2 << 10 })
	st := n.w.Storage(raftGroup)
	snap, _ := st.Snapshot()
	n.values, n.applied = nil, snap.GetMetadata().GetIndex()
	if d := snap.GetData(); len(d) > 0 {
		n.values = strings.Split(string(d), ",")
	}
	_, n.cs, _ = st.InitialState()
	rn, err := raft.NewRawNode(&raft.Config{
		ID: n.id, ElectionTick: 10, HeartbeatTick: 1, Storage: st, Applied: n.applied,
		MaxSizePerMsg: 4 << 10, MaxInflightMsgs: 64, Logger: discardRaftLogger{},
	})
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := st.LastIndex(); last == 0 && peers != nil {
		ps := make([]raft.Peer, len(peers))
		for i, p := range peers {
			ps[i] = raft.Peer{ID: p}
		}
		if err := rn.Bootstrap(ps); err != nil {
			t.Fatal(err)
		}
	}
	n.rn, n.down = rn, false
}

func (n *raftNode) stop() {
	n.w.Close()
	n.down = true
}

// handle runs one Ready: persist, apply, advance; it returns the messages.
func (n *raftNode) handle(t *testing.T) []*pb.Message {
	if n.down || !n.rn.HasReady() {
		return nil
	}
	rd := n.rn.Ready()
	if err := n.w.Save([]Update{{Group: raftGroup, HardState: rd.HardState, Entries: rd.Entries, Snapshot: rd.Snapshot}}); err != nil {
		t.Fatalf("node %d: Save: %v", n.id, err)
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		n.values = nil
		if d := rd.Snapshot.GetData(); len(d) > 0 {
			n.values = strings.Split(string(d), ",")
		}
		n.applied = rd.Snapshot.GetMetadata().GetIndex()
		n.cs = rd.Snapshot.GetMetadata().GetConfState()
	}
	for _, e := range rd.CommittedEntries {
		switch e.GetType() {
		case pb.EntryType_EntryConfChange:
			var cc pb.ConfChange
			if err := proto.Unmarshal(e.Data, &cc); err != nil {
				t.Fatal(err)
			}
			n.cs = n.rn.ApplyConfChange(&cc)
		case pb.EntryType_EntryNormal:
			if len(e.Data) > 0 {
				n.values = append(n.values, string(e.Data))
			}
		}
		n.applied = e.GetIndex()
	}
	msgs := rd.Messages
	n.rn.Advance(rd)
	return msgs
}

// snapshot records the state machine at its applied index, keeping keep
// entries below it.
func (n *raftNode) snapshot(t *testing.T, keep uint64) {
	snap := &pb.Snapshot{Data: []byte(strings.Join(n.values, ",")),
		Metadata: &pb.SnapshotMetadata{Index: new(n.applied), ConfState: n.cs}}
	if err := n.w.CreateSnapshot(raftGroup, snap, n.applied-keep); err != nil {
		t.Fatalf("node %d: CreateSnapshot: %v", n.id, err)
	}
}

type discardRaftLogger struct{}

func (discardRaftLogger) Debug(...any)              {}
func (discardRaftLogger) Debugf(string, ...any)     {}
func (discardRaftLogger) Error(...any)              {}
func (discardRaftLogger) Errorf(string, ...any)     {}
func (discardRaftLogger) Info(...any)               {}
func (discardRaftLogger) Infof(string, ...any)      {}
func (discardRaftLogger) Warning(...any)            {}
func (discardRaftLogger) Warningf(string, ...any)   {}
func (discardRaftLogger) Fatal(v ...any)            { panic(fmt.Sprint(v...)) }
func (discardRaftLogger) Fatalf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
func (discardRaftLogger) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (discardRaftLogger) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }

// TestRaftClusterOnWAL runs three real raft.RawNodes, each on its own WAL:
// replication, compaction, a member that restarts and catches up through
// the log, and one that was down past compaction and catches up through a
// snapshot (sent from the leader's WAL, saved by the follower's).
func TestRaftClusterOnWAL(t *testing.T) {
	base := t.TempDir()
	nodes := make([]*raftNode, 3)
	for i := range nodes {
		nodes[i] = &raftNode{id: uint64(i + 1), dir: filepath.Join(base, fmt.Sprint(i+1))}
		nodes[i].start(t, []uint64{1, 2, 3})
	}
	byID := func(id uint64) *raftNode { return nodes[id-1] }
	snapsDelivered := 0
	// run drives the cluster until no node has work, delivering messages
	// to nodes that are up and dropping the rest.
	run := func() {
		for range 10000 {
			var msgs []*pb.Message
			for _, n := range nodes {
				msgs = append(msgs, n.handle(t)...)
			}
			if len(msgs) == 0 {
				return
			}
			for _, m := range msgs {
				to := byID(m.GetTo())
				if to.down {
					if m.GetType() == pb.MessageType_MsgSnap {
						byID(m.GetFrom()).rn.ReportSnapshot(m.GetTo(), raft.SnapshotFailure)
					}
					continue
				}
				if err := to.rn.Step(m); err != nil {
					t.Fatalf("step %v: %v", m.GetType(), err)
				}
				if m.GetType() == pb.MessageType_MsgSnap {
					snapsDelivered++
					byID(m.GetFrom()).rn.ReportSnapshot(m.GetTo(), raft.SnapshotFinish)
				}
			}
		}
		t.Fatal("cluster did not settle")
	}
	run()
	if err := nodes[0].rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	run()
	leader := nodes[0]
	if leader.rn.BasicStatus().RaftState != raft.StateLeader {
		t.Fatalf("node 1 is %v, not leader", leader.rn.BasicStatus().RaftState)
	}
	var want []string
	propose := func(n int) {
		for range n {
			v := fmt.Sprintf("v%03d", len(want))
			want = append(want, v)
			if err := leader.rn.Propose([]byte(v)); err != nil {
				t.Fatal(err)
			}
			run()
		}
	}
	propose(60)
	for _, n := range nodes {
		n.snapshot(t, 5)
	}

	// Node 2 restarts and catches up through the log.
	nodes[1].stop()
	propose(30)
	nodes[1].start(t, nil)
	propose(10)

	// Node 3 is down while the others compact past everything it has.
	nodes[2].stop()
	propose(80)
	for _, n := range nodes[:2] {
		n.snapshot(t, 0)
	}
	if fi, _ := leader.w.Storage(raftGroup).FirstIndex(); fi <= 100 {
		t.Fatalf("leader's FirstIndex = %d, compaction did not happen", fi)
	}
	nodes[2].start(t, nil)
	propose(10)
	for range 30 { // heartbeats let the leader find out that node 3 is back
		for _, n := range nodes {
			n.rn.Tick()
		}
		run()
	}
	if snapsDelivered == 0 {
		t.Fatal("node 3 caught up without a snapshot; the test lost its point")
	}

	// And everyone restarts once more from their WAL alone.
	for _, n := range nodes {
		n.stop()
		n.start(t, nil)
	}
	for range 30 {
		for _, n := range nodes {
			n.rn.Tick()
		}
		run()
	}
	for _, n := range nodes {
		if !slices.Equal(n.values, want) {
			t.Fatalf("node %d applied %d values (last %q), want %d", n.id, len(n.values), n.values[len(n.values)-1], len(want))
		}
		n.stop()
	}
	if st := leader.w.Stats(); st.Syncs == 0 {
		t.Fatal("no syncs")
	}
}
