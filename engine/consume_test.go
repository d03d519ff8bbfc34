package engine_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
)

// Only a delivered wake-up can be consumed, once: the event names its inbox
// sequence, and the replay of the history is the live state.
func TestOnlyADeliveredWakeupIsConsumedOnce(t *testing.T) {
	t.Parallel()
	meta := func(f *fold) engine.Meta { return engine.Meta{Writer: engineWriter, Now: f.now} }
	for _, phase := range []engine.Phase{"", engine.PhaseArmed, engine.PhaseRunning, engine.PhaseEnded, engine.PhasePersisted, engine.PhaseCancelled} {
		f := build(t, phase)
		want := engine.ErrWrongPhase
		if phase == "" {
			want = engine.ErrNotFound
		}
		if _, err := engine.Decide(f.state, engine.Consume{}, meta(f)); !errors.Is(err, want) {
			t.Errorf("consume in phase %q: %v, want %v", phase, err, want)
		}
	}

	f := build(t, engine.PhaseFired)
	ev := f.do(engineWriter, engine.Consume{})
	if p, _ := ev.Decode(); p.(*events.Consumed).InboxSeq != 7 || !f.state.Consumed || f.state.Phase != engine.PhaseFired {
		t.Fatalf("consumed: %+v, state %s consumed %v", p, f.state.Phase, f.state.Consumed)
	}
	if _, err := engine.Decide(f.state, engine.Consume{}, meta(f)); !errors.Is(err, engine.ErrConsumed) {
		t.Fatalf("consumed twice: %v", err)
	}
	if got, _ := engine.Replay(f.history); !reflect.DeepEqual(got, f.state) {
		t.Fatalf("replay %+v\nlive %+v", got, f.state)
	}

	spec := specAt(t, `{"command":"true","wake_on":["failed"]}`)
	q := newFold(t, taskID, spec)
	q.do(engineWriter, engine.Arm{Spec: spec})
	q.do(workerA, engine.Spawn{})
	q.do(workerA, engine.Exit{Run: exitRun(0, "")})
	q.do(engineWriter, engine.PersistCompletion{})
	q.do(engineWriter, engine.Fire{Quiet: true})
	if _, err := engine.Decide(q.state, engine.Consume{}, meta(q)); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("consume of a quiet task: %v", err)
	}
}

// A consumed wake-up's pushes not made yet are not made (the sink is done, the
// task acknowledged); one in flight runs out.
func TestAConsumedWakeupIsNotPushed(t *testing.T) {
	t.Parallel()
	f := fired(t, taskID, `{"command":"true","deliver":[{"type":"webhook","url":"https://example.com/a"},{"type":"webhook","url":"https://example.com/b"}]}`)
	f.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	f.do(engineWriter, engine.Consume{})
	if k := f.state.Deliveries; k[0].Skipped || k[0].Claim == nil || !k[1].Skipped || f.state.Acknowledged() {
		t.Fatalf("after consume: %+v", k)
	}
	if _, err := engine.Decide(f.state, engine.ClaimDelivery{Sink: 1, Engine: me}, engine.Meta{Writer: engineWriter, Now: f.now}); !errors.Is(err, engine.ErrWrongPhase) {
		t.Fatalf("a push of the consumed wake-up claimed: %v", err)
	}
	if got, _ := engine.Replay(f.history); !reflect.DeepEqual(got, f.state) {
		t.Fatalf("replay %+v\nlive %+v", got, f.state)
	}
}
