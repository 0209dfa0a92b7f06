// Package csi is basalt's Kubernetes CSI driver (CSI spec v1): the identity,
// controller and node services that `basalt csi` serves on a Unix socket (or,
// for tests and loopback only, on TCP: CSI is unauthenticated).
//
// # Controller
//
// The controller maps CSI onto the MDS API (pkg/mdsclient). A CSI volume id
// is the basalt volume name, so CreateVolume is idempotent by name. The
// StorageClass parameters are pool (the basalt pool; default: the only pool
// or "default"), fsType (ext4 or xfs, used when the volume capability names
// none) and protocol (auto, nbd or nbdfuse: how the node attaches).
//
// ControllerPublishVolume records an attachment (volume, node, read-only,
// the node's NVMe host NQN) in the MDS (AttachVolume); nodes exist once their
// node plugin registered (RegisterNode at start, with the host NQN its kernel
// connects as). NVMe/TCP access nodes let only that host write the volume,
// so a fenced node stays fenced when its kernel reconnects (docs/nvmf.md). Publishing a single-node writer volume to a new
// node drops the other nodes' attachments and first fences their writer: a
// takeover open of the volume (pkg/client) commits the new epoch in every
// copyset, so a node that lost contact — dead, partitioned or paused — can
// never land a late write, and the new node may write at once. Kubernetes'
// attach-detach controller only publishes a ReadWriteOnce volume to a second
// node once it has given up on the first (non-graceful node shutdown, or its
// force-detach timeout), so this never fights a healthy node.
//
// # Node
//
// The node plugin runs an NBD front end (internal/frontend/access) on a Unix
// socket in its state directory, one export per volume (export name = volume
// name). NodeStageVolume attaches that export with the host's kernel: kernel
// NBD (nbd-client → /dev/nbdN) when the nbd module is there, else nbdfuse
// plus a loop device (/dev/loopN over the FUSE file nbdfuse serves). Then,
// for a mount volume, mkfs when the device holds no file system (blkid) and
// mount on the staging path. NodePublishVolume bind-mounts the staging path
// (or, for volumeMode Block, the device) onto the target path.
// NodeUnpublish/Unstage undo each step and leave no mount, device or process
// behind. What a stage made is written to STATE/volumes/NAME/stage.json, so
// a restarted plugin can still unstage it.
//
// The export opens the volume read-only and becomes its writer on the first
// write (internal/frontend/volumes): a takeover open, which fences the
// previous writer wherever it is.
//
// Goroutines: the gRPC server's; the NBD front end's; one per nbdfuse child
// process, reaping it. Node operations are serialized by Node.mu.
package csi
