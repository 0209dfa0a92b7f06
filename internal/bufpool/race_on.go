//go:build race

package bufpool

// raceEnabled: the race detector is on (the test command's -race runs). Then
// sync.Pool drops a random share of Puts, and Put poisons what it keeps.
const raceEnabled = true
