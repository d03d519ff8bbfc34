// Package testkit is what the tests of every package share: which lane runs,
// and the one way to wait for a condition.
//
// The quick lane, the README's `go test -race ./...`, is the unit tests and a
// smoke test of the whole path (register, run, exit, fire, inbox) in minutes.
// The full lane, with BGTASK_TEST_FULL=1, adds what takes long or needs more
// than Go: real bgtask processes killed at chosen points, the fault trials,
// clusters, a headless Chromium, the agent runtimes' CLIs. CI runs both
// (.ci/run).
package testkit

import (
	"os"
	"testing"
	"time"
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

// Eventually polls cond until it holds, and fails the test if it does not
// within the time given. It is for a state that no event announces (a file, a
// process, a stream read from outside); where a part of bgtask can say it is
// done, wait for that instead.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
