// Package nbd is basalt's NBD server: it serves the exports of a
// frontend.Exports (export name = volume name) over the Network Block Device
// protocol, fixed newstyle, as specified in the NBD project's doc/proto.md. One
// Server serves any number of listeners; TCP and Unix sockets work the same
// (Server.Serve(net.Listener)). It is a parser and a mapper: the export
// lifecycle, capabilities and error classes are package frontend's.
//
// # What is implemented
//
// Handshake (fixed newstyle only; oldstyle is not offered):
//
//	S: "NBDMAGIC" "IHAVEOPT" u16 handshake flags = FIXED_NEWSTYLE|NO_ZEROES
//	C: u32 client flags (bits other than C_FIXED_NEWSTYLE|C_NO_ZEROES: close)
//	C: "IHAVEOPT" u32 option u32 length, data        (repeated)
//	S: u64 0x3e889045565a9 u32 option u32 reply type u32 length, data
//
// Options: NBD_OPT_EXPORT_NAME (unknown export: close, as the spec demands),
// NBD_OPT_ABORT (ACK, close), NBD_OPT_LIST (one NBD_REP_SERVER per export, ACK;
// data → ERR_INVALID), NBD_OPT_INFO and NBD_OPT_GO (NBD_INFO_EXPORT always,
// NBD_INFO_NAME and NBD_INFO_DESCRIPTION when asked (the latter if the backend
// has a description), NBD_INFO_BLOCK_SIZE always; malformed data →
// ERR_INVALID, unknown export → ERR_UNKNOWN). NBD_OPT_INFO only describes the
// export (Exports.Describe, from metadata); NBD_OPT_GO and NBD_OPT_EXPORT_NAME
// attach the connection to it (Exports.Attach), and the connection detaches
// when it ends, after its last backend callback. NBD_OPT_STARTTLS: see "TLS"
// below. Everything else, including NBD_OPT_STRUCTURED_REPLY, is answered
// NBD_REP_ERR_UNSUP: replies are always simple replies. Option data is bounded (maxOptionLen, a
// 4 KiB name plus room); a longer option gets NBD_REP_ERR_TOO_BIG and the
// connection is closed, since its data is never read. The whole handshake has
// a deadline (Config.HandshakeTimeout, restarted per option) and at most
// maxOptions options.
//
// # TLS
//
// Each listener has a TLSPolicy (Server.ServeTLS; Serve is TLSOff). With
// TLSOff, NBD_OPT_STARTTLS gets NBD_REP_ERR_UNSUP. Otherwise the server
// answers NBD_REP_ACK and runs a TLS handshake with Config.TLS (basalt's is
// identity.Config.ServerTLS: TLS 1.3, a client certificate of the cluster CA,
// not revoked, of an allowed role); option haggling goes on through TLS and
// transmission stays in it. Failing the handshake closes the connection.
// NBD_OPT_STARTTLS with data, or after TLS, gets NBD_REP_ERR_INVALID; bytes
// the client sent behind it before the ACK close the connection (they were
// plaintext, and must not be read as if they came through TLS). With
// TLSRequire, before TLS every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT
// gets NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME closes the connection.
// While a TLS connection is in transmission, Config.TLSRecheck is asked about
// its peer every second and an error closes it (a revocation). c.nc stays
// the socket (deadlines, Close); c.stream, c.br and c.w speak through TLS.
//
// Transmission flags come from the export's frontend.Info: HAS_FLAGS,
// CAN_MULTI_CONN, SEND_FLUSH (CanFlush), and either READ_ONLY or SEND_FUA,
// SEND_TRIM and SEND_WRITE_ZEROES as far as the backend can do them. For a
// basalt volume that is all of them. CAN_MULTI_CONN is honest because every
// connection to a name shares one backend and every completed write is durable.
//
// Block sizes (NBD_INFO_BLOCK_SIZE): the backend's minimum (1 for a volume) and
// preferred (4096), and as maximum payload the smaller of the backend's maximum
// and Config.MaxPayload (32 MiB by default).
//
// Requests (28 bytes: u32 0x25609513, u16 flags, u16 type, u64 cookie, u64
// offset, u32 length, then length bytes for WRITE) are answered with simple
// replies (16 bytes: u32 0x67446698, u32 error, u64 cookie, then length bytes
// for a successful READ). Commands: READ, WRITE, FLUSH, TRIM, WRITE_ZEROES,
// DISC. Validation happens before the backend sees anything, in this order:
// unknown command → EINVAL; a flag other than FUA (if negotiated) or NO_HOLE
// (WRITE_ZEROES only) → EINVAL; FLUSH with offset or length, or not advertised
// → EINVAL; length 0 → EINVAL; beyond the end → ENOSPC for WRITE and
// WRITE_ZEROES, EINVAL otherwise; unaligned to the minimum block size →
// EINVAL; READ or WRITE longer than the maximum payload → EINVAL; a write-type
// command on a read-only export → EPERM; TRIM or WRITE_ZEROES not advertised →
// EINVAL; then, with Config.MayWrite (the CSI node plugin's own socket), a
// write-type command from a node the volume is not published to → EPERM
// (no answer from the MDS yet → EIO). A rejected WRITE's payload is read and discarded,
// so the stream stays in step; a WRITE whose length exceeds the maximum
// payload is answered EINVAL and then the connection is closed, because
// skipping up to 4 GiB is not worth the risk. A write whose payload is cut
// off by a disconnect is never submitted: no partial writes.
//
// A failed IO's error is classified by the export's Opener
// (Attachment.Classify) and its class becomes the NBD error value:
// frontend.ErrReadOnly and ErrFenced → EPERM, ErrNoSpace → ENOSPC,
// ErrOutOfRange and ErrInvalid → EINVAL, ErrNotSupported → ENOTSUP,
// ErrShuttingDown → ESHUTDOWN, anything else (ErrIO, ErrUnavailable) → EIO.
//
// # Connection state machine
//
//	accepted ──handshake──▶ options ──EXPORT_NAME / GO ok──▶ transmission
//	    │                     │  ABORT, bad magic/flags, too long,           │
//	    │                     │  deadline, Shutdown                          │
//	    ▼                     ▼                                              ▼
//	  closed ◀───────────────────────────────────────────── draining ─▶ closed
//
// In transmission, the reader ends on NBD_CMD_DISC or on Shutdown (graceful:
// every request already read is answered, then the socket closes), or on EOF,
// an I/O error or a bad request magic (hard: the socket closes at once and
// pending replies are dropped). Either way the connection waits until the
// backend has called back for every request it got, so no pooled buffer is
// reused while the backend may still touch it.
//
// # Goroutines and ownership
//
// Per connection there are two goroutines (three for a TLS connection with
// Config.TLSRecheck: recheckLoop, which only closes the socket) and no
// goroutine per request:
//
//   - the reader (started by Serve) runs the handshake, then parses requests,
//     validates them, reads write payloads into pooled buffers and calls
//     Backend.Submit. It owns the bufio.Reader and the handshake state.
//     Before reading each request header it takes an in-flight slot; with
//     Config.MaxInFlight slots taken (or the Config.MaxInFlightBytes payload
//     budget spent) it stops reading, which pushes back on the client through
//     TCP.
//   - the writer owns the socket's write side in transmission. Backend done
//     callbacks (on any goroutine) only push the finished request onto the
//     connection's reply channel, whose capacity equals the slot count, so
//     they never block. The writer takes every reply that is ready, writes the
//     batch with one writev (sockio.Writer), and only then returns buffers to
//     their pools and frees the slots. Replies therefore go out in completion
//     order, not request order. A batch that cannot be written within
//     Config.WriteTimeout (a client that stopped reading) ends the connection.
//
// INVARIANT: a request holds its slot from header read until the writer
// released it; waitIdle (inflight == 0) therefore means no callback and no
// buffer is outstanding.
//
// Shutdown (frontend.Conns) closes the listeners, closes connections still negotiating, and
// gives the others a read deadline shutdownGrace (100 ms) away: requests read
// until then are answered NBD_ESHUTDOWN (write payloads skipped), requests
// already submitted complete normally, the replies are flushed and the
// connection ends. If Shutdown's context ends first, the rest is closed hard.
// Close closes every socket at once; both still wait for the backend to call
// back for every submitted request.
//
// A graceful end (DISC, Shutdown, oversized write) half-closes the socket and
// reads until the client closes (at most lingerTimeout) before closing:
// closing with unread input would make the kernel reset the connection and
// could destroy replies the client has not read yet.
//
// TCP connections keep Go's default TCP_NODELAY, as the spec recommends.
package nbd
