package shim

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain doubles as the shim, run as `shim.test shim ARGS`, so that tests run
// a real one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		if err := Main(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "shim:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// The shims are this binary; built with -race it would wait a second at every exit.
	os.Setenv("GORACE", "atexit_sleep_ms=0 halt_on_error=1")
	goleak.VerifyTestMain(m)
}
