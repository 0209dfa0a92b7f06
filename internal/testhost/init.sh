#!/bin/sh
# /init of a test host's guest (package testhost puts it into the initramfs).
# Mounts the kernel's file systems, loads the modules in /etc/testhost/modules,
# brings up QEMU's user-mode network (the host's loopback is 10.0.2.2; there is
# no default route, so nothing else is reachable), then runs the agent that
# executes the host's commands. When the agent exits: sync, unmount, power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
# The kernel runs this for the modules it asks for itself (fs-ext4, crypto-crc32c).
echo /sbin/modprobe >/proc/sys/kernel/modprobe
modprobe -a $(cat /etc/testhost/modules) || echo "testhost init: a module did not load (see above)"
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0
/sbin/testhost-agent
echo "testhost init: the agent exited; powering off"
sync
umount -a -r 2>/dev/null
poweroff -f
