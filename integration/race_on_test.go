//go:build race

package integration

// raceEnabled builds the binary under test with the race detector when the tests
// run with it: it reuses the packages `go test -race` already compiled.
const raceEnabled = true
