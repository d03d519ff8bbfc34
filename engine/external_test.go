package engine_test

import (
	"errors"
	"testing"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// An external task runs nothing and ends when completed from outside, with the
// status and result it is given, once.
func TestAnExternalTaskEndsWhenCompletedFromOutside(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"external":true,"deadline":"1h","target":"ci"}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	if _, err := engine.Decide(f.state, engine.Spawn{}, engine.Meta{Writer: workerA, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("an external task spawned: %v", err)
	}
	var fe *engine.FieldError
	if _, err := engine.Decide(f.state, engine.Complete{Status: "maybe"}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.As(err, &fe) || fe.Field != "status" {
		t.Fatalf("complete with a bad status: %v, want an error naming status", err)
	}
	f.do(engineWriter, engine.Complete{Result: "ci green"})
	if _, err := engine.Decide(f.state, engine.Complete{}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.Is(err, engine.ErrFinished) {
		t.Fatalf("completed twice: %v", err)
	}
	f.do(engineWriter, engine.PersistCompletion{})
	w := f.state.Wakeup
	if w.Status != engine.StatusSucceeded || w.Result != "ci green" || w.Prompt != "Task task-1 succeeded.\nReason: completed from outside\nResult: ci green\n" {
		t.Fatalf("wake-up: %+v", w)
	}
}

// Completing a running task ends it: its worker's exit after that does not fit.
func TestACompletionRacingTheExitDecidesOnce(t *testing.T) {
	t.Parallel()
	f := build(t, engine.PhaseRunning)
	f.do(engineWriter, engine.Complete{Status: engine.StatusFailed, Result: "raced"})
	if f.state.Phase != engine.PhaseEnded || f.state.Status != engine.StatusFailed {
		t.Fatalf("after complete: %s %s", f.state.Phase, f.state.Status)
	}
	if _, err := engine.Decide(f.state, engine.Exit{Run: exitRun(0, "")}, engine.Meta{Writer: workerA, Now: f.now}); err == nil {
		t.Fatal("the worker's exit was decided after the completion")
	}
}

// An outcome the spec's wake_on does not name fires quietly: done, nothing
// delivered, no push.
func TestAnOutcomeWakeOnDoesNotNameFiresQuietly(t *testing.T) {
	t.Parallel()
	spec := specAt(t, `{"command":"true","wake_on":["failed"],"deliver":[{"type":"webhook","url":"https://example.com/h"}]}`)
	f := newFold(t, taskID, spec)
	f.do(engineWriter, engine.Arm{Spec: spec})
	f.do(workerA, engine.Spawn{})
	f.do(workerA, engine.Exit{Run: exitRun(0, "")})
	f.do(engineWriter, engine.PersistCompletion{})
	if _, err := engine.Decide(f.state, engine.Fire{InboxSeq: 3}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a delivery of an outcome wake_on does not name: %v", err)
	}
	ev := f.do(engineWriter, engine.Fire{Quiet: true})
	p, _ := ev.Decode()
	if !p.(*events.Fired).Quiet || f.state.Phase != engine.PhaseFired || !f.state.Quiet || len(f.state.Deliveries) != 0 {
		t.Fatalf("quiet fire: %+v, state %s quiet %v deliveries %d", p, f.state.Phase, f.state.Quiet, len(f.state.Deliveries))
	}
	if _, err := engine.ParseSpecAt([]byte(`{"command":"x","wake_on":["cancelled"]}`), t0); err == nil {
		t.Fatal("wake_on cancelled accepted: a cancelled task wakes no one anyway")
	}
}
