package engine_test

import (
	"errors"
	"testing"

	"github.com/bgtask/bgtask/engine"
)

// A task waits while a dependency has not ended; it runs once all ended as its
// policy needs, and is skipped, naming the dependency, when one did not succeed.
func TestDependenciesWaitRunOrSkip(t *testing.T) {
	t.Parallel()
	deps := map[string]engine.State{}
	task := func(id string) (engine.State, bool) { s, ok := deps[id]; return s, ok }
	spec := specAt(t, `{"command":"make","after":["a","b"]}`)
	if spec.AfterPolicy != engine.AfterSucceeded {
		t.Fatalf("after_policy %q, want succeeded by default", spec.AfterPolicy)
	}
	s := engine.State{ID: taskID, Spec: spec, Phase: engine.PhaseArmed}
	deps["a"] = engine.State{Phase: engine.PhaseFired, Status: engine.StatusSucceeded}
	deps["b"] = engine.State{Phase: engine.PhaseRunning}
	if wait, skip := s.Dependencies(task); !wait || skip != nil {
		t.Fatalf("b still runs: wait %v skip %v", wait, skip)
	}
	deps["b"] = engine.State{Phase: engine.PhaseFired, Status: engine.StatusFailed}
	wait, skip := s.Dependencies(task)
	if wait || skip == nil || skip.Dependency != "b" {
		t.Fatalf("b failed: wait %v skip %+v, want skipped naming b", wait, skip)
	}
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(engineWriter, *skip)
	if f.state.Phase != engine.PhaseEnded || f.state.Status != engine.StatusSkipped || f.state.Reason != "its dependency b ended failed, not succeeded" {
		t.Fatalf("skipped: %s %s %q", f.state.Phase, f.state.Status, f.state.Reason)
	}

	ended := s
	ended.Spec.AfterPolicy = engine.AfterEnded
	if wait, skip := ended.Dependencies(task); wait || skip != nil {
		t.Fatalf("after_policy ended, all ended: wait %v skip %v, want run", wait, skip)
	}
	var fe *engine.FieldError
	for raw, field := range map[string]string{
		`{"command":"x","after":["a b"]}`:                      "after",
		`{"command":"x","after":["a"],"after_policy":"maybe"}`: "after_policy",
		`{"command":"x","after_policy":"ended"}`:               "after_policy",
		`{"external":true,"after":["a"]}`:                      "after",
	} {
		if _, err := engine.ParseSpecAt([]byte(raw), t0); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want an error naming %s", raw, err, field)
		}
	}
}
