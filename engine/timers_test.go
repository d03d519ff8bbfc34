package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
)

// storeReader reads a task's current state from the store itself.
type storeReader struct{ store events.Store }

func (r storeReader) Task(id string) (engine.State, bool) {
	s, err := engine.Load(context.Background(), r.store, id)
	return s, err == nil
}

func TestTimersEndATaskNoWorkerTookBeforeItsDeadline(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	svc := engine.NewService(store, "engine", engine.Base{})
	late, _, err := svc.Register(ctx, []byte(`{"command":"true","deadline":"200ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	taken, _, err := svc.Register(ctx, []byte(`{"command":"true","deadline":"200ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	timers := engine.NewTimers(store, storeReader{store}, "engine", engine.Base{})
	timers.TestSignals.Expired.Init(t)
	if err := timers.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer timers.Stop()
	var armed []engine.State
	for _, id := range []string{late, taken} {
		s, err := engine.Load(ctx, store, id)
		if err != nil {
			t.Fatal(err)
		}
		armed = append(armed, s)
	}
	// A worker takes the second task before its deadline: its timer, set from the
	// state the engine saw while it was armed, must find it taken and do nothing.
	// (Taken before the timers hear of it, so a slow machine cannot reorder the two.)
	ev, err := engine.Decide(armed[1], engine.Spawn{}, engine.Meta{Writer: "w1", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, ev, armed[1].Seq); err != nil {
		t.Fatal(err)
	}
	for _, s := range armed {
		timers.Notify(s)
	}

	ran := map[string]bool{}
	timers.TestSignals.Expired.WaitFor(20*time.Second, "both timers run", func(id string) bool {
		ran[id] = true
		return ran[late] && ran[taken]
	})
	s, err := engine.Load(ctx, store, late)
	if err != nil {
		t.Fatal(err)
	}
	if s.Phase != engine.PhaseEnded || s.Status != engine.StatusTimedOut {
		t.Fatalf("the expired task is %s %q, want ended timed_out", s.Phase, s.Status)
	}
	if s, _ := engine.Load(ctx, store, taken); s.Phase != engine.PhaseRunning {
		t.Fatalf("the task a worker took is %s, want running", s.Phase)
	}
}

// A timer fires at its time, once.
func TestTimersFireATimerAtItsTime(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	svc := engine.NewService(store, "engine", engine.Base{})
	id, _, err := svc.Register(ctx, []byte(`{"start_at":"300ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	armed, err := engine.Load(ctx, store, id)
	if err != nil {
		t.Fatal(err)
	}
	timers := engine.NewTimers(store, storeReader{store}, "engine", engine.Base{})
	timers.TestSignals.Expired.Init(t)
	if err := timers.Start(ctx); err != nil {
		t.Fatal(err)
	}
	timers.Notify(armed)
	timers.TestSignals.Expired.WaitFor(20*time.Second, "the timer run", nil)
	s, err := engine.Load(ctx, store, id)
	if err != nil {
		t.Fatal(err)
	}
	if s.Phase != engine.PhaseEnded || s.Status != engine.StatusSucceeded || s.EndedAt.Before(armed.Spec.StartTime()) {
		t.Fatalf("timer %s %s at %s, want ended succeeded at %s or after", s.Phase, s.Status, s.EndedAt, armed.Spec.StartAt)
	}
	timers.Stop() // waits for a fire in progress
	h, err := store.History(ctx, id)
	if err != nil || len(h) != 2 || h[1].Type != events.TypeDue {
		t.Fatalf("history: %d events, %v; want armed and one due", len(h), err)
	}
}
