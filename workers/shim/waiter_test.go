package shim_test

// The shims this test binary runs (TestMain) hibernate as bgtask-shim's do.
import _ "github.com/bgtask/bgtask/workers/shim/waiter"
