//go:build race

package raftstore

// raceEnabled: the race detector slows the simulation ~10x; long tests run fewer seeds.
const raceEnabled = true
