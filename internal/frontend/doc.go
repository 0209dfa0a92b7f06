// Package frontend is the protocol-neutral access layer (docs/design.md §7) that every
// protocol server sits on: NBD today (package nbd), iSCSI and NVMe/TCP next. A
// protocol server is only a parser and a mapper: it turns its requests into
// Backend calls and this package's error classes into its own codes.
//
// # The pieces
//
//	protocol server (nbd)          parses, validates against Info, maps errors
//	      │ Attach / Describe / List
//	Exports                        the export lifecycle, shared by every server of a process
//	      │ Open / Stat / List / Classify
//	Opener (package volumes)       the storage: basalt volumes through the client library
//	      │
//	Backend                        one open device: Submit, Info, Check, Close
//
// Package access starts a set of protocol servers over one Exports; it is the
// one place that assembles a front end.
//
// # Connections
//
// Conns is the server half every protocol shares: accept loops on any number
// of listeners (transient accept errors retried with a backoff), the set of
// live connections, Shutdown (each connection's BeginShutdown: finish what was
// read, refuse the rest; after the caller's deadline, Close) and Close (every
// socket closed at once). A protocol supplies only its Conn: Serve,
// BeginShutdown, Close.
//
// # May this host write?
//
// WriteGate keeps one host's answer to "may I write this volume?" (a
// MayWriteFunc; package access asks the volume's attachments in the MDS)
// for an NVMe/TCP controller's namespace or an iSCSI session: the first
// write waits for the answer, later ones use the last answer while it is
// refreshed in the background once it is a TTL old, so the MDS is never on
// the IO path after the first write. A host that reconnects gets a new gate
// and asks afresh: that is what keeps a fenced host fenced.
//
// # Backend and Info
//
// A Backend takes IO through Submit (no goroutine per IO; done may run on any
// goroutine) and describes itself with Info: size, read-only, the optional
// commands it serves (flush, FUA, trim, write-zeroes) and its block sizes
// (minimum, preferred, maximum). A protocol server advertises exactly that —
// NBD's transmission flags and NBD_INFO_BLOCK_SIZE, later SCSI's READ CAPACITY
// and Block Limits page, NVMe's Identify Namespace — and refuses what Info
// rules out before the backend sees it. Exports fills in default block sizes
// and rejects inconsistent ones (ErrBadInfo), so servers get checked values.
// Abilities beyond Submit are optional interfaces a protocol server looks
// for: Mapper (which blocks hold data: GET LBA STATUS) and CompareAndWriter
// (an atomic compare-and-write on the volume: COMPARE AND WRITE).
//
// # The export lifecycle
//
//   - Attach (NBD_OPT_GO; later an iSCSI login or NVMe connect) joins the
//     export of that name: the first attachment opens its backend, the others
//     share it, which is what makes NBD's CAN_MULTI_CONN true. The open runs
//     once per name on its own goroutine (bounded by OpenTimeout); attachers of
//     that name wait for it, each for as long as its own context allows, and
//     attachers of other names never wait: one slow open stalls nobody else.
//   - Detach ends an attachment; the last one closes the backend (Close releases
//     the volume's sessions). A protocol server detaches only once none of the
//     attachment's IO is in flight.
//   - Describe (NBD_OPT_INFO) answers from metadata (Opener.Stat) and never
//     opens the export.
//   - When another attachment joins an open backend, Exports asks it to Check
//     itself: Check re-reads what may have changed — the size, so a resize is
//     seen by every attachment made after it — and reports a backend that can
//     serve no more IO. A fenced backend (another front end took the writer role)
//     stays with the attachments that hold it, whose IO keeps failing with
//     ErrFenced until their clients reconnect, and the newcomer gets a freshly
//     opened backend; a log line says so.
//   - WatchSize subscribes a protocol to an export's size: one watcher per
//     watched name re-reads it every ExportsConfig.SizeCheck (Check on the
//     open backend, or Opener.Stat when none is open) and calls every
//     subscriber, so a resize reaches the hosts attached now — iSCSI raises
//     CAPACITY DATA HAS CHANGED, NVMe/TCP a Namespace Attribute Changed
//     notice — without each session or controller polling on its own
//     (sizewatch.go).
//   - Close (process shutdown) ends the watches and closes every backend,
//     held or not.
//
// # The writer role
//
// Opening never takes the volume's writer role: a backend opens with a
// read-only session and takes the role (a new epoch, docs/design.md §6) on its first
// write, trim or write-zeroes. So nbdinfo, a client that only reads, a
// read-only export, or a standby multipath path attached to another front end
// never fences the front end a writer uses.
//
// # Error classes
//
// Opener.Classify wraps each failed IO's error in one class; a protocol server
// maps the class with errors.Is. NBD's mapping is package nbd's; the SCSI and
// NVMe columns are what the iSCSI and NVMe/TCP targets are to use:
//
//	class             NBD        SCSI (sense key, ASC/ASCQ)                   NVMe status
//	ErrReadOnly       EPERM      DATA PROTECT, 27/00 write protected          Namespace Is Write Protected
//	ErrFenced         EPERM      NOT READY, 04/0C target port unavailable     ANA Inaccessible (path error)
//	ErrNoSpace        ENOSPC     DATA PROTECT, 27/07 space allocation failed  Capacity Exceeded
//	ErrOutOfRange     EINVAL     ILLEGAL REQUEST, 21/00 LBA out of range      LBA Out of Range
//	ErrInvalid        EINVAL     ILLEGAL REQUEST, 24/00 invalid field in CDB  Invalid Field in Command
//	ErrNotSupported   ENOTSUP    ILLEGAL REQUEST, 20/00 invalid opcode        Invalid Command Opcode
//	ErrUnavailable    EIO        NOT READY, 04/01 becoming ready (retry)      Namespace Not Ready (retry)
//	ErrShuttingDown   ESHUTDOWN  NOT READY, 04/00                             Namespace Not Ready
//	ErrIO, other      EIO        MEDIUM ERROR / HARDWARE ERROR                Internal Error
//
// Fenced and unavailable are classes of their own because a multipath host
// should fail over to another path for them, not give up on the device. (A
// single NVMe/TCP access node, with no other path to offer, sets DNR on the
// fenced status: package nvmf.)
package frontend
