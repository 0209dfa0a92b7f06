// Command agent runs inside a test host's guest: it opens the virtio-serial port
// named wire.PortName, says Ready, and runs each command the host sends with
// /bin/sh -c, in its own process group, answering with the exit status
// and the combined output (see package wire for the framing). Commands run
// concurrently. When the host says Poweroff, or the channel closes, the agent
// exits and the guest's /init syncs, unmounts and powers the machine off.
//
// It is built static (CGO_ENABLED=0) by package testhost and put into the
// initramfs; nothing else runs it.
package main
