//go:build race

package exampletest

// raceEnabled reports whether the test binary runs with the race detector;
// the programs it builds then do too.
const raceEnabled = true
