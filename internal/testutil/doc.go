// Package testutil holds the few helpers that tests all over the tree share,
// so that each exists once:
//
//   - FreePort, FreeAddr and FreePortBase find TCP ports on 127.0.0.1 for
//     servers a test starts (an etcd, an MDS, a playground) when the server
//     must be told its address before it listens; they stay out of the
//     ephemeral range, so no outgoing connection takes them meanwhile.
//   - RequireTool skips a test, loudly and with the reason (which binary is
//     missing and which Debian package has it), when a tool it runs is not
//     installed: a test that cannot run never passes silently (STYLE.md,
//     principle 14).
//
// Only tests and test harnesses (internal/testcluster) import it: it imports
// package testing.
package testutil
