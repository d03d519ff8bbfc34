// Package testlane says which lane of the tests runs. The quick lane, the
// README's `go test -race ./...`, is the unit tests and a smoke test of the whole
// path (register, run, exit, fire, inbox) in minutes. The full lane, with
// BGTASK_TEST_FULL=1, adds what takes long or needs more than Go: real bgtask
// processes killed at chosen points, the fault trials, clusters, a headless
// Chromium, the agent runtimes' CLIs. CI runs both (.ci/run).
package testlane

import (
	"os"
	"testing"
)

// Env is the variable that asks for the full lane.
const Env = "BGTASK_TEST_FULL"

// Full reports whether the full lane runs.
func Full() bool { return os.Getenv(Env) == "1" }

// FullOnly skips a test of the full lane in the quick one.
func FullOnly(t testing.TB) {
	t.Helper()
	if !Full() {
		t.Skip("a test of the full lane: run it with " + Env + "=1")
	}
}
