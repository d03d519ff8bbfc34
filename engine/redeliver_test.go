package engine_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/testkit"
)

// redelivered decides Redeliver on f's task and returns the sinks its event
// names.
func redelivered(t *testing.T, f *fold, c engine.Redeliver) []int {
	t.Helper()
	ev := f.do(engineWriter, c)
	p, err := ev.Decode()
	if err != nil {
		t.Fatal(err)
	}
	return p.(*events.RedeliveryRequested).Sinks
}

// refused checks that Redeliver c is refused by f's task with an error of type
// E naming field, whose reason says says.
func refusedRedeliver[E interface {
	*engine.StateError | *engine.FieldError
	error
}](t *testing.T, f *fold, c engine.Redeliver, field, says string) {
	t.Helper()
	_, err := engine.Decide(f.state, c, engine.Meta{Writer: engineWriter, Now: f.now})
	var e E
	if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), field+": ") || !strings.Contains(err.Error(), says) {
		t.Fatalf("Redeliver %+v: %v, want a %T naming %s that says %q", c, err, e, field, says)
	}
}

// A redelivery starts a push that was done over: by default the pushes that gave
// up, else all of them; one sink if named. The push is retried again as its sink
// says, its max_attempts counted from the redelivery, until it is delivered or
// gives up again. A push that is not done is refused, naming it.
func TestARedeliveryStartsADonePushOver(t *testing.T) {
	t.Parallel()
	f := fired(t, taskID, `{"command":"true","deliver":[`+
		`{"type":"webhook","url":"https://example.com/a","max_attempts":2},{"type":"webhook","url":"https://example.com/b"}]}`)
	refusedRedeliver[*engine.StateError](t, f, engine.Redeliver{}, "id", "push 0 is not made yet, push 1 is not made yet")
	fail := func(sink int) {
		f.do(engineWriter, engine.ClaimDelivery{Sink: sink, Engine: me})
		f.do(engineWriter, engine.RecordDelivery{Sink: sink, Outcome: engine.SinkOutcome{Error: "refused"}, Backoff: time.Second})
	}
	fail(0)
	f.now = f.now.Add(time.Second)
	fail(0)
	refusedRedeliver[*engine.StateError](t, f, engine.Redeliver{}, "id", "push 0 is giving up")
	f.do(engineWriter, engine.GiveUpDelivery{Sink: 0})
	f.do(engineWriter, engine.ClaimDelivery{Sink: 1, Engine: me})
	one := 1
	refusedRedeliver[*engine.StateError](t, f, engine.Redeliver{Sink: &one}, "sink", "push 1 is in flight")
	f.do(engineWriter, engine.RecordDelivery{Sink: 1, Outcome: engine.SinkOutcome{OK: true}})
	if f.state.Delivery != engine.DeliveryFailed {
		t.Fatalf("before the redelivery: delivery %q", f.state.Delivery)
	}

	if got := redelivered(t, f, engine.Redeliver{}); !reflect.DeepEqual(got, []int{0}) {
		t.Fatalf("a redelivery names sinks %v, want the one that gave up", got)
	}
	k := f.state.Deliveries[0]
	if !k.Redelivering || k.Failed || k.Redeliveries != 1 || k.EarlierAttempts != 2 || k.FirstAttemptAt != nil || f.state.Delivery != engine.DeliveryPending {
		t.Fatalf("after the redelivery: sink %+v, delivery %q", k, f.state.Delivery)
	}
	refusedRedeliver[*engine.StateError](t, f, engine.Redeliver{}, "id", "push 0 is being sent again")
	// max_attempts 2 again, from the redelivery: attempts 3 and 4.
	fail(0)
	if k := f.state.Deliveries[0]; k.RetryAt == nil || !k.FirstAttemptAt.Equal(f.now.Add(-time.Second)) {
		t.Fatalf("the redelivery's first failed attempt: %+v", k)
	}
	f.now = f.now.Add(time.Second)
	fail(0)
	f.do(engineWriter, engine.GiveUpDelivery{Sink: 0})
	if k := f.state.Deliveries[0]; !k.Failed || k.Redelivering || k.Attempts != 4 {
		t.Fatalf("the redelivery gave up: %+v", k)
	}

	if got := redelivered(t, f, engine.Redeliver{Sink: &one}); !reflect.DeepEqual(got, []int{1}) {
		t.Fatalf("a redelivery of sink 1 names sinks %v", got)
	}
	f.do(engineWriter, engine.ClaimDelivery{Sink: 1, Engine: me})
	f.do(engineWriter, engine.RecordDelivery{Sink: 1, Outcome: engine.SinkOutcome{OK: true}})
	if k := f.state.Deliveries[1]; !k.Delivered || k.Redelivering || k.Attempts != 2 || k.Redeliveries != 1 {
		t.Fatalf("sink 1 delivered again: %+v", k)
	}
	two, minus := 2, -1
	refusedRedeliver[*engine.FieldError](t, f, engine.Redeliver{Sink: &two}, "sink", "2: task task-1 has push sinks 0 to 1")
	refusedRedeliver[*engine.FieldError](t, f, engine.Redeliver{Sink: &minus}, "sink", "-1: task")

	g := fired(t, "task-2", `{"command":"true","deliver":[{"type":"webhook","url":"https://example.com/a"}]}`)
	g.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	g.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true}})
	if got := redelivered(t, g, engine.Redeliver{}); !reflect.DeepEqual(got, []int{0}) {
		t.Fatalf("with none that gave up, a redelivery names sinks %v, want all", got)
	}
	// A wait that consumes the wake-up meanwhile: the push sent again is not made.
	g.do(engineWriter, engine.Consume{})
	if k := g.state.Deliveries[0]; !k.Skipped || k.Redelivering || g.state.Delivery != engine.DeliveryDelivered {
		t.Fatalf("a redelivery the wake-up's consumption overtook: %+v, delivery %q", k, g.state.Delivery)
	}

	for _, h := range []*fold{f, g} {
		if again, _ := engine.Replay(h.history); !reflect.DeepEqual(again, h.state) {
			t.Fatalf("replay differs from the live state:\n%+v\n%+v", again.Deliveries, h.state.Deliveries)
		}
	}
}

// A redelivered push is retried for its sink's whole retry_for again, counted
// from its first attempt after the redelivery.
func TestARedeliveredPushHasAWindowOfItsOwn(t *testing.T) {
	t.Parallel()
	f := fired(t, taskID, `{"command":"true","deliver":[{"type":"webhook","url":"https://example.com/a","retry_for":"1h"}]}`)
	first := failUntilGivenUp(t, f, engine.MaxRetryWait)
	f.do(engineWriter, engine.GiveUpDelivery{Sink: 0})
	f.now = f.now.Add(48 * time.Hour)
	redelivered(t, f, engine.Redeliver{})
	again := failUntilGivenUp(t, f, engine.MaxRetryWait)
	k := f.state.Deliveries[0]
	if len(again) != len(first) || !k.FirstAttemptAt.Equal(again[0]) || !again[len(again)-1].Equal(again[0].Add(time.Hour)) {
		t.Fatalf("the redelivery made %d attempts from %s to %s, the first push %d", len(again), again[0], again[len(again)-1], len(first))
	}
}

// What has no push to make again is refused, naming the task's id, and says why.
func TestARedeliveryOfATaskWithNoDonePushIsRefused(t *testing.T) {
	t.Parallel()
	const hook = `{"command":"true","deliver":[{"type":"webhook","url":"https://example.com/a"}]}`
	armed := newFold(t, taskID, mustSpec(t, hook))
	armed.do(engineWriter, engine.Arm{Spec: armed.spec})
	cancelled := newFold(t, taskID, mustSpec(t, hook))
	cancelled.do(engineWriter, engine.Arm{Spec: cancelled.spec})
	cancelled.do(engineWriter, engine.Cancel{Reason: "no"})
	consumed := fired(t, taskID, hook)
	consumed.do(engineWriter, engine.Consume{})
	for _, tc := range []struct {
		name string
		f    *fold
		says string
	}{
		{"no push sink", build(t, engine.PhaseFired), "has no push sink (deliver)"},
		{"not fired", armed, "is armed: its pushes are made once it fires"},
		{"running", build(t, engine.PhaseRunning), "has no push sink"},
		{"cancelled", cancelled, "was cancelled"},
		{"consumed", consumed, "consumed by a wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refusedRedeliver[*engine.StateError](t, tc.f, engine.Redeliver{}, "id", tc.says)
		})
	}
	if _, err := engine.Decide(engine.State{ID: "none"}, engine.Redeliver{}, engine.Meta{Writer: engineWriter, Now: t0}); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("a task with no event: %v", err)
	}
}

// defer_idle gives a target one push at a time: a wake-up that a redelivery
// made due again, earlier than one whose push is in flight, waits for that
// push, as a later one would wait for it.
func TestARedeliveryUnderDeferIdleWaitsForAPushInFlight(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Hour)
	idle := events.TargetState{State: events.TargetIdle}
	first, second := plannedTask(t, "d1", "defer_idle"), plannedTask(t, "d2", "defer_idle")
	first.now, second.now = now, now
	first.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	first.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true}})
	second.do(engineWriter, engine.ClaimDelivery{Sink: 0, Engine: me})
	redelivered(t, first, engine.Redeliver{})

	p := engine.PlanTarget([]engine.State{first.state, second.state}, idle, me, now)
	if len(p.Start) != 0 || !reflect.DeepEqual(p.Held, []string{"d1"}) {
		t.Fatalf("a redelivery while a later push is in flight: start %+v, held %v; want d1 held", p.Start, p.Held)
	}
	second.do(engineWriter, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true}})
	p = engine.PlanTarget([]engine.State{first.state, second.state}, idle, me, now)
	if !reflect.DeepEqual(p.Start, []engine.Push{{TaskID: "d1", Sink: 0}}) {
		t.Fatalf("the later push delivered: start %+v, held %v; want d1 started", p.Start, p.Held)
	}
}

// A redelivered push waits the retry base after its first failure, as a new
// push does, not the wait its attempts before the redelivery had grown to: a
// real pusher (retry base 20ms) and a receiver that answers 503.
func TestARedeliveredPushBacksOffFromTheRetryBase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	fireInStore(t, b.store, "backoff", `{"command":"true","deliver":[{"type":"webhook","url":"`+srv.URL+`","max_attempts":6}]}`)
	startReplica(t, b.store, engine.Engine{Writer: "engine-a", Instance: "a"})
	ctx := context.Background()
	var s engine.State
	testkit.Eventually(t, 30*time.Second, "the push given up", func() bool {
		var err error
		s, err = engine.Load(ctx, b.store, "backoff")
		return err == nil && s.Deliveries[0].Failed
	})
	ev, err := engine.Decide(s, engine.Redeliver{}, engine.Meta{Writer: engineWriter, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Append(ctx, ev, s.Seq); err != nil {
		t.Fatal(err)
	}
	var result *events.DeliveryResult
	var at time.Time
	testkit.Eventually(t, 30*time.Second, "the redelivery's first attempt failed", func() bool {
		history, err := b.store.History(ctx, "backoff")
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range history {
			p, err := rec.Decode()
			if r, ok := p.(*events.DeliveryResult); err == nil && ok && r.Attempt == 7 {
				result, at = r, rec.Time
				return true
			}
		}
		return false
	})
	if result.RetryAt == nil || result.RetryAt.Sub(at) > 20*time.Millisecond {
		t.Fatalf("after the redelivery's first failure: retry at %v, %v after it; want at most the retry base, 20ms", result.RetryAt, result.RetryAt.Sub(at))
	}
}
