package faultpoint

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Point names a place in the chunkserver where a fault can be injected.
type Point int

// The points. Their names (String) are what a spec uses.
const (
	// WALBeforeSync: a batch of the shared WAL was written, its fdatasync
	// not begun. One hit per synced batch.
	WALBeforeSync Point = iota
	// WALAfterSync: a batch is durable; its Saves have not returned (nothing
	// in it was acknowledged, sent as persisted or applied because of it).
	// One hit per synced batch.
	WALAfterSync
	// RaftBeforeSend: raft messages carrying log entries (MsgApp) are about
	// to be handed to the peer transport. One hit per Send with entries.
	RaftBeforeSend
	// SnapshotSend: a snapshot stream to a peer is under way. One hit per
	// SnapshotSendStep bytes written to the stream, so @1 fires after the
	// first 64 KiB: mid-stream.
	SnapshotSend
	// SnapshotInstall: a received snapshot is half installed
	// (datastore.Copyset.InstallStaged between its steps 1 and 2: the old
	// chunks renamed aside, the snapshot's not yet in their place). One hit
	// per install.
	SnapshotInstall
	// MoveLearnerAdded: the leader applied the change that added a move's
	// new member as a learner (before it caught up and was promoted).
	MoveLearnerAdded
	// MoveJoint: the leader applied a move's joint change (the learner
	// promoted, the old voter leaving); the group is in the joint
	// configuration and has not left it yet.
	MoveJoint
	numPoints
)

var pointNames = [numPoints]string{
	WALBeforeSync:    "wal-before-sync",
	WALAfterSync:     "wal-after-sync",
	RaftBeforeSend:   "raft-before-send",
	SnapshotSend:     "snapshot-send",
	SnapshotInstall:  "snapshot-install",
	MoveLearnerAdded: "move-learner-added",
	MoveJoint:        "move-joint",
}

// SnapshotSendStep is the stream length of one SnapshotSend hit.
const SnapshotSendStep = 64 << 10

func (p Point) String() string {
	if p >= 0 && p < numPoints {
		return pointNames[p]
	}
	return fmt.Sprintf("point(%d)", int(p))
}

// Points lists every point, in order.
func Points() []Point {
	out := make([]Point, numPoints)
	for i := range out {
		out[i] = Point(i)
	}
	return out
}

// Action is what a point does when it fires.
type Action int

const (
	// Crash: SIGKILL this process at once, from the goroutine at the point
	// (a power cut of the process; the page cache survives).
	Crash Action = iota + 1
	// Hang: block the goroutine at the point until the set is re-armed or
	// disarmed (Arm), a stuck disk or a stuck peer connection.
	Hang
	// Error: the point fails (ErrInjected) the way its operation can fail:
	// a failed fdatasync, a dropped batch of messages, a broken snapshot
	// stream, a failed install step. Points that cannot fail refuse it.
	Error
)

var actionNames = map[string]Action{"crash": Crash, "hang": Hang, "error": Error}

func (a Action) String() string {
	for n, v := range actionNames {
		if v == a {
			return n
		}
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// canFail: the points where Error is possible.
var canFail = [numPoints]bool{WALBeforeSync: true, RaftBeforeSend: true, SnapshotSend: true, SnapshotInstall: true}

// ErrInjected is the error of a point armed with the action error.
var ErrInjected = errors.New("faultpoint: injected error")

// ErrSpec: a spec does not parse.
var ErrSpec = errors.New("faultpoint: bad spec")

// Rule is what one point is armed with: fire Action on the At-th hit.
type Rule struct {
	Action Action
	At     int64
}

// arm is one armed point and its hits since it was armed.
type arm struct {
	Rule
	hits atomic.Int64
}

// Set is a chunkserver's fault points. The zero value is disarmed; a nil *Set
// is too (Hit on it returns nil). Safe for concurrent use.
type Set struct {
	log    *slog.Logger
	points [numPoints]atomic.Pointer[arm]

	mu      sync.Mutex    // guards the fields below
	spec    string        // the spec armed now
	rearmed chan struct{} // closed by the next Arm (ends a Hang)
}

// New returns a disarmed set that logs through log (slog.Default if nil).
func New(log *slog.Logger) *Set {
	if log == nil {
		log = slog.Default()
	}
	return &Set{log: log, rearmed: make(chan struct{})}
}

// Parse checks a spec: a comma-separated list of POINT=ACTION[@N] (N ≥ 1,
// default 1: fire on the Nth hit after arming), e.g.
// "wal-after-sync=crash@20,snapshot-install=crash@2". An empty spec arms
// nothing.
func Parse(spec string) (map[Point]Rule, error) {
	out := map[Point]Rule{}
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, act, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %q: want POINT=ACTION[@N]", ErrSpec, item)
		}
		p := Point(-1)
		for i, n := range pointNames {
			if n == strings.TrimSpace(name) {
				p = Point(i)
			}
		}
		if p < 0 {
			return nil, fmt.Errorf("%w: %q: unknown point (known: %s)", ErrSpec, name, strings.Join(pointNames[:], ", "))
		}
		act, count, hasCount := strings.Cut(strings.TrimSpace(act), "@")
		a, ok := actionNames[act]
		if !ok {
			return nil, fmt.Errorf("%w: %q: unknown action %q (crash, hang or error)", ErrSpec, item, act)
		}
		if a == Error && !canFail[p] {
			return nil, fmt.Errorf("%w: %q: %s cannot fail; crash or hang it", ErrSpec, item, p)
		}
		n := int64(1)
		if hasCount {
			var err error
			if n, err = strconv.ParseInt(count, 10, 64); err != nil || n < 1 {
				return nil, fmt.Errorf("%w: %q: the count after @ must be a whole number ≥ 1", ErrSpec, item)
			}
		}
		if _, dup := out[p]; dup {
			return nil, fmt.Errorf("%w: %s named twice", ErrSpec, p)
		}
		out[p] = Rule{Action: a, At: n}
	}
	return out, nil
}

// Arm replaces what is armed with spec (see Parse; "" disarms every point),
// counting hits from now, and releases every goroutine a Hang holds.
func (s *Set) Arm(spec string) error {
	parsed, err := Parse(spec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if spec == s.spec {
		return nil
	}
	for i := range s.points {
		if a, ok := parsed[Point(i)]; ok {
			s.points[i].Store(&arm{Rule: a})
		} else {
			s.points[i].Store(nil)
		}
	}
	s.spec = spec
	close(s.rearmed)
	s.rearmed = make(chan struct{})
	s.log.Warn("fault points armed (for tests only)", "spec", spec)
	return nil
}

// Hit counts one pass through p and, on the armed hit, fires p's action:
// Crash does not return, Hang returns nil once the set is re-armed, Error
// returns ErrInjected. Otherwise nil. A disarmed point costs one atomic load.
func (s *Set) Hit(p Point) error {
	if s == nil {
		return nil
	}
	a := s.points[p].Load()
	if a == nil || a.hits.Add(1) != a.At {
		return nil
	}
	s.log.Error("fault point fired", "point", p.String(), "action", a.Action.String(), "hit", a.At)
	switch a.Action {
	case Crash:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	case Hang:
		s.mu.Lock()
		released := s.rearmed
		s.mu.Unlock()
		<-released
		return nil
	case Error:
		return fmt.Errorf("%w at %s", ErrInjected, p)
	}
	return nil
}

// Armed reports whether p is armed (and has not fired yet).
func (s *Set) Armed(p Point) bool {
	if s == nil {
		return false
	}
	a := s.points[p].Load()
	return a != nil && a.hits.Load() < a.At
}

// WatchFile arms the set with the content of path now and whenever it
// changes (polled every 100 ms, until stop is closed); a missing or empty
// file disarms it. A spec that does not parse is logged and ignored.
func (s *Set) WatchFile(path string, stop <-chan struct{}) {
	load := func() {
		b, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("fault points file", "path", path, "err", err)
			return
		}
		if err := s.Arm(strings.TrimSpace(string(b))); err != nil {
			s.log.Warn("fault points file", "path", path, "err", err)
		}
	}
	load()
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				load()
			}
		}
	}()
}
