package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/bgtask/bgtask/internal/testkit"
	"github.com/bgtask/bgtask/workers/shim"
)

// TestMain doubles as the shim: a server started in-process by a test starts its
// commands through its own binary, which in a test is this test binary, run as
// `bgtask.test shim ARGS`.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.ShimOrTests(shim.Main)) }
