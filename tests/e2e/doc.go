// Package e2e judges basalt with real clients nobody here wrote — fio (nbd engine,
// with verify), qemu-img and qemu-io, nbdinfo, nbdfuse with a loop device and ext4,
// and a real Linux kernel's NBD client (Debian's kernel under QEMU, internal/testhost)
// with ext4 and fio on /dev/nbd0 — against a real `basalt playground` (MDS, etcd,
// three chunkserver processes, NBD). A test that needs a tool or kernel feature the
// machine lacks skips and says why.
package e2e
