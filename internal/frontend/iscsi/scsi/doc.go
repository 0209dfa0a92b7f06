// Package scsi is the SCSI block command set (SPC-4, SBC-3) of basalt's iSCSI
// target: one direct-access logical unit over a frontend.Backend.
//
// Decode parses a CDB on its own (no device state): the operation, where its
// data flows and how many bytes, and the fields Execute needs; reserved and
// unsupported fields (protection information, NACA, ANCHOR) are refused there
// with ILLEGAL REQUEST, INVALID FIELD IN CDB and a field pointer. Execute then
// checks the command against the device (LBA range, read-only, the maximum
// transfer) and runs it: READ and WRITE go to the backend's Submit directly
// (no goroutine per IO); commands made of several backend IOs (VERIFY with
// BYTCHK, WRITE SAME, UNMAP, COMPARE AND WRITE) run on a goroutine each.
//
// Served: TEST UNIT READY, REQUEST SENSE, INQUIRY (standard data and VPD pages
// 0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2), MODE SENSE(6/10) (caching, control and
// informational exceptions pages; nothing changeable), MODE SELECT(6/10)
// (the current values back: GOOD; any change refused), START STOP UNIT (a
// no-op), READ CAPACITY(10/16), READ/WRITE(6/10/12/16), WRITE AND VERIFY and
// VERIFY(10/12/16), SYNCHRONIZE CACHE(10/16), PRE-FETCH(10/16) (a no-op), WRITE SAME(10/16) with UNMAP and
// NDOB, UNMAP, GET LBA STATUS, COMPARE AND WRITE, REPORT LUNS, REPORT
// SUPPORTED OPERATION CODES and, with Config.PR, PERSISTENT RESERVE IN/OUT
// (pr.go: the state is a reservation.Store's, every command is checked
// against it, and the attentions a change raised become unit attentions). Anything else is ILLEGAL REQUEST, INVALID COMMAND
// OPERATION CODE.
//
// Semantics worth knowing:
//   - Every completed write is durable (frontend.Backend), so the caching page
//     says write-through, FUA needs no extra work and WRITE AND VERIFY is a
//     WRITE.
//   - Unmapped blocks read as zeros (api.OpTrim), so READ CAPACITY(16) sets
//     LBPME and LBPRZ when the backend can trim.
//   - GET LBA STATUS answers from the backend's map (frontend.Mapper: for a
//     basalt volume, the chunk files' data extents on each chunk's leader):
//     blocks without data are deallocated. Without a map, every block is
//     mapped.
//   - COMPARE AND WRITE is the backend's (frontend.CompareAndWriter): for a
//     basalt volume the chunk's copyset leader compares and logs the write,
//     atomically against every other IO from any access node
//     (docs/iscsi.md). Its MAXIMUM COMPARE AND WRITE LENGTH is one block, so
//     it never straddles a chunk. A backend without the ability does not
//     serve the command (INVALID COMMAND OPERATION CODE).
//   - Unit attentions, per session (one LU per I_T nexus, the export's LUs
//     in a Group): BUS DEVICE RESET FUNCTION OCCURRED on every session after
//     a LUN or target reset through any of them, CAPACITY DATA HAS CHANGED
//     once the size a session last saw changed. None at login (power on):
//     nothing was reset for a new session, and clients retry on one anyway.
//     Reported once, on the next command other than INQUIRY and REPORT LUNS;
//     REQUEST SENSE returns it as its data.
//   - With Config.MayWrite, every command that writes (WRITE, WRITE AND
//     VERIFY, WRITE SAME, UNMAP, COMPARE AND WRITE) asks it first: an
//     initiator that may not write (fenced: the volume was published to
//     another node) gets DATA PROTECT, WRITE PROTECTED, as for a read-only
//     LU, and its reads go on.
//   - No protection information.
//
// IO failures map to sense data by their frontend error class (ErrorSense;
// the table is in package frontend's doc).
package scsi
