package projections_test

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/projections"
)

// pushed arms a task with one webhook sink, runs it, fires it and makes the
// push's first attempt, with outcome o.
func (w writer) pushed(command string, o engine.SinkOutcome) engine.State {
	w.t.Helper()
	s := w.run(w.armSpec(`{"command":"`+command+`","deliver":[{"type":"webhook","url":"http://127.0.0.1:1/hook","max_attempts":1}]}`), 0)
	s = w.do(s, engine.PersistCompletion{}, "engine")
	s = w.do(s, engine.Fire{InboxSeq: 1}, "engine")
	s = w.do(s, engine.ClaimDelivery{Sink: 0, Engine: engine.Engine{Writer: "engine", Instance: "i1"}}, "engine")
	return w.do(s, engine.RecordDelivery{Sink: 0, Outcome: o, Backoff: time.Minute}, "engine")
}

// A list selects tasks by the state of their pushes, a settled task (kept as its
// summary) as a whole one, live and after a replay.
func TestListSelectsByDelivery(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	live := projections.New(store, nil, engine.Base{})
	if err := live.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer live.Stop()
	w := writer{t: t, store: store}
	failed := w.pushed("echo failed", engine.SinkOutcome{Error: "connection refused"})
	failed = w.do(failed, engine.GiveUpDelivery{Sink: 0}, "engine")
	delivered := w.pushed("echo delivered", engine.SinkOutcome{OK: true, HTTPStatus: 200})
	giving := w.pushed("echo giving up", engine.SinkOutcome{Error: "connection refused"})
	plain := w.run(w.arm("echo plain"), 0)
	plain = w.do(plain, engine.PersistCompletion{}, "engine")
	plain = w.do(plain, engine.Fire{InboxSeq: 2}, "engine")
	if failed.Delivery != engine.DeliveryFailed || delivered.Delivery != engine.DeliveryDelivered ||
		giving.Delivery != engine.DeliveryPending || plain.Delivery != "" {
		t.Fatalf("delivery states %q %q %q %q", failed.Delivery, delivered.Delivery, giving.Delivery, plain.Delivery)
	}
	if err := live.WaitFor(ctx, plain.Seq); err != nil {
		t.Fatal(err)
	}
	replayed := projections.New(store, nil, engine.Base{})
	if err := replayed.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer replayed.Stop()
	for name, p := range map[string]*projections.Projector{"live": live, "replayed": replayed} {
		for state, want := range map[string]string{
			engine.DeliveryFailed: failed.ID, engine.DeliveryDelivered: delivered.ID, engine.DeliveryPending: giving.ID,
		} {
			listed, total := p.List(engine.ListQuery{Delivery: state})
			if total != 1 || len(listed) != 1 || listed[0].ID != want || listed[0].Delivery != state {
				t.Errorf("%s: list --delivery %s: %d tasks %+v, want %s", name, state, total, listed, want)
			}
		}
		if all, _ := p.List(engine.ListQuery{}); len(all) != 4 || !slices.ContainsFunc(all, func(s engine.State) bool { return s.ID == plain.ID }) {
			t.Errorf("%s: list: %d tasks", name, len(all))
		}
	}
	if err := (engine.ListQuery{Delivery: "lost"}).Check(); err == nil || err.(*engine.FieldError).Field != "delivery" {
		t.Fatalf("a delivery state that is none: %v", err)
	}
}

// A redelivery of a settled task's push (kept as its summary) makes it whole
// again, its push pending, with the projector's notice of it for the pusher; a
// projector that replays the stream builds the same.
func TestARedeliveryReopensASettledTask(t *testing.T) {
	t.Parallel()
	srv := eventstest.Run(t)
	ctx := context.Background()
	store, err := events.OpenStore(ctx, srv.JS, events.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	notified := make(chan engine.State, 16)
	live := projections.New(store, func(s engine.State, rec events.Record) {
		if rec.Type == events.TypeRedeliveryRequested {
			notified <- s
		}
	}, engine.Base{})
	if err := live.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer live.Stop()
	w := writer{t: t, store: store}
	failed := w.pushed("echo failed", engine.SinkOutcome{Error: "connection refused"})
	failed = w.do(failed, engine.GiveUpDelivery{Sink: 0}, "engine")
	if err := live.WaitFor(ctx, failed.Seq); err != nil {
		t.Fatal(err)
	}
	if settled, _ := live.List(engine.ListQuery{Delivery: engine.DeliveryFailed}); len(settled) != 1 {
		t.Fatalf("the task that gave up: %d listed", len(settled))
	}
	again := w.do(failed, engine.Redeliver{}, "engine")
	var s engine.State
	select {
	case s = <-notified:
	case <-time.After(30 * time.Second):
		t.Fatal("no notice of the redelivery in 30 s")
	}
	if k := s.Deliveries; len(k) != 1 || !k[0].Redelivering || k[0].Attempts != 1 || s.Delivery != engine.DeliveryPending || s.Seq != again.Seq {
		t.Fatalf("the notice of the redelivery: delivery %q, sinks %+v", s.Delivery, k)
	}
	replayed := projections.New(store, nil, engine.Base{})
	if err := replayed.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer replayed.Stop()
	for name, p := range map[string]*projections.Projector{"live": live, "replayed": replayed} {
		got, ok := p.Task(failed.ID)
		if !ok || !reflect.DeepEqual(got, again) {
			t.Errorf("%s: the task\n%+v\nwant\n%+v", name, got, again)
		}
		if listed, _ := p.List(engine.ListQuery{Delivery: engine.DeliveryPending}); len(listed) != 1 || listed[0].ID != failed.ID {
			t.Errorf("%s: list --delivery pending: %+v", name, listed)
		}
	}
}
