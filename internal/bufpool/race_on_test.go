//go:build race

package bufpool

// raceEnabled: under the race detector sync.Pool drops a random share of Puts.
const raceEnabled = true
