// Package playground runs a whole basalt cluster on one machine with one command:
// the MDS with its embedded etcd (in this process), three chunkservers as separate
// child processes (so one can be killed and restarted), a pool, a volume, and the NBD
// front end on TCP and a Unix socket. Everything lives under one directory; running
// it again on the same directory brings the same data back.
//
// DIR/tls holds the cluster CA and every certificate (identity.EnsureCerts),
// among them a client certificate for NBD over TLS, also laid out in
// DIR/tls/nbd-client as libnbd and qemu read it (ca-cert.pem,
// client-cert.pem, client-key.pem). The NBD listeners offer NBD_OPT_STARTTLS
// and allow plaintext unless Config.NBDTLS / NBDSocketTLS say "require".
//
// Run goes through the steps in order and undoes them in reverse on the way out:
//
//	config.go      Config and its defaults (ports counted from PortBase)
//	cluster.go     1. the MDS and etcd in process, 2. the chunkserver children
//	               (each with its own in-process NBD socket), 3. pool, volume and
//	               a leader for every copyset
//	frontend.go    4. the NBD front end and its metrics (package frontend/access)
//	state.go       5. DIR/playground.json (the State type: addresses, PIDs, and the
//	               command that restarts each chunkserver) for scripts and tests
//	welcome.go     what to try next
//	supervisor.go  starts the children and stops them, also ones restarted by hand
package playground
