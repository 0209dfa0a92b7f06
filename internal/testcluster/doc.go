// Package testcluster starts a real basalt cluster for tests: the MDS (with its
// embedded etcd, or several MDS on one etcd) and N chunkservers, each a separate
// `basalt` process on loopback, and injects faults into them — kill -9, restart,
// SIGSTOP/SIGCONT. Tests then judge the cluster through the real client library.
//
// The basalt binary is taken from $BASALT_BIN (scripts/test builds it) or built
// once per test process into a temporary directory.
package testcluster
