// Package e2e judges basalt with real clients nobody here wrote — fio (nbd engine,
// with verify), qemu-img and qemu-io, nbdinfo, nbdfuse with a loop device and ext4,
// and a real Linux kernel's NBD, NVMe/TCP and iSCSI initiators (Debian's kernel under
// QEMU, internal/testhost) with ext4, fio and dm-multipath — against a real `basalt playground` (MDS, etcd,
// three chunkserver processes, NBD). A test that needs a tool or kernel feature the
// machine lacks skips and says why.
package e2e
