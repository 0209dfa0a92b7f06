// Package nvmf is an NVMe over Fabrics target on the TCP transport binding
// (NVMe/TCP): the discovery subsystem and one I/O subsystem per volume
// (VolumeNQNPrefix + name, namespace 1), over frontend.Exports. A host
// connects to a subsystem, and sees it in the discovery log, only if
// Config.AllowedHosts and the volume's own list (Config.VolumeHostAllowed:
// the MDS's, for package access) both let it. What it implements and what
// is left is in docs/nvmf.md.
//
// # Files
//
//	proto.go   PDU types, flags, header lengths, opcodes, status codes, CRC32C
//	server.go  Config, Server (accept loops from frontend.Conns), controllers, keep-alive
//	conn.go    one connection = one queue: PDU framing, digests, R2T/H2CData, the writer
//	admin.go   Fabrics (Connect, Property Get/Set) and admin commands, log pages
//	discovery.go  the discovery log, its change notices, the rebuild loop
//	ana.go     ANA states (SetPaths), Asynchronous Event Requests and their notices
//	resize.go  online growth: the Changed Namespace List and its notices
//	groups.go  a group edited under connected controllers (regroup)
//	io.go      Read, Write, Compare, Write Zeroes, Flush, Dataset Management
//	reservations.go  Reservation Register/Report/Acquire/Release over a reservation.Store
//	resvnotify.go    reservation notifications: log page 80h, features 82h/83h, the watch loop
//
// # Goroutines and ownership
//
// Per connection: the reader (conn.Serve) reads PDUs, checks them and runs
// each command; admin and Fabrics commands complete inline, I/O commands are
// submitted to the backend, whose callbacks (any goroutine) queue the
// response (never blocking). One goroutine at a time writes the socket
// (conn.owner): with one command in flight and nobody writing, the goroutine
// queuing the response sends it with one non-blocking writev (no hand-off per
// IO at queue depth 1); otherwise, and for what such a write leaves, the
// writer goroutine sends the out queue, one writev per batch. The socket is
// read and written with raw system calls (package sockio). Per
// controller: a keep-alive goroutine that ends it (closing every queue's
// socket) when no command arrived for twice KATO plus KeepAliveGrace. The
// reader asks Config.MayWrite (an MDS round trip for package access) before a
// namespace's first write, inline (that queue's next commands wait for the
// answer); then once per MayWriteTTL in the background, the writes going on
// with the last answer meanwhile, so a slow MDS never holds IO (the
// namespace's frontend.WriteGate, which the iSCSI target shares). Per
// server: watchDiscovery, which rebuilds the discovery logs of the
// discovery controllers that enabled change notices every DiscoveryCheck
// and when SetPaths asks; watchReservations, which reads the namespaces'
// reservation states every ReservationCheck for notifications; both until
// Shutdown or Close.
//
// INVARIANT: a connection has at most its queue size (+4 slack) commands
// between capsule and response, each holding at most MaxTransfer of buffer,
// so its memory is bounded; the reader waits for every backend callback
// (conn.wg) before the writer is told to finish, and the controller's
// attachment is detached only by the last of its connections to end.
//
// # Wire format
//
// Every PDU starts with the 8-byte common header: type, flags (HDGSTF 0x01,
// DDGSTF 0x02, LAST 0x04, SUCCESS 0x08), HLEN, PDO, PLEN (little-endian).
// Then HLEN-8 bytes of PDU-specific header, the header digest (CRC32C of the
// HLEN bytes) if negotiated, padding up to PDO, the data, and the data digest
// (CRC32C of the data) if negotiated. Header lengths: ICReq/ICResp 128,
// CapsuleCmd 72 (the 64-byte SQE), CapsuleResp 24 (the 16-byte CQE), H2CData,
// C2HData, R2T and TermReq 24.
package nvmf
