// Package faultpoint names the places in a chunkserver where a test can
// inject a fault, and what the fault does there (docs/reliability.md, "Fault
// points"; STYLE 11). It is for tests: nothing is armed in production.
//
// A Set holds one optional Rule per Point: an Action (crash the process with
// SIGKILL, hang the goroutine until re-armed, or fail with ErrInjected) and a
// count N, so the point fires on exactly the Nth pass after it was armed and
// a test is deterministic. The code at a point calls Set.Hit: a disarmed
// point costs one atomic load, and a chunkserver started without fault
// points has no hooks at all (its knobs are nil).
//
// A chunkserver is armed through its hidden flag --fault-points-file FILE:
// FILE holds a spec (Parse), e.g.
//
//	wal-after-sync=crash@20,snapshot-install=crash
//
// and is re-read every 100 ms; an empty or missing file disarms. Each
// arming and each firing is logged ("fault points armed", "fault point
// fired"). internal/testcluster's ArmFaultPoints writes the file.
//
// The points and where they are wired (cmd/basalt/faultpoints.go):
//
//	wal-before-sync     wal.Knobs.BeforeSync: a batch written, not fdatasynced
//	wal-after-sync      wal.Knobs.AfterSync: a batch durable, its Saves not returned
//	raft-before-send    the raft transport's Send, when the messages carry entries
//	snapshot-send       the snapshot stream's writer, every 64 KiB
//	snapshot-install    datastore.Knobs.BeforeInstallStep, between steps 1 and 2
//	move-learner-added  the leader applied a move's add-learner change
//	move-joint          the leader applied a move's joint change
package faultpoint
