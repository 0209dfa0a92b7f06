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
//
// A node may register with the MDS as an access node (ana.go: an NVMe/TCP
// target in ANA multipath, an iSCSI portal with ISCSIConfig.Register, or
// both under one id) and then heartbeats, reporting its NVMe/TCP hosts and
// iSCSI sessions. An iSCSI redirector (redirect.go, ISCSIConfig.Redirect)
// reads the registered portals from the MDS and sends each login to one of
// them per target. fence.go answers the NVMe/TCP and iSCSI targets' MayWrite
// from the volume's attachments: HostMayWrite, one rule for both, by the
// kind of identity the host gives (host NQN or initiator name). hosts.go
// answers the NVMe/TCP target's VolumeHostAllowed from the volumes'
// allow-lists (one ListVolumes, kept HostsTTL), as chap.go keeps the iSCSI
// targets' CHAP records.
package access
