// Package playground runs a whole basalt cluster on one machine with one command:
// the MDS with its embedded etcd (in this process), three chunkservers as separate
// child processes (so one can be killed and restarted), a pool, a volume, and the NBD
// front end on TCP and a Unix socket. Everything lives under one directory; running
// it again on the same directory brings the same data back.
//
// When the cluster is ready it writes DIR/playground.json (the State type: addresses,
// PIDs, and the command that restarts each chunkserver) so scripts and tests can find
// every process, then prints what to try next.
package playground
