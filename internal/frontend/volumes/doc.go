// Package volumes serves basalt volumes to the protocol front ends: it implements
// frontend.Exports on top of the client library, opening each volume once (on first
// use) and sharing that one client among every connection to it, which is what
// makes NBD's CAN_MULTI_CONN true.
package volumes
