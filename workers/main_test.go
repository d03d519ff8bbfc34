package workers_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every worker, process waiter and NATS client a test starts must be gone when the
// tests end: Worker.Stop and the servers' cleanups leave nothing behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
