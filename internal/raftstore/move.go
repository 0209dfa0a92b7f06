package raftstore

import (
	"fmt"
	"slices"

	"go.etcd.io/raft/v3/raftpb"
)

// MoveKind is the kind of a MoveStep.
type MoveKind int

// The steps of a replica move (NextMoveStep).
const (
	// MoveWait: nothing to do now — the configuration is the wanted one, a
	// learner is still catching up, or raft is leaving a joint configuration.
	MoveWait MoveKind = iota
	// MoveAddLearner adds Node as a learner: it receives the log (or a
	// snapshot) but does not count for quorum.
	MoveAddLearner
	// MoveRemoveLearner removes Node, a learner no longer wanted.
	MoveRemoveLearner
	// MoveReplace is one joint change (ConfChangeV2): promote the caught-up
	// learners in Promote, remove the voters in Remove. raft leaves the joint
	// configuration by itself (auto-leave) once the leader applied it.
	MoveReplace
	// MoveLeaveJoint leaves a joint configuration raft does not leave by
	// itself (one entered with an explicit transition).
	MoveLeaveJoint
	// MoveTransferLeader hands leadership to Node: this leader is to be
	// removed, and a listed voter should carry out the change.
	MoveTransferLeader
)

// MoveStep is the next membership change toward a wanted member list.
type MoveStep struct {
	Kind    MoveKind
	Node    uint64   // MoveAddLearner, MoveRemoveLearner, MoveTransferLeader
	Promote []uint64 // MoveReplace
	Remove  []uint64 // MoveReplace
	// Why says what a MoveWait waits for ("" when the move is done).
	Why string
}

func (s MoveStep) String() string {
	switch s.Kind {
	case MoveAddLearner:
		return fmt.Sprintf("add learner %d", s.Node)
	case MoveRemoveLearner:
		return fmt.Sprintf("remove learner %d", s.Node)
	case MoveReplace:
		return fmt.Sprintf("joint change: promote %v, remove %v", s.Promote, s.Remove)
	case MoveLeaveJoint:
		return "leave joint configuration"
	case MoveTransferLeader:
		return fmt.Sprintf("transfer leadership to %d", s.Node)
	}
	if s.Why != "" {
		return "wait: " + s.Why
	}
	return "done"
}

// ConfChange is the change to propose for s (nil for MoveWait and
// MoveTransferLeader).
func (s MoveStep) ConfChange() *raftpb.ConfChangeV2 {
	single := func(typ raftpb.ConfChangeType, node uint64) *raftpb.ConfChangeSingle {
		return &raftpb.ConfChangeSingle{Type: typ.Enum(), NodeId: &node}
	}
	switch s.Kind {
	case MoveAddLearner:
		return &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{single(raftpb.ConfChangeAddLearnerNode, s.Node)}}
	case MoveRemoveLearner:
		return &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{single(raftpb.ConfChangeRemoveNode, s.Node)}}
	case MoveReplace:
		cc := &raftpb.ConfChangeV2{Transition: raftpb.ConfChangeTransitionJointImplicit.Enum()}
		for _, n := range s.Promote {
			cc.Changes = append(cc.Changes, single(raftpb.ConfChangeAddNode, n))
		}
		for _, n := range s.Remove {
			cc.Changes = append(cc.Changes, single(raftpb.ConfChangeRemoveNode, n))
		}
		return cc
	case MoveLeaveJoint:
		return &raftpb.ConfChangeV2{}
	}
	return nil
}

// CaughtUp reports whether the leader whose status st is may count peer id as
// caught up: raft replicates to it normally (it installed any snapshot it
// needed) and its log is within lag entries of the leader's.
func (st GroupStatus) CaughtUp(id, lag uint64) bool {
	return st.Replicating[id] && st.Progress[id]+lag >= st.LastIndex
}

// NextMoveStep is the next step that moves a group, led by self with status
// st, toward the voters want, without ever lowering its redundancy:
//
//  1. a joint configuration is left first (raft does it itself unless it
//     was entered with an explicit transition);
//  2. a wanted member that is not in the group joins as a learner;
//  3. a learner no longer wanted is removed (learners do not count for quorum);
//  4. once every wanted learner caught up (CaughtUp with lag), one joint
//     change promotes them and removes the voters no longer wanted: each
//     half of the joint configuration has as many voters as before or as
//     wanted, so a move never runs the group on fewer voters, and a member
//     lost in the middle of it costs what it costs outside a move. A leader
//     that is to be removed first hands leadership to a wanted, caught-up
//     voter.
//
// Only a leader acts: on a follower, or with want empty, it says MoveWait.
func NextMoveStep(st GroupStatus, self uint64, want []uint64, lag uint64) MoveStep {
	if len(want) == 0 || !st.IsLeader {
		return MoveStep{Why: "not the leader"}
	}
	if len(st.VotersOutgoing) > 0 {
		if st.AutoLeave {
			return MoveStep{Why: "raft leaving the joint configuration"}
		}
		return MoveStep{Kind: MoveLeaveJoint}
	}
	for _, m := range want {
		if !slices.Contains(st.Voters, m) && !slices.Contains(st.Learners, m) {
			return MoveStep{Kind: MoveAddLearner, Node: m}
		}
	}
	var promote, remove []uint64
	for _, l := range st.Learners {
		if !slices.Contains(want, l) {
			return MoveStep{Kind: MoveRemoveLearner, Node: l}
		}
		if !st.CaughtUp(l, lag) {
			return MoveStep{Why: fmt.Sprintf("learner %d catching up (match %d, last index %d)", l, st.Progress[l], st.LastIndex)}
		}
		promote = append(promote, l)
	}
	for _, v := range st.Voters {
		if !slices.Contains(want, v) {
			remove = append(remove, v)
		}
	}
	if len(promote) == 0 && len(remove) == 0 {
		return MoveStep{}
	}
	if slices.Contains(remove, self) {
		var to uint64
		for _, v := range st.Voters {
			if v != self && slices.Contains(want, v) && st.CaughtUp(v, lag) && (to == 0 || st.Progress[v] > st.Progress[to]) {
				to = v
			}
		}
		if to == 0 {
			return MoveStep{Why: "no caught-up wanted voter to hand leadership to"}
		}
		return MoveStep{Kind: MoveTransferLeader, Node: to}
	}
	return MoveStep{Kind: MoveReplace, Promote: promote, Remove: remove}
}
