// Package bench runs basalt's fio benchmark matrix: the same fio jobs, in one run,
// against the raw disk, against nbdkit's file plugin and against basalt volumes, and
// prints one markdown table that puts them side by side (issue 4, docs/design.md §12).
//
// # Targets
//
//   - raw: a file on the same file system as the bench directory, preallocated
//     (fallocate) and written once, driven with ioengine=libaio, direct=1. The 4 KiB
//     QD1 random write also runs with fdatasync=1 as the row "raw-fdatasync": the
//     floor of one durable write on this disk.
//   - nbdkit: `nbdkit --unix SOCK --foreground file FILE` (buffered, never syncs
//     unless asked) driven with ioengine=nbd over the Unix socket: the cost of the
//     NBD protocol with no replication and no durability.
//   - basalt-r3: a 3-replica volume of a `basalt playground` started as a child
//     process on a bench-owned directory and free ports, through the playground's
//     NBD Unix socket.
//   - basalt-r1: a 1-replica volume in the pool "local", created through the MDS
//     gRPC API on the same playground (export name = volume name). When the
//     playground's chunkservers serve NBD in process (playground.json records an
//     nbd_socket per chunkserver), the pool gets one copyset, so the whole volume
//     sits on one chunkserver, and fio uses that chunkserver's socket: the local
//     fast path (docs/design.md §7, §9). Otherwise the row goes through the playground's NBD
//     socket like basalt-r3 and pays the hop from the front end to the chunkserver;
//     the report's notes say which it was.
//
// Every target is first written sequentially (1 MiB writes, QD8) over the whole
// working set, so reads hit data, not holes.
//
// # What the columns mean
//
// Each job is one fio process (numjobs=1, time_based, after a ramp that fio leaves
// out of its statistics). IOPS and MiB/s are fio's. Latency is fio's total latency
// (lat_ns: submission to completion): the mean and the 99th percentile, the latter
// from lat_percentiles=1. Jobs that mix reads and writes run with
// unified_rw_reporting=mixed so the percentile covers every IO. The durable row
// (fdatasync=1 with libaio) is special: fio issues the fdatasync while the write is
// still in flight, so the two latencies overlap; its mean is the time per durable
// write at QD1 (1/IOPS) and its p99 is the write p99 plus the sync p99, an upper
// bound.
//
// For basalt rows the ratios compare with the raw and nbdkit rows of the same job:
// IOPS as target/baseline, and for QD1 jobs mean latency as target/baseline. The CPU
// column is the user+system CPU time (utime+stime in /proc/PID/stat) that the
// playground process (MDS, etcd, NBD front end) and every chunkserver used between
// the end of the ramp and the end of the job, per 10,000 IOs that fio completed in
// that window. Peak RSS is the sum of their VmHWM (/proc/PID/status) when the job
// ended: a high-water mark over each process's life so far, not just this job.
package bench
