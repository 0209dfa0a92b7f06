package playground

import (
	"fmt"
	"io"
	"net"
	"strings"
)

func printWelcome(w io.Writer, st *State) {
	host, port, err := net.SplitHostPort(st.NVMf)
	if err != nil {
		host, port = st.NVMf, "4420"
	}
	nbdHost, nbdPort, err := net.SplitHostPort(st.NBD)
	if err != nil {
		nbdHost, nbdPort = st.NBD, "10809"
	}
	var cs strings.Builder
	for _, c := range st.Chunkservers {
		fmt.Fprintf(&cs, "  chunkserver %d  %-16s pid %-7d log %s\n", c.Index, c.Addr, c.PID, c.Log)
	}
	fmt.Fprintf(w, `
basalt playground is running.

  MDS            %s   (etcd %s)
%s  NBD            %s   and unix socket %s
  NVMe/TCP       %s   subsystem %s
  iSCSI          portal %s, target %s, LUN 0
  volume         %s (%d bytes, 3 replicas)
  state file     %s/playground.json
  certificates   %s   (admin: %s)

Try it (in another terminal):

  nbdinfo '%s'
  qemu-img convert -p -n -f raw -O raw some.img '%s'
  fio --name=randwrite --ioengine=nbd --uri='%s' --rw=randwrite --bs=4k \
      --iodepth=32 --size=1g --runtime=20 --time_based
  iscsi-inq '%s'
  qemu-img convert -p -n -f raw -O raw some.img '%s'
  basalt status --mds %s --tls-dir %s

NBD over TLS (nbds://; the client certificate is in %s; the TCP
listener's policy is %s, --nbd-tls-policy require refuses plaintext):

  nbdinfo '%s'
  nbdcopy some.img '%s'
  qemu-img convert -p -n -f raw --object tls-creds-x509,id=tls0,dir=%s,endpoint=client \
      --target-image-opts some.img driver=nbd,host=%s,port=%s,export=%s,tls-creds=tls0

Put ext4 on it (as root):

  mkdir -p /tmp/basalt-nbd /mnt/basalt
  nbdfuse /tmp/basalt-nbd '%s' &
  losetup -f --show /tmp/basalt-nbd/nbd        # prints /dev/loopN
  mkfs.ext4 /dev/loopN && mount /dev/loopN /mnt/basalt

Or attach it with the kernel's NVMe/TCP initiator (as root; nvme-cli):

  modprobe nvme-tcp
  nvme discover -t tcp -a %s -s %s
  nvme connect -t tcp -a %s -s %s -n %s     # then /dev/nvmeXn1

Kill a chunkserver and watch IO go on:  kill -9 <pid>   (restart: see restart_cmd in playground.json)

Ctrl-C stops everything; running the same command again brings the data back.
`, st.MDS, st.Etcd, cs.String(), st.NBD, st.NBDSocket, st.NVMf, st.NVMfNQN, st.ISCSI, st.ISCSITarget, st.Volume, st.Size, st.Dir,
		st.TLSDir, st.AdminCert,
		st.NBDURI, st.NBDURI, st.NBDUnixURI, st.ISCSIURI, st.ISCSIURI, st.MDS, st.TLSDir,
		st.NBDClientDir, st.NBDTLS, st.NBDSURI, st.NBDSURI, st.NBDClientDir, nbdHost, nbdPort, st.Volume,
		st.NBDUnixURI, host, port, host, port, st.NVMfNQN)
}
