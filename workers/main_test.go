package workers_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers/shim"
)

// TestMain doubles as the shim: workers without a bgtask-shim beside their binary
// start commands through their own binary, which in a test is this test binary,
// run as `workers.test shim ARGS`.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.ShimOrTests(shim.Main)) }
