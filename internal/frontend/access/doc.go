// Package access starts an access node's front ends: the one place where a
// protocol server is put together with the export lifecycle
// (frontend.Exports) over basalt volumes (package volumes). `basalt nbd`, the
// chunkserver's in-process front end (`basalt chunkserver --nbd-socket`, with
// the local fast path) and `basalt playground` all call Start; the iSCSI and
// NVMe/TCP targets join it as more fields of Config.
//
// Start dials the MDS, creates one Exports shared by every protocol server (so
// all of them see one backend per volume), starts each configured server on its
// listeners and returns a Node. Node.Close stops the servers first (their IO in
// flight completes), then closes the volumes and the MDS connection.
package access
