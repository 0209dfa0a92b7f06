// Package testhost boots a real Linux host for tests: Debian's kernel
// (linux-image-amd64, 6.1) under QEMU, with an initramfs holding busybox and
// the tools a test names, and runs shell commands in it. The block front ends'
// end-to-end tests use it as their judge: a real kernel's NBD, NVMe/TCP or
// iSCSI initiator, file systems and fio, against a basalt cluster on this host.
//
//	h := testhost.Start(t, testhost.Config{
//		Tools:   []string{"nbd-client", "mkfs.ext4", "fio"},
//		Modules: []string{"nbd", "ext4"},
//	})
//	out, err := h.Run(ctx, "nbd-client 10.0.2.2 10809 /dev/nbd0 -N demo && mkfs.ext4 -q /dev/nbd0")
//
// # What it is made of
//
// The kernel. scripts/install-deps runs scripts/fetch-test-kernel, which
// downloads Debian's kernel package with apt-get download and extracts it with
// dpkg-deb -x under CacheDir/kernel (default .cache/testhost in the repository;
// nothing is installed on this machine). Debian ships the modules uncompressed
// and without modules.dep, so the script runs depmod -b.
//
// The initramfs. Built here as a newc cpio archive (cpio.go), uncompressed (the
// kernel unpacks it faster than it would decompress it under emulation), from
// files of this machine's Debian packages: each tool of Config.Tools with the
// shared libraries ldd lists and the files its package installs for it
// (toolFiles), kmod as /sbin/modprobe, busybox for every other command, the
// modules of Config.Modules with everything they depend on hard or soft (ext4
// brings crc32c, which metadata checksums need), depmod's index, the agent and
// /init (init.sh). Paths mirror the host's merged /usr. The archive is cached
// under CacheDir/initramfs by a hash of its whole content, so a second boot
// with the same tools reuses it; the six most recently used are kept.
//
// The machine. QEMU with TCG (-accel tcg,thread=multi): /dev/kvm opens on these
// machines, but a nested KVM guest hangs right after the boot loader. -cpu max
// gives the guest SSE4.2 (crc32c in one instruction, for ext4 and fio verify).
// The serial port is the console, output only: a 16550 drops input beyond its
// 16-byte FIFO, so commands travel on a virtio-serial port instead. QEMU's
// user-mode network gives the guest 10.0.2.15 and maps 10.0.2.2 to this host's
// loopback, so the guest reaches servers listening on 127.0.0.1; the traffic
// stays inside QEMU, and the guest has no default route. Config.Forward goes the
// other way: a port of this host's loopback forwarded to a guest port, so a
// test reaches a server in the guest (the CSI node plugin's gRPC).
//
// # The command channel
//
// /init loads the modules, brings up the network and starts the agent
// (./agent), which opens the virtio-serial port and says Ready. Each Run sends
// the script; the agent runs it with /bin/sh -c in its own process group and
// answers with the exit status and the combined output, length-prefixed (the
// framing is package wire), so output can hold any bytes and never blurs into
// the status. Commands run concurrently; a Run whose context ends kills its
// command's process group. Shutdown sends Poweroff: the agent exits, /init
// syncs, unmounts and powers off, and QEMU exits; anything else (a panic, a
// guest that does not stop) is an error that carries the end of the console.
//
// # Costs, measured on the 2-core CI machine
//
// The guest is ready 6.7-7.3 s after QEMU starts on a quiet machine (the kernel
// reaches /init about 3 s into its own clock) and 10-17 s when other work
// shares the two cores. The initramfs with nbd-client, mkfs.ext4 and fio is
// 95 MiB (fio's libraries are most of it; 20 MiB without fio). Emulation costs
// QEMU about 1.3 ms of CPU per 4 KiB write through the kernel's NBD client
// (basalt itself, three replicas, about 0.64 ms), so fio in the guest writes at
// most about 1,000 IOPS here, and 300-500 under load: slow, but a real kernel.
//
// Where QEMU, the kernel or a named tool is missing, Boot returns an error
// wrapping ErrUnavailable that names what is missing, and Start skips the test
// with it.
package testhost
