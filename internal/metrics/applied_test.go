package metrics_test

import (
	"testing"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/metrics"
)

func record(t *testing.T, writer string, p events.Payload) events.Record {
	t.Helper()
	ev, err := events.New("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", writer, 1, time.Now(), p)
	if err != nil {
		t.Fatal(err)
	}
	return events.Record{Seq: 1, Event: ev}
}

// A run the engine finds lost is a lease that expired; a value outside a label's
// set is counted as other, so that no label grows with what the stream holds;
// only ready workers offer their free slots.
func TestLabelsKeepToTheirSets(t *testing.T) {
	t.Parallel()
	workers := []engine.WorkerStatus{
		{WorkerInfo: events.WorkerInfo{ID: "a", State: events.WorkerReady, Running: 1, MaxTasks: 4}},
		{WorkerInfo: events.WorkerInfo{ID: "b", State: events.WorkerDraining, Running: 2, MaxTasks: 4}},
		{WorkerInfo: events.WorkerInfo{ID: "c", State: "sleepy", MaxTasks: 4}},
	}
	m := metrics.New(func() map[engine.Phase]int { return map[engine.Phase]int{engine.PhaseRunning: 3} },
		func() []engine.WorkerStatus { return workers })
	m.Applied(engine.State{Phase: engine.PhaseArmed}, record(t, "engine-1", &events.Lost{Worker: "w1", Action: engine.OnLostRespawn}))
	now := time.Now()
	m.Applied(engine.State{Phase: engine.PhaseFired, Status: "strange", EndedAt: &now, FiredAt: &now},
		record(t, "engine-1", &events.Fired{}))
	m.Applied(engine.State{Deliveries: []engine.SinkState{{Type: "carrier-pigeon"}}},
		record(t, "engine-1", &events.DeliveryResult{Sink: 0, OK: true}))
	want := map[string]float64{
		`bgtask_tasks_lost_total{action="respawn",reason="lease_expired"}`: 1,
		`bgtask_tasks_lost_total{action="respawn",reason="shim_died"}`:     0,
		`bgtask_tasks_fired_total{status="other"}`:                         1,
		`bgtask_delivery_attempts_total{result="ok",sink="other"}`:         1,
		"bgtask_wakeup_latency_seconds_count":                              1,
		`bgtask_tasks{state="running"}`:                                    3,
		`bgtask_tasks{state="armed"}`:                                      0,
		`bgtask_workers{state="ready"}`:                                    1,
		`bgtask_workers{state="draining"}`:                                 1,
		`bgtask_workers{state="other"}`:                                    1,
		"bgtask_slots_used":                                                3,
		"bgtask_slots_available":                                           3,
	}
	if diff := mismatch(scrape(t, m.Handler()), want); diff != "" {
		t.Fatal(diff)
	}
}
