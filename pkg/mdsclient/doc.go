// Package mdsclient finds and calls the active MDS.
//
// Several MDS processes run; one is active (elected through etcd) and the
// others answer every RPC with gRPC Unavailable and the message "not the
// active MDS; active is ADDR". A Client holds one gRPC connection per
// address it was given (separately or comma-separated) and implements
// api.MDSClient: each call goes to the MDS that answered last; on Unavailable (a standby, or a dead or unreachable
// process) it tries the active address named in the standby's message when
// that address is one of its own, then the others in order, and remembers
// the one that answered. An attempt that hangs for AttemptTimeout (5 s)
// counts as unreachable; one that hangs until the call's own deadline ends
// the call, and (when it held the call 500 ms or more: a call given less time
// says nothing of the MDS) the next call starts at the next address (a paused or cut
// off MDS must not hold every call with a short deadline). When every address fails it backs off (100 ms
// growing to 1 s) and tries again until the call's context is done, or
// for RetryTimeout (15 s) when the context has no deadline — long enough to
// ride through an MDS failover. A call that ran out of time that way fails
// with the context's code (DeadlineExceeded or Canceled) and the last MDS
// error in its message.
//
// Every other error (InvalidArgument, NotFound, ...) is the MDS's answer and
// is returned as is. A call that failed with Unavailable after the request
// was sent may have been executed; creating calls then report AlreadyExists
// on the retry, which callers treat as they see fit.
//
// A Client is safe for concurrent use. It starts no goroutines of its own
// beyond those of its gRPC connections.
package mdsclient
