// Package testkit is what the tests of every package share: which lane runs,
// the one way to wait for a condition, and the TestMain of a package whose
// tests run servers and workers in their own process.
//
// The quick lane, the README's `go test -race ./...`, is the unit tests and a
// smoke test of the whole path (register, run, exit, fire, inbox) in minutes.
// The full lane, with BGTASK_TEST_FULL=1, adds what takes long or needs more
// than Go: real bgtask processes killed at chosen points, the fault trials,
// clusters, a headless Chromium, the agent runtimes' CLIs. CI runs both
// (.ci/run).
package testkit

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
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

// ShimOrTests begins the TestMain of a package whose tests start bgtask
// servers or workers in their own process: those start their commands through
// their own binary, `PKG.test shim ARGS`, which runs shimMain (shim.Main) here
// and exits. Run as the tests, the binary leaves out the race detector's second
// at each shim's exit and gives the tests a HOME of their own (no test reads
// this machine's login profile, which a worker asks for its environment, or
// writes in its user's home; a test that needs its own home sets it again).
// The option it returns removes that home: give it to goleak.VerifyTestMain.
func ShimOrTests(shimMain func(args []string) error) goleak.Option {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		if err := shimMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "shim:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Setenv("GORACE", "atexit_sleep_ms=0 halt_on_error=1")
	home, err := os.MkdirTemp("", "bgtask-test-home-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("HOME", home)
	return goleak.Cleanup(func(code int) {
		os.RemoveAll(home)
		os.Exit(code)
	})
}

// FreePort is a loopback TCP port nothing listens on now (another process may
// take it before the test does).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
