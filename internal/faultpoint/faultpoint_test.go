package faultpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	got, err := Parse(" wal-after-sync=crash@20, snapshot-install=error@2 ,raft-before-send=hang")
	if err != nil {
		t.Fatal(err)
	}
	want := map[Point]Rule{WALAfterSync: {Crash, 20}, SnapshotInstall: {Error, 2}, RaftBeforeSend: {Hang, 1}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for p, r := range want {
		if got[p] != r {
			t.Errorf("%s: got %+v, want %+v", p, got[p], r)
		}
	}
	for _, bad := range []string{"wal-before-sync", "nowhere=crash", "wal-before-sync=explode",
		"wal-before-sync=crash@0", "wal-before-sync=crash@x", "move-joint=error",
		"wal-before-sync=crash,wal-before-sync=hang"} {
		if _, err := Parse(bad); !errors.Is(err, ErrSpec) {
			t.Errorf("Parse(%q) = %v, want ErrSpec", bad, err)
		}
	}
	if got, err := Parse(""); err != nil || len(got) != 0 {
		t.Errorf(`Parse("") = %v, %v`, got, err)
	}
	for _, p := range Points() {
		if _, err := Parse(p.String() + "=crash"); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// The Nth hit fires, once; the others and a nil set do nothing.
func TestHitFiresOnTheNthHitOnce(t *testing.T) {
	var nilSet *Set
	if err := nilSet.Hit(WALBeforeSync); err != nil {
		t.Fatal(err)
	}
	s := New(nil)
	if err := s.Hit(WALBeforeSync); err != nil {
		t.Fatal(err)
	}
	if err := s.Arm("wal-before-sync=error@3"); err != nil {
		t.Fatal(err)
	}
	var fired []int
	for i := 1; i <= 6; i++ {
		if err := s.Hit(WALBeforeSync); errors.Is(err, ErrInjected) {
			fired = append(fired, i)
		}
		if err := s.Hit(WALAfterSync); err != nil {
			t.Fatalf("an unarmed point fired: %v", err)
		}
	}
	if len(fired) != 1 || fired[0] != 3 {
		t.Fatalf("fired on hits %v, want [3]", fired)
	}
	if s.Armed(WALBeforeSync) {
		t.Error("still armed after firing")
	}
}

// A hang holds the goroutine until the set is re-armed.
func TestHangUntilRearmed(t *testing.T) {
	s := New(nil)
	if err := s.Arm("snapshot-send=hang"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- s.Hit(SnapshotSend) }()
	select {
	case <-done:
		t.Fatal("a hang returned before the set was re-armed")
	case <-time.After(50 * time.Millisecond):
	}
	if err := s.Arm(""); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a hang did not end when the set was disarmed")
	}
}

// WatchFile arms from the file and disarms when it is emptied.
func TestWatchFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults")
	if err := os.WriteFile(path, []byte("move-joint=crash@2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := New(nil)
	stop := make(chan struct{})
	defer close(stop)
	s.WatchFile(path, stop)
	if !s.Armed(MoveJoint) {
		t.Fatal("not armed from the file")
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for s.Armed(MoveJoint) {
		if time.Now().After(deadline) {
			t.Fatal("still armed 60 s after the file was emptied")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
