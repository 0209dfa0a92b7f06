// Package faults is basalt's fault-injection suite (docs/design.md §11, §12): every test
// starts a real cluster (the MDS and chunkservers as processes, see
// internal/testcluster), runs a verified workload through the client library,
// injects one fault, heals it, and then checks that every acknowledged write
// reads back and that the replicas of every copyset are identical.
//
// The faults: kill -9 of a follower, of a leader, of every process at once
// (power loss) and of the active MDS (three MDS on an external three-member
// etcd); SIGSTOP of a leader for 10 s (a gray failure); a leader partitioned
// from its followers and a client partitioned from a leader (network
// namespaces and iptables DROP rules); a slow disk (a delay added to every WAL
// fdatasync); a full disk (a data directory on a small tmpfs); a chunkserver
// lost for good and re-replicated onto a spare; a chunkserver restarted on a
// WAL damaged where it had been fdatasynced (it must refuse to start); a
// chunkserver crashed at each named fault point (internal/faultpoint: before
// and after the WAL fsync, before send, mid-snapshot, mid-move;
// TestFaultPoints).
//
// Each test logs a FIGURES line: the longest stretch without a completed IO,
// p99 latency and IOPS before, during and after the fault. Timings are never
// pass/fail beyond generous liveness bounds; docs/reliability.md records them.
// Set BASALT_FAULTS_REPORT=file to collect the figures as JSON lines.
//
// Tests that need root (namespaces, iptables, tmpfs) or etcd skip, saying why.
//
//	go build -o bin/basalt ./cmd/basalt
//	BASALT_BIN=$PWD/bin/basalt go test -v -run 'TestKillLeader' ./tests/faults/
package faults
