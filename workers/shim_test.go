package workers_test

import (
	"testing"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/workers/shim"
)

// The shim imports nothing of bgtask's (it must stay small), so the names it
// shares with the engine are written twice; they must say the same.
func TestTheShimSpeaksTheEnginesWords(t *testing.T) {
	for _, c := range []struct{ shim, engine string }{
		{shim.StoppedByDeadline, events.StoppedByDeadline},
		{shim.StoppedByStall, events.StoppedByStall},
		{shim.CrashEnv, engine.CrashEnv},
		{shim.CrashAfterStart, engine.CrashShimAfterStart},
	} {
		if c.shim != c.engine {
			t.Errorf("shim says %q where the engine says %q", c.shim, c.engine)
		}
	}
}
