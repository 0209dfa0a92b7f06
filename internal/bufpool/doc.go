// Package bufpool is the one pool of data buffers on the data path: the
// transport server's request payloads, the chunkserver's read buffers, the
// NBD server's request buffers.
//
// Buffers come in power-of-two size classes from 4 KiB to 64 MiB (the largest
// frame payload), each a sync.Pool, so that a 4 KiB write and a 4 MiB write
// each reuse buffers of their own size and a large buffer never serves a small
// request. A buffer is handed out and taken back as a *[]byte: the pointer is
// what the sync.Pool holds, so neither Get nor Put allocates once the pool is
// warm. Requests larger than the largest class are plain allocations that Put
// leaves to the garbage collector.
//
// A buffer put back must not be used again; under the race detector Put fills
// it with Poison, so that the tests catch a use after Put wherever it is.
package bufpool
