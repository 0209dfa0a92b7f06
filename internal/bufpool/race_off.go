//go:build !race

package bufpool

// raceEnabled: the race detector is on (see race_on.go).
const raceEnabled = false
