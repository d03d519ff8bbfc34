package metrics_test

import (
	"testing"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/metrics"
)

// A push that gave up, and one redelivered, are counted by its sink's type, from 0.
func TestPushesGivenUpAreCountedBySink(t *testing.T) {
	t.Parallel()
	m := metrics.New(func() map[engine.Phase]int { return nil }, func() []engine.WorkerStatus { return nil })
	sinks := []engine.SinkState{{Type: engine.SinkExec}, {Type: engine.SinkWebhook, Failed: true}}
	m.Applied(engine.State{Deliveries: sinks}, record(t, "engine-1", &events.DeliveryFailed{Sink: 1, Attempts: 3, Reason: "503"}))
	m.Applied(engine.State{Deliveries: sinks}, record(t, "engine-1", &events.RedeliveryRequested{Sinks: []int{1}}))
	want := map[string]float64{
		`bgtask_deliveries_given_up_total{sink="webhook"}`: 1,
		`bgtask_deliveries_given_up_total{sink="exec"}`:    0,
		`bgtask_redeliveries_total{sink="webhook"}`:        1,
		`bgtask_redeliveries_total{sink="exec"}`:           0,
	}
	if diff := mismatch(scrape(t, m.Handler()), want); diff != "" {
		t.Fatal(diff)
	}
}
