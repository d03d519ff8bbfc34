package shim

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/internal/testkit"
)

// TestMain doubles as the shim, run as `shim.test shim ARGS`, so that tests run
// a real one.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.ShimOrTests(Main)) }
