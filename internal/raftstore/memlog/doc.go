// Package memlog is an in-memory raftstore.LogStore built on raft.MemoryStorage, for
// tests of the raft host and of the packages above it. Everything saved is "durable"
// at once; a Log outlives the hosts that use it, so a test restarts a host by
// creating a new one on the same Log.
//
// Fault injection: FailSave makes Save return an error (a dying disk).
package memlog
