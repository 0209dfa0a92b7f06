// Command agent runs inside a test host's guest: it opens the virtio-serial port
// named wire.PortName, says Ready, and runs each command the host
// sends with /bin/sh -c, in its own process group, answering with the exit status
// and the combined output (see package wire for the framing). Commands run
