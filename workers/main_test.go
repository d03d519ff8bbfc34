package workers_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/workers/shim"
	_ "github.com/bgtask/bgtask/workers/shim/waiter" // its shims hibernate, as bgtask-shim's do
)

// TestMain doubles as the shim: workers without a bgtask-shim beside their binary
// start commands through their own binary, which in a test is this test binary,
// run as `workers.test shim ARGS`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		if err := shim.Main(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "shim:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// The shims are this binary; built with -race it would wait a second at every exit.
	os.Setenv("GORACE", "atexit_sleep_ms=0 halt_on_error=1")
	// No test reads this machine's profile (the login shell a worker asks for its
	// environment) or writes in its user's home: HOME is a directory of the run's
	// own, which a test that needs a home of its own sets again.
	home, err := os.MkdirTemp("", "bgtask-test-home-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("HOME", home)
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(home)
		os.Exit(code)
	}))
}
