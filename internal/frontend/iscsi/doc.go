// Package iscsi is basalt's iSCSI target (RFC 7143) over the shared access
// layer (package frontend): one target per volume, named
// iqn.2026-11.io.basalt:CLUSTER:VOLUME, with the volume as LUN 0. The SCSI
// command set is package scsi's; this package is the transport: PDUs, login,
// sessions and the full feature phase.
//
// # Wire format
//
// A PDU is a 48-byte Basic Header Segment (opcode in byte 0 with the
// immediate bit 0x40; DataSegmentLength in bytes 5-7; ITT in 16-19), any
// Additional Header Segments (TotalAHSLength words, byte 4), an optional
// CRC32C header digest, the data segment padded to 4 bytes, and an optional
// CRC32C data digest. Digests are little-endian on the wire (as the Linux
// initiator and libiscsi send them) and start with the first PDU after the
// login's last response. readPDU bounds the data segment by the
// MaxRecvDataSegmentLength this target declared.
//
// # Login
//
// conn.login runs the login phase under one deadline (Config.LoginTimeout,
// which also bounds opening the volume). The first request names the
// initiator, the session type (Normal or Discovery) and, for a normal
// session, the target; an unknown target is refused with 0x0203 (not
// found), an initiator off Config.Initiators with 0x0202 (authorization
// failure). With Config.CHAP set, a normal session must pass CHAP in the
// security stage (MD5, SHA-1 or SHA-256, whichever the initiator lists first;
// one-way, or mutual when the initiator sends CHAP_I and CHAP_C), else 0x0201
// (authentication failure). Operational keys are negotiated by RFC 7143
// section 13's rules; this target asks for ErrorRecoveryLevel 0, one
// connection per session, MaxOutstandingR2T 1 and in-order data. Secrets are
// never logged.
//
// # Full feature phase: goroutines and ownership
//
//   - The reader (the connection's Serve goroutine) owns the socket's read
//     side, the login state, the CmdSN window (ExpCmdSN, an atomic the writer
//     reads) and each task's data phase (buffer, R2T state) until the task
//     executes.
//   - The writer (one goroutine) owns the write side and StatSN: it stamps
//     StatSN, ExpCmdSN and MaxCmdSN into each PDU as it writes it.
//   - Backend completions (any goroutine) build a task's Data-In and SCSI
//     Response PDUs and queue them; they never block.
//
// conn.mu guards the output queue, the task table and the session's buffer
// budget. INVARIANT: a task's charge (its Data-Out or Data-In buffer) is held
// from the command's arrival until its response was written; a command that
// would pass Config.MaxSessionBytes while others hold buffers is answered
// TASK SET FULL, so a session never buffers more than the budget plus one
// command. The reader waits when it has queued more than maxQueued PDUs of
// its own (R2Ts, NOP-Ins, rejects), so an initiator that does not read cannot
// grow the queue either.
//
// The socket is read and written with package sockio's raw system calls
// (as the NBD front end does): the writer sends each batch of PDUs with one
// writev, headers from its own buffer and data segments where they lie. A
// task carries its response PDUs, queue item and callbacks, and is reused:
// once its response is written (task.release) it goes on the connection's
// free list for the reader, so nothing may keep a task past its release —
// a task management function waiting for one keeps a channel
// (conn.waitChans). A 4 KiB read makes no garbage in the target.
//
// Commands run as soon as their data is in (several at once, answered out of
// order). Non-immediate commands must arrive in CmdSN order; others are
// ignored (RFC 7143 4.2.2.1). MaxCmdSN closes the window while
// Config.MaxCommands commands are in flight.
//
// # Fenced initiators
//
// With Config.MayWrite (package access: the volume's attachment in the MDS
// names the initiator that may write), each session's LU asks it through a
// frontend.WriteGate before the session's first command that writes —
// inline, on the reader, so that session's next commands wait for the
// answer — and then once per MayWriteTTL in the background, writes going on
// with the last answer. A refused write is DATA PROTECT, WRITE PROTECTED
// (package scsi's senseFenced says why that status); reads go on.
//
// # Bad input
//
// A PDU that cannot be parsed, a header digest mismatch, Data-Out that does
// not match the R2T it answers (offset, length, target transfer tag) or an
// oversized data segment closes only that connection, with a log line; a
// data digest mismatch or a PDU that is not valid in the session (a SCSI
// command in a discovery session, SNACK, a command under a task tag in use)
// is answered with a Reject. A Data-Out with the wrong DataSN is a lost PDU
// (RFC 7143 7.9): the rest of its sequence is dropped and the command ends
// in CHECK CONDITION (ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR) without
// running, the connection serving on. Commands in the backend when a
// connection ends still complete before its session detaches.
//
// # Task management
//
// ABORT TASK finds the task by its tag and RefCmdSN (a reused tag does not
// abort the newer command); a task in the backend is aborted (it gets no
// response; the TMF response waits until it left the backend), one answered
// already is "task does not exist", and a RefCmdSN in the window not received
// yet is "function complete" and that command, when it comes, does not run
// (RFC 7143 11.6.1). The other TMFs abort every task of the session.
package iscsi
