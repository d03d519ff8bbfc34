package workers

import (
	"testing"

	"github.com/bgtask/bgtask/engine"
)

// A run lets go of its spec's env once its command runs, unless a stall may
// start the command again (TestARespawnedCommandRunsInTheSpecsEnv).
func TestARunLetsGoOfItsEnvUnlessItMayRespawn(t *testing.T) {
	for _, c := range []struct {
		onStall string
		kept    bool
	}{{"", false}, {engine.OnStallKill, false}, {engine.OnStallNotify, false}, {engine.OnStallRespawn, true}} {
		r := &run{state: engine.State{Spec: engine.Spec{Command: "x", Env: map[string]string{"TOKEN": "t"}, OnStall: c.onStall}}}
		r.releaseEnv()
		if kept := r.state.Spec.Env["TOKEN"] == "t"; kept != c.kept {
			t.Errorf("on_stall %q: env kept %v, want %v", c.onStall, kept, c.kept)
		}
	}
}
