// Package frontendtest is the in-memory storage the protocol servers' tests
// (nbd, iscsi, iscsi/scsi, nvmf, nvmfhost) run over: one Disk that implements
// frontend.Backend, and Disks, a frontend.Opener over a fixed set of them.
//
// A Disk checks the Backend contract that a protocol server promises
// (validated ranges, buffers of the right length, no mutation of a read-only
// device) and counts what it was asked to do, so a test can assert that a
// server refused a request before the backend saw it. Knobs make it fail,
// delay or hold IO (Fail, Delay, Gate), and Grow makes it larger while it is
// open, as a volume resize does.
//
// Only tests import it (tests/layering says so).
package frontendtest
