// Package latency is the one bucket scheme of every latency histogram in
// basalt: the NBD front end's, the client library's, the chunkserver's and
// the Raft host's stage histograms all count into the same buckets, so a
// request's stages can be read side by side on one scale (docs/performance.md,
// "Where the time goes").
//
// The buckets double from 5 µs to about 42 s: 5 µs is below the fastest stage
// measured (a WAL write of one page), 42 s above the slowest worth telling
// apart (a propose → commit that waits out an election). 24 bounds, plus the
// implicit +Inf bucket.
package latency
