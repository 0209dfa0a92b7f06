// Package proof holds the proof harness of docs/reliability.md ("Proof"):
// histories of client operations under faults checked for linearizability
// with porcupine (internal/linearize), and real power loss of every
// chunkserver on a file system that forgets what was not fsynced
// (internal/lazyfs). Each test starts a real cluster (internal/testcluster).
//
// The tests are seeded: the seed is printed, and BASALT_PROOF_SEED=n repeats
// a run. A failure keeps its artifacts (the history's HTML view, the data
// directories and logs) in BASALT_PROOF_ARTIFACTS (default a new directory
// under $TMPDIR) and prints the path. scripts/soak runs them in a loop.
//
//	go build -o bin/basalt ./cmd/basalt
//	BASALT_BIN=$PWD/bin/basalt go test -v -run TestLinearizable ./tests/proof/
package proof
