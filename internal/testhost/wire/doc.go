// Package wire is the framing on the command channel between a test host and
// the agent in its guest: one virtio-serial port, a byte stream both ways.
//
// A frame is a 12-byte header followed by its payload:
//
//	offset size  field
//	0      2     magic "bh"
//	2      1     kind (Kind)
//	3      1     zero
//	4      4     id, big-endian: the command a frame belongs to (0 for Ready and Poweroff)
//	8      4     payload length, big-endian, at most MaxPayload
//
// The host sends Run (payload: a shell script), Cancel (kill command id's process
// group) and Poweroff. The agent sends Ready once when it starts (payload: the
// guest's uptime in seconds, as /proc/uptime's first field) and one Result per
// Run (payload: 4-byte big-endian exit status, then the command's combined
// stdout and stderr). Output is length-prefixed, so it may hold any bytes; a
// command's output and status cannot be confused with the next frame.
package wire
