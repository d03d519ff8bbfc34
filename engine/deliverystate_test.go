package engine_test

import (
	"testing"

	"github.com/bgtask/bgtask/engine"
)

// A task's delivery state sums up its push sinks as they go: pending while one
// is not done, failed once all are and one gave up, delivered when all were made
// (or not made, the wake-up consumed); none without a push to make.
func TestTheDeliveryStateFollowsThePushes(t *testing.T) {
	t.Parallel()
	const twoSinks = `{"command":"true","deliver":[{"type":"webhook","url":"https://example.com/a","max_attempts":1},{"type":"webhook","url":"https://example.com/b"}]}`
	step := func(f *fold, want string, c engine.Command) {
		t.Helper()
		f.do(engineWriter, c)
		if f.state.Delivery != want {
			t.Fatalf("after %T: delivery %q, want %q (sinks %+v)", c, f.state.Delivery, want, f.state.Deliveries)
		}
	}
	f := fired(t, taskID, twoSinks)
	if f.state.Delivery != engine.DeliveryPending {
		t.Fatalf("fired: delivery %q", f.state.Delivery)
	}
	step(f, engine.DeliveryPending, engine.ClaimDelivery{Sink: 0, Engine: me})
	step(f, engine.DeliveryPending, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{Error: "refused"}})
	step(f, engine.DeliveryPending, engine.GiveUpDelivery{Sink: 0})
	step(f, engine.DeliveryPending, engine.ClaimDelivery{Sink: 1, Engine: me})
	step(f, engine.DeliveryFailed, engine.RecordDelivery{Sink: 1, Outcome: engine.SinkOutcome{OK: true}})

	g := fired(t, "task-2", twoSinks)
	step(g, engine.DeliveryPending, engine.ClaimDelivery{Sink: 0, Engine: me})
	step(g, engine.DeliveryPending, engine.RecordDelivery{Sink: 0, Outcome: engine.SinkOutcome{OK: true}})
	step(g, engine.DeliveryDelivered, engine.Consume{})

	if h := build(t, engine.PhaseFired); h.state.Delivery != "" {
		t.Fatalf("a task without push sinks: delivery %q", h.state.Delivery)
	}
}
